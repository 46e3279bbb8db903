package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/simulator"
)

// guardConfig is a tenant's daily budget of amount dollars, streams
// admitted on 1% of their output, and the stream guard on with increments
// of inc tokens.
func guardConfig(amount string, inc int) string {
	return guardConfigCosts("  output_reserve: 1\n", amount, inc)
}

// guardConfigCosts is guardConfig with costs, the costs section's lines,
// in place of its output reserve of 1%.
func guardConfigCosts(costs, amount string, inc int) string {
	return fmt.Sprintf(`
costs:
%sstream_guard:
  enabled: true
  increment_tokens: %d
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 1000
    period: 1m
budgets:
  - name: acme-daily
    scope: tenant
    amount: %q
`, costs, inc, amount)
}

// streamed is what a client got from a stream.
type streamed struct {
	text string
	err  error // what the SDK returned at the end
}

// guardedRoute streams one answer of up to max tokens from a route through
// its official SDK.
type guardedRoute struct {
	name, path, model string
	kind              costmodel.Kind
	stream            func(ctx context.Context, s *stack, model string, max int64) streamed
}

var guardedRoutes = []guardedRoute{
	{"chat", "/v1/chat/completions", "gpt-4o-mini", costmodel.ChatCompletions, func(ctx context.Context, s *stack, model string, max int64) streamed {
		st := s.client("cg-test-acme").Chat.Completions.NewStreaming(ctx, chatParams("Tell me a long story.", max))
		defer st.Close()
		var out streamed
		for st.Next() {
			for _, c := range st.Current().Choices {
				out.text += c.Delta.Content
			}
		}
		out.err = st.Err()
		return out
	}},
	{"completions", "/v1/completions", "gpt-3.5-turbo-instruct", costmodel.Completions, func(ctx context.Context, s *stack, model string, max int64) streamed {
		st := s.client("cg-test-acme").Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(model),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(max),
		})
		defer st.Close()
		var out streamed
		for st.Next() {
			for _, c := range st.Current().Choices {
				out.text += c.Text
			}
		}
		out.err = st.Err()
		return out
	}},
	{"responses", "/v1/responses", "gpt-4o-mini", costmodel.Responses, func(ctx context.Context, s *stack, model string, max int64) streamed {
		st := s.client("cg-test-acme").Responses.NewStreaming(ctx, responses.ResponseNewParams{
			Model:           model,
			Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Explain streaming at length.")},
			MaxOutputTokens: openai.Int(max),
		})
		defer st.Close()
		var out streamed
		for st.Next() {
			if ev := st.Current(); ev.Type == "response.output_text.delta" {
				out.text += ev.Delta
			}
		}
		out.err = st.Err()
		return out
	}},
	{"messages", "/v1/messages", "claude-haiku-4-5", costmodel.AnthropicMessages, func(ctx context.Context, s *stack, model string, max int64) streamed {
		c := anthropic.NewClient(anthropicopt.WithBaseURL(s.url+"/"), anthropicopt.WithAPIKey("cg-test-acme"), anthropicopt.WithMaxRetries(0))
		st := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
			Model:     anthropic.Model(model),
			MaxTokens: max,
			Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Stream me a long answer."))},
		})
		defer st.Close()
		var out streamed
		var m anthropic.Message
		for st.Next() {
			if err := m.Accumulate(st.Current()); err != nil {
				out.err = err
				return out
			}
		}
		for _, b := range m.Content {
			out.text += b.Text
		}
		out.err = st.Err()
		return out
	}},
}

// stoppedByBudget checks that err is how the route's SDK reports a stream
// the guard stopped at budget acme-daily: a clean error naming it, never
// a parse failure.
func stoppedByBudget(t *testing.T, kind costmodel.Kind, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("the stream ended without an error; want it stopped at the budget")
	}
	if kind == costmodel.AnthropicMessages {
		var ae *anthropic.Error
		if !errors.As(err, &ae) {
			t.Fatalf("want an *anthropic.Error, got %T: %v", err, err)
		}
	} else {
		var se *ssestream.StreamError
		if !errors.As(err, &se) {
			t.Fatalf("want an *ssestream.StreamError, got %T: %v", err, err)
		}
	}
	if msg := err.Error(); !strings.Contains(msg, "budget_exceeded") || !strings.Contains(msg, "acme-daily") {
		t.Fatalf("the error does not say why: %v", err)
	}
}

// TestStreamGuardStopsAtBudget: with streams admitted on 1% of their
// output, a stream of 1,500 tokens against a budget that holds about 150
// is stopped, through each route's official SDK, on each store: the SDK
// returns a clean error that names the budget, the ledger bills the output
// the client got, and the budget is exceeded by less than one increment.
func TestStreamGuardStopsAtBudget(t *testing.T) {
	const inc = 16
	for _, store := range []string{"memory", "redis"} {
		for _, rt := range guardedRoutes {
			t.Run(store+"/"+rt.name, func(t *testing.T) {
				o := stackOptions{policies: allowAll, extra: guardConfig("0.0001", inc), sim: simulator.Config{ReplyTokens: 5000}}
				if store == "redis" {
					o.redisURL = redistest.New(t).URL
				}
				s := newStackWith(t, o)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				got := rt.stream(ctx, s, rt.model, 1500)
				stoppedByBudget(t, rt.kind, got.err)
				est := estimator(t)
				shown := est.CountText(rt.model, got.text)
				budget := costmodel.NanoUSD(100_000)
				perToken := est.Cost(rt.model, costmodel.Usage{OutputTokens: 1000}) / 1000
				if most := int64(budget / perToken); shown < most/4 || shown > most+inc {
					t.Errorf("the client got %d tokens; want the stream stopped near the budget's %d", shown, most)
				}

				e := s.settled(t, 1)[0]
				if e.Status != ledger.StatusSettled {
					t.Errorf("entry status %s, want settled", e.Status)
				}
				// Billed: the output the client got (the Anthropic count is
				// an approximation counted in pieces: within a token per piece).
				if d := e.Actual.OutputTokens - shown; d < 0 || d > 2 {
					t.Errorf("billed %d output tokens; the client got %d", e.Actual.OutputTokens, shown)
				}
				if want := est.Cost(e.Model, e.Actual); e.ActualCost != want {
					t.Errorf("billed %v, want %v for %+v", e.ActualCost, want, e.Actual)
				}
				bound := est.Cost(rt.model, costmodel.Usage{OutputTokens: inc})
				if e.ActualCost > budget+bound {
					t.Errorf("spent %v of a %v budget: over by more than one increment (%v)", e.ActualCost, budget, bound)
				}
				t.Logf("client got %d tokens; billed %v of a %v budget", shown, e.ActualCost, budget)
			})
		}
	}
}

// TestStreamGuardConcurrentOverspend: 20 concurrent streams of one tenant,
// each admitted on 1% of its output, against one daily budget. Together
// they spend no more than the budget plus one increment per stream, and
// every stream ends cleanly: served whole, refused with 402, or stopped
// with the budget's error.
func TestStreamGuardConcurrentOverspend(t *testing.T) {
	const (
		inc     = 32
		streams = 20
		budget  = costmodel.NanoUSD(1_000_000) // $0.001: about 1,600 output tokens of gpt-4o-mini
	)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			o := stackOptions{policies: allowAll, extra: guardConfig("0.001", inc), sim: simulator.Config{ReplyTokens: 5000}}
			if store == "redis" {
				o.redisURL = redistest.New(t).URL
			}
			s := newStackWith(t, o)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, streams)
			for i := range streams {
				wg.Go(func() { errs[i] = guardedRoutes[0].stream(ctx, s, "gpt-4o-mini", 400).err })
			}
			wg.Wait()
			stopped, refused := 0, 0
			for i, err := range errs {
				var apiErr *openai.Error
				switch {
				case err == nil:
				case errors.As(err, &apiErr) && apiErr.StatusCode == 402:
					refused++
				default:
					if !strings.Contains(err.Error(), "budget_exceeded") {
						t.Errorf("stream %d: %v", i, err)
					}
					stopped++
				}
			}
			if stopped == 0 {
				t.Error("no stream was stopped at the budget")
			}
			es := s.settled(t, streams-refused)
			var spent costmodel.NanoUSD
			for _, e := range es {
				spent += e.ActualCost
			}
			bound := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{OutputTokens: inc})
			over := spent - budget
			if over > streams*bound {
				t.Errorf("spent %v of a %v budget: over by %v, more than one increment (%v) per stream", spent, budget, over, bound)
			}
			t.Logf("%d streams: %d stopped, %d refused at admission; spent %v of %v: over by %v (bound %v)",
				streams, stopped, refused, spent, budget, over, streams*bound)
		})
	}
}

// endless is an upstream that streams chat chunks of one word, in pieces
// of frag bytes with CRLF line ends, until its client goes away.
type endless struct {
	frag   int
	closed chan struct{} // closed when the client went away
	once   sync.Once
}

func (u *endless) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	defer u.once.Do(func() { close(u.closed) })
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	ev := []byte(`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" word"}}]}` + "\r\n\r\n")
	for i := 0; i < 1_000_000 && r.Context().Err() == nil; i++ {
		for b := ev; len(b) > 0; {
			n := min(u.frag, len(b))
			if _, err := w.Write(b[:n]); err != nil {
				return
			}
			f.Flush()
			b = b[n:]
		}
	}
}

// TestStreamGuardAttacks: an upstream that never ends, written in pieces
// that cut events anywhere; a client that reads on, and one that hangs up
// at once so that costgate drains the stream alone. Either way the stream
// stops at the budget, the upstream's connection is closed, and the ledger
// bills the output counted.
func TestStreamGuardAttacks(t *testing.T) {
	for _, c := range []struct {
		name   string
		frag   int
		hangUp bool
		usage  bool // the client asks for the usage report: the stream passes in place, not filtered
	}{
		{"events cut in pieces", 7, false, false},
		{"whole events", 1 << 10, false, false},
		{"client hangs up", 64, true, false},
		{"in place, events cut in pieces", 7, false, true},
		{"in place, whole events", 1 << 10, false, true},
		{"in place, client hangs up", 64, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &endless{frag: c.frag, closed: make(chan struct{})}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: guardConfig("0.0001", 16), upstream: up})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			opts := ""
			if c.usage {
				opts = `"stream_options":{"include_usage":true},`
			}
			resp := s.post(t, ctx, "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":10000,"stream":true,`+opts+`"messages":[{"role":"user","content":"go on"}]}`)
			var body []byte
			if c.hangUp {
				resp.Body.Close()
			} else {
				var err error
				body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) || !bytes.Contains(body, []byte(`"finish_reason":"length"`)) ||
					!bytes.Contains(body, []byte(`"error":{"type":"budget_exceeded","code":"acme-daily"`)) {
					t.Errorf("the stream does not end with the budget's error: ...%s", body[max(len(body)-400, 0):])
				}
			}
			select {
			case <-up.closed:
			case <-ctx.Done():
				t.Fatal("the upstream's connection was never closed")
			}
			e := s.settled(t, 1)[0]
			if e.ActualCost > 100_000+estimator(t).Cost("gpt-4o-mini", costmodel.Usage{OutputTokens: 16}) || e.Actual.OutputTokens < 100 {
				t.Errorf("billed %v for %d output tokens against a $0.0001 budget", e.ActualCost, e.Actual.OutputTokens)
			}
			if !c.hangUp {
				words := int64(bytes.Count(body, []byte(`"content":" word"`)))
				if e.Actual.OutputTokens != words {
					t.Errorf("billed %d output tokens; the client got %d", e.Actual.OutputTokens, words)
				}
			}
		})
	}
}
