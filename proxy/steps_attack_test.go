package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/option"
)

// stepsUpstream is an Anthropic upstream on loopback that answers each
// request with usage, as the request's model says: a request for Opus
// reports opusInput input tokens; any other reports the steps of
// iterations (empty: none).
func stepsUpstream(served *atomic.Int64, opusInput int, iterations string) *stubUpstream {
	return &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(body), `"model":"claude-opus-4-6"`) && !strings.Contains(string(body), "advisor") && !strings.Contains(string(body), "fallbacks") {
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-4-6","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":%d,"output_tokens":1}}`, opusInput)
			return
		}
		io.WriteString(w, `{"id":"msg_2","type":"message","role":"assistant","model":"claude-haiku-4-5-20251001","content":[{"type":"text","text":"Done."}],"stop_reason":"end_turn","usage":{"input_tokens":10000,"output_tokens":2000`+iterations+`}}`)
	}}
}

// stepsClient is the official Anthropic SDK as acme.
func stepsClient(s *stack) anthropic.Client {
	return anthropic.NewClient(anthropicopt.WithBaseURL(s.url+"/"), anthropicopt.WithAPIKey("cg-test-acme"), anthropicopt.WithMaxRetries(0))
}

// stepsParams is a Haiku request with the advisor tool naming model, or
// (fallback) with model as its fallback.
func stepsParams(model string, fallback bool) anthropic.BetaMessageNewParams {
	p := anthropic.BetaMessageNewParams{
		Model:     anthropic.Model("claude-haiku-4-5"),
		MaxTokens: 1000,
		Messages:  []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("Plan the migration."))},
		Betas:     []anthropic.AnthropicBeta{anthropic.AnthropicBetaAdvisorTool2026_03_01},
	}
	if fallback {
		p.Fallbacks = anthropic.BetaFallbacksParamUnion{OfBetaFallbackArray: []anthropic.BetaFallbackParam{{Model: anthropic.Model(model)}}}
	} else {
		p.Tools = []anthropic.BetaToolUnionParam{anthropic.BetaToolUnionParamOfAdvisorTool20260301(anthropic.Model(model))}
	}
	return p
}

// TestLimitAtkAdvisorRunsAnotherModel: acme's limit keyed by model holds
// its use of each model; its claude-opus-4-6 allowance is spent. Through
// the official Anthropic SDK, acme asks claude-haiku-4-5 with the advisor
// tool naming Opus, or Opus as its fallback: the limit was debited on
// Haiku's key alone, and the upstream ran Opus past its spent allowance.
// Both are refused 429 naming the limit, and the upstream is not called.
func TestLimitAtkAdvisorRunsAnotherModel(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		var served atomic.Int64
		s := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, upstream: stepsUpstream(&served, 100000, ""), extra: roomyLimits + `
  - name: per-model-tokens
    dimensions: [tenant, model]
    unit: tokens
    rate: 100000
    period: 1h
    algorithm: fixed_window
`})
		c := stepsClient(s)
		ctx := context.Background()
		// Opus's allowance, spent by a request of its own.
		if _, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-opus-4-6", MaxTokens: 10,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hi"))}}); err != nil {
			t.Fatal(err)
		}
		if err := s.srv.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
		for _, fallback := range []bool{false, true} {
			name := map[bool]string{false: "an opus advisor", true: "an opus fallback"}[fallback]
			t.Run(name, func(t *testing.T) {
				before := served.Load()
				_, err := c.Beta.Messages.New(ctx, stepsParams("claude-opus-4-6", fallback))
				var apiErr *anthropic.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || !strings.Contains(apiErr.RawJSON(), "per-model-tokens") {
					t.Errorf("answered %v, want 429 per-model-tokens", err)
				}
				if served.Load() != before {
					t.Errorf("the upstream ran Opus past its spent allowance")
				}
			})
		}
	})
}

// TestLimitAtkAdvisorTokensSettledOnItsModel: a Haiku request whose Opus
// advisor read 40,000 tokens and wrote 1,800 (usage.iterations), sent
// through the official Anthropic SDK, left acme's Opus allowance of a
// limit keyed by model untouched. Opus's key is charged its 41,800.
func TestLimitAtkAdvisorTokensSettledOnItsModel(t *testing.T) {
	const iterations = `,"iterations":[` +
		`{"type":"message","model":"claude-haiku-4-5-20251001","input_tokens":6000,"output_tokens":300},` +
		`{"type":"advisor_message","model":"claude-opus-4-6","input_tokens":40000,"output_tokens":1800},` +
		`{"type":"message","model":"claude-haiku-4-5-20251001","input_tokens":4000,"output_tokens":1700}]`
	onEachStore(t, func(t *testing.T, url string) {
		var served atomic.Int64
		s := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, upstream: stepsUpstream(&served, 0, iterations), extra: roomyLimits + `
  - name: per-model-tokens
    dimensions: [tenant, model]
    unit: tokens
    rate: 1000000
    period: 1h
    algorithm: fixed_window
`})
		ctx := context.Background()
		c := stepsClient(s)
		if _, err := c.Beta.Messages.New(ctx, stepsParams("claude-opus-4-6", false)); err != nil {
			t.Fatal(err)
		}
		if err := s.srv.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
		infos, err := s.srv.Gate().Limits(ctx, "{acme}:tenant=acme:model=claude-opus-4-6")
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if in.Name == "per-model-tokens" {
				if got := in.State.Capacity - in.State.Remaining; got != 41_800 {
					t.Errorf("Opus's key was charged %d tokens, want the 41,800 its advisor step ran", got)
				}
			}
		}
	})
}
