package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/simulator"
)

// allowAll is a policy set that allows every request.
var allowAll = fstest.MapFS{"allow.rego": {Data: []byte("package costgate.policies.allow\n\ndecision := {\"outcome\": \"allow\"}\n")}}

const roomyLimits = `
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 1000
    period: 1m
`

// entries returns the tenant acme's ledger entries, flushed.
func (s *stack) entries(t *testing.T) []ledger.Entry {
	t.Helper()
	ctx := context.Background()
	if err := s.srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	l := s.srv.Ledger()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := l.Entries(ctx, ledger.Query{Tenant: "acme", From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return page.Entries
}

func estimator(t *testing.T) *costmodel.Estimator {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return est
}

func chatParams(text string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "gpt-4o-mini",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)},
		MaxTokens: openai.Int(maxTokens),
	}
}

// TestStreamingHidesTheUsageItAskedFor streams through the OpenAI SDK
// without asking for usage: costgate asks the upstream for it, settles from
// it, and the client never sees it.
func TestStreamingHidesTheUsageItAskedFor(t *testing.T) {
	s := newStack(t, "", roomyLimits)
	client := s.client("cg-test-acme")
	params := chatParams("Stream me a short answer, please.", 20)
	stream := client.Chat.Completions.NewStreaming(context.Background(), params)
	var text strings.Builder
	chunks := 0
	for stream.Next() {
		c := stream.Current()
		chunks++
		if len(c.Choices) == 0 {
			t.Fatalf("chunk %d has no choices: the usage report leaked to the client: %s", chunks, c.RawJSON())
		}
		if strings.Contains(c.RawJSON(), `"usage"`) {
			t.Fatalf("chunk %d carries a usage member the client did not ask for: %s", chunks, c.RawJSON())
		}
		text.WriteString(c.Choices[0].Delta.Content)
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 5 {
		t.Fatalf("got %d chunks, want one per token", chunks)
	}

	est := estimator(t)
	want := est.CountText("gpt-4o-mini", text.String())
	es := s.entries(t)
	if len(es) != 1 {
		t.Fatalf("ledger has %d entries, want 1", len(es))
	}
	if es[0].Actual.OutputTokens != want || es[0].Actual.InputTokens == 0 {
		t.Errorf("ledger charged in=%d out=%d; the stream carried %d output tokens", es[0].Actual.InputTokens, es[0].Actual.OutputTokens, want)
	}

	// A client that asks for the usage report gets it.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream = client.Chat.Completions.NewStreaming(context.Background(), params)
	var usage openai.CompletionUsage
	for stream.Next() {
		if c := stream.Current(); c.Usage.TotalTokens > 0 {
			usage = c.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if usage.CompletionTokens != want {
		t.Errorf("the client's own usage report says %d completion tokens, want %d", usage.CompletionTokens, want)
	}
}

// TestStreamCutByClient: a client that leaves a stream early is charged
// what the upstream produced and reported, since the upstream bills it all.
func TestStreamCutByClient(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: roomyLimits, sim: simulator.Config{TokenInterval: 5 * time.Millisecond, ReplyTokens: 200}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := s.client("cg-test-acme").Chat.Completions.NewStreaming(ctx, chatParams("Tell me a long story.", 200))
	got := 0
	for stream.Next() {
		if got++; got == 5 {
			cancel()
			break
		}
	}
	stream.Close()
	es := s.settled(t, 1)
	if out := es[0].Actual.OutputTokens; out != 200 {
		t.Errorf("charged %d output tokens for a stream of 200 the client cut after 5", out)
	}
	if es[0].Actual.InputTokens != es[0].Estimated.InputTokens || es[0].Actual.InputTokens == 0 {
		t.Errorf("a cut stream charged %d input tokens, want the prompt's %d", es[0].Actual.InputTokens, es[0].Estimated.InputTokens)
	}
}

// TestAnthropicSDK goes through /v1/messages with the official Anthropic
// SDK, plain and streaming.
func TestAnthropicSDK(t *testing.T) {
	s := newStack(t, "", roomyLimits)
	client := anthropic.NewClient(
		anthropicopt.WithBaseURL(s.url+"/"),
		anthropicopt.WithAPIKey("cg-test-acme"),
		anthropicopt.WithMaxRetries(0),
	)
	params := anthropic.MessageNewParams{
		Model:     "claude-3-5-haiku",
		MaxTokens: 24,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello from the Anthropic SDK"))},
	}
	msg, err := client.Messages.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
		t.Fatalf("no usage: %+v", msg.Usage)
	}

	stream := client.Messages.NewStreaming(context.Background(), params)
	var streamed anthropic.Message
	for stream.Next() {
		if err := streamed.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}

	es := s.entries(t)
	if len(es) != 2 {
		t.Fatalf("ledger has %d entries, want 2", len(es))
	}
	for i, u := range []anthropic.Usage{msg.Usage, streamed.Usage} {
		if es[i].Actual.InputTokens != u.InputTokens || es[i].Actual.OutputTokens != u.OutputTokens {
			t.Errorf("entry %d charged in=%d out=%d, the upstream reported in=%d out=%d",
				i, es[i].Actual.InputTokens, es[i].Actual.OutputTokens, u.InputTokens, u.OutputTokens)
		}
		if es[i].Route != "/v1/messages" || es[i].Upstream != "anthropic" {
			t.Errorf("entry %d: route %q upstream %q", i, es[i].Route, es[i].Upstream)
		}
	}

	// Errors on /v1/messages are Anthropic-shaped.
	bad := anthropic.NewClient(anthropicopt.WithBaseURL(s.url+"/"), anthropicopt.WithAPIKey("wrong"), anthropicopt.WithMaxRetries(0))
	_, err = bad.Messages.New(context.Background(), params)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("want a 401 from a wrong key, got %v", err)
	}
	if !strings.Contains(apiErr.RawJSON(), `"type":"error"`) {
		t.Errorf("401 body is not Anthropic-shaped: %s", apiErr.RawJSON())
	}
}

// TestBudgetExhaustedMidConversation: a small budget lets a few requests
// through, then answers 402 until the period resets: the day's end, or the
// calendar month's.
func TestBudgetExhaustedMidConversation(t *testing.T) {
	for _, period := range []string{"day", "month"} {
		t.Run(period, func(t *testing.T) {
			s := newStack(t, "", roomyLimits+`
budgets:
  - name: acme-budget
    scope: tenant
    period: `+period+`
    amount: "0.00005"
`)
			client := s.client("cg-test-acme")
			served := 0
			var denied *openai.Error
			for i := range 50 {
				_, err := client.Chat.Completions.New(context.Background(), chatParams("Another turn of our conversation, number "+strconv.Itoa(i), 16))
				if err != nil {
					if !errors.As(err, &denied) {
						t.Fatal(err)
					}
					break
				}
				served++
			}
			if served == 0 || denied == nil {
				t.Fatalf("served %d then %v; want some requests, then a 402", served, denied)
			}
			if denied.StatusCode != http.StatusPaymentRequired || denied.Type != "budget_exceeded" {
				t.Fatalf("want 402 budget_exceeded, got %d %s", denied.StatusCode, denied.Type)
			}
			now := time.Now().UTC()
			start := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
			end := start.AddDate(0, 0, 1)
			if period == "month" {
				start = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
				end = start.AddDate(0, 1, 0)
			}
			want := int(time.Until(end).Seconds())
			h := denied.Response.Header
			if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < want-10 || ra > want+10 {
				t.Errorf("Retry-After = %q, want about %d s, until %s", h.Get("Retry-After"), want, end)
			}
			if got, w := h.Get("RateLimit-Policy"), fmt.Sprintf(`"acme-budget";q=50000;w=%d;`, int(end.Sub(start).Seconds())); !strings.HasPrefix(got, w) {
				t.Errorf("RateLimit-Policy = %q, want it to start with %q", got, w)
			}
			var spent costmodel.NanoUSD
			for _, e := range s.entries(t) {
				spent += e.ActualCost
			}
			if len(s.entries(t)) != served || spent > 50_000 {
				t.Errorf("ledger: %d entries for %d served, spend %v over a budget of $0.00005", len(s.entries(t)), served, spent)
			}
		})
	}
}

// TestFrictionAndShadow: a soft policy caps max_tokens and says so; a
// shadow policy that would block is not enforced; a shadow limit is not
// enforced either.
func TestFrictionAndShadow(t *testing.T) {
	pols := fstest.MapFS{
		"friction.rego": {Data: []byte(`package costgate.policies.friction

decision := {"outcome": "soft", "reason": "pace", "friction": {"cap_max_tokens": 5, "warning": "slow down"}}
`)},
		"strict.rego": {Data: []byte(`# METADATA
# custom:
#   shadow: true
package costgate.policies.strict

decision := {"outcome": "hard", "status": 429, "reason": "would block everything"}
`)},
	}
	s := newStackWith(t, stackOptions{policies: pols, extra: roomyLimits + `
  - name: shadow-one-a-minute
    dimensions: [tenant]
    unit: requests
    rate: 1
    period: 1m
    mode: shadow
`})
	client := s.client("cg-test-acme")
	for i := range 3 {
		var resp *http.Response
		c, err := client.Chat.Completions.New(context.Background(), chatParams("Say something long", 40), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatalf("request %d: %v (a shadow policy or limit was enforced?)", i, err)
		}
		if c.Usage.CompletionTokens > 5 {
			t.Errorf("request %d: %d completion tokens despite the cap of 5", i, c.Usage.CompletionTokens)
		}
		if got := resp.Header.Get("Costgate-Friction"); got != `cap_max_tokens; policy="friction", warn; policy="friction"` {
			t.Errorf("Costgate-Friction = %q", got)
		}
	}
}

// TestBadInput: clear errors, and charging follows what the upstream
// reported.
func TestBadInput(t *testing.T) {
	// A policy that allows all: the quickstart's would refuse the unknown
	// model below.
	s := newStackWith(t, stackOptions{extra: roomyLimits + "max_body_bytes: 2048\n", policies: allowAll})
	post := func(body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", s.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer cg-test-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	cases := []struct {
		name, body string
		status     int
		contains   string
	}{
		{"malformed JSON", `{"model": "gpt-4o-mini", "messages": [`, 400, "invalid JSON"},
		{"wrong type", `{"model": "gpt-4o-mini", "messages": "hello"}`, 400, "messages"},
		{"NUL in the model", `{"model": "gpt-4o-mini\u0000x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}`, 400, "not valid UTF-8 text"},
		{"oversized body", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`, 413, "larger than the limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(c.body)
			if resp.StatusCode != c.status || !strings.Contains(body, c.contains) {
				t.Errorf("got %d %s, want %d containing %q", resp.StatusCode, body, c.status, c.contains)
			}
			if resp.Header.Get("X-Request-Id") == "" {
				t.Error("no X-Request-Id")
			}
		})
	}
	if n := len(s.entries(t)); n != 0 {
		t.Errorf("rejected requests left %d ledger entries", n)
	}

	t.Run("unknown model is priced at the default", func(t *testing.T) {
		resp, body := post(`{"model":"acme-llm-7","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		es := s.entries(t)
		if len(es) != 1 || es[0].ActualCost <= 0 {
			t.Fatalf("an unknown model rode free: %+v", es)
		}
	})
}

// TestUpstreamFailures: an upstream 500 passes through unchanged and is
// not charged; an upstream that does not answer in time is a 504, charged
// as an answer whose usage cannot be read (the upstream bills the run).
func TestUpstreamFailures(t *testing.T) {
	t.Run("500 passes through, not charged", func(t *testing.T) {
		s := newStackWith(t, stackOptions{extra: roomyLimits, sim: simulator.Config{ErrorRate: 1}})
		_, err := s.client("cg-test-acme").Chat.Completions.New(context.Background(), chatParams("hi", 8))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 500 || !strings.Contains(apiErr.Message, "simulated upstream failure") {
			t.Fatalf("want the upstream's 500 unchanged, got %v", err)
		}
		es := s.entries(t)
		if len(es) != 1 || es[0].Status != ledger.StatusFailed || es[0].ActualCost != 0 {
			t.Fatalf("want one failed entry charged nothing, got %+v", es)
		}
	})
	t.Run("timeout is 504", func(t *testing.T) {
		s := newStackWith(t, stackOptions{extra: roomyLimits, sim: simulator.Config{Latency: 3 * time.Second}, upstreamTimeout: 200 * time.Millisecond})
		start := time.Now()
		_, err := s.client("cg-test-acme").Chat.Completions.New(context.Background(), chatParams("hi", 8))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("want 504, got %v", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the 504 took %v", d)
		}
		es := s.entries(t)
		if len(es) != 1 || es[0].Status != ledger.StatusFailed || es[0].ActualCost < es[0].EstimatedCost {
			t.Fatalf("want one failed entry charged at least its estimate (the upstream bills the run), got %+v", es)
		}
	})
}

// TestPolicyRefusalRateLimit: a policy's 429 states its Retry-After, and
// the RateLimit field's t names the same time.
func TestPolicyRefusalRateLimit(t *testing.T) {
	pols := fstest.MapFS{"stop.rego": {Data: []byte(`package costgate.policies.stop

decision := {"outcome": "hard", "status": 429, "reason": "stop"}
`)}}
	s := newStackWith(t, stackOptions{policies: pols, extra: roomyLimits})
	var resp *http.Response
	_, err := s.client("cg-test-acme").Chat.Completions.New(context.Background(), chatParams("Hi", 5), option.WithResponseInto(&resp))
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("want a 429, got %v", err)
	}
	ra := resp.Header.Get("Retry-After")
	if rl := resp.Header.Get("RateLimit"); ra == "" || !strings.HasSuffix(rl, ";t="+ra) {
		t.Errorf("Retry-After %q, RateLimit %q: t differs", ra, rl)
	}
}

// TestBrokenPolicyLeavesTheOthers: a request crafted to break one policy
// (two of its rules give decision different values: an evaluation
// conflict) does not switch off the others: b still refuses it with 402.
// A broken policy allows, loudly, but only for itself.
func TestBrokenPolicyLeavesTheOthers(t *testing.T) {
	pols := fstest.MapFS{
		"a.rego": {Data: []byte(`package costgate.policies.a

decision := {"outcome": "allow"} if input.request.model == "gpt-4o-mini"

decision := {"outcome": "soft", "friction": {"delay_ms": 1}} if input.estimate.output_tokens > 100
`)},
		"b.rego": {Data: []byte(`package costgate.policies.b

decision := {"outcome": "hard", "status": 402, "reason": "too long"} if input.estimate.output_tokens > 100
`)},
	}
	s := newStackWith(t, stackOptions{policies: pols, extra: roomyLimits})
	c := s.client("cg-test-acme")
	if _, err := c.Chat.Completions.New(context.Background(), chatParams("Hi", 5)); err != nil {
		t.Fatalf("a short request: %v", err)
	}
	var resp *http.Response
	_, err := c.Chat.Completions.New(context.Background(), chatParams("Hi", 500), option.WithResponseInto(&resp))
	if err == nil || resp == nil || resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("a request that breaks policy a and that b refuses: %v; want 402", err)
	}
}
