package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/examples"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/simulator"
)

// stack is costgate in front of the simulator, both on loopback.
type stack struct {
	srv *proxy.Server
	url string // costgate's data plane
}

// newStack starts the simulator and costgate with the given limits YAML;
// redisURL empty means the in-memory store.
func newStack(t *testing.T, redisURL, limits string) *stack {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := httptest.NewServer(simulator.New(simulator.Config{Estimator: est}))
	t.Cleanup(sim.Close)

	yaml := fmt.Sprintf(`
admin_token: test-admin
data_dir: %q
store:
  redis: %q
upstreams:
  - name: openai
    kind: openai
    base_url: %s
    api_key: sk-upstream-secret
tenants:
  - name: acme
    plan: free
    keys:
      - id: acme-key
        key: cg-test-acme
        user: alice
%s`, t.TempDir(), redisURL, sim.URL, limits)
	cfg, err := proxy.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	cfg.WithPolicyFS(examples.QuickstartPolicies())
	srv, err := proxy.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &stack{srv: srv, url: ts.URL}
}

func (s *stack) client(key string) *openai.Client {
	c := openai.NewClient(
		option.WithBaseURL(s.url+"/v1/"),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
	)
	return &c
}

// TestEndToEnd drives costgate through the official OpenAI SDK, on each
// store: requests are served until the request limit is spent, then a 429
// with Retry-After arrives, and the ledger holds one entry per admitted
// request with the usage the simulator reported.
func TestEndToEnd(t *testing.T) {
	const limits = `
limits:
  - name: acme-requests
    dimensions: [tenant]
    algorithm: token_bucket
    unit: requests
    rate: 3
    period: 1m
  - name: acme-tokens
    dimensions: [tenant]
    unit: tokens
    rate: 100000
    period: 1m
`
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			redisURL := ""
			if store == "redis" {
				redisURL = redistest.New(t).URL
			}
			s := newStack(t, redisURL, limits)
			client := s.client("cg-test-acme")
			ctx := context.Background()

			type served struct{ prompt, completion int64 }
			var got []served
			var denied *openai.Error
			for i := range 10 {
				resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
					Model: "gpt-4o-mini",
					Messages: []openai.ChatCompletionMessageParamUnion{
						openai.SystemMessage("You answer briefly."),
						openai.UserMessage(fmt.Sprintf("Question number %d: what does a token cost?", i)),
					},
					MaxTokens: openai.Int(16),
				})
				if err != nil {
					if !errors.As(err, &denied) {
						t.Fatalf("request %d: %v", i, err)
					}
					break
				}
				if resp.Usage.PromptTokens == 0 || resp.Usage.CompletionTokens == 0 {
					t.Fatalf("request %d: no usage in the answer: %+v", i, resp.Usage)
				}
				got = append(got, served{resp.Usage.PromptTokens, resp.Usage.CompletionTokens})
			}
			if len(got) != 3 {
				t.Fatalf("served %d requests before the limit, want 3", len(got))
			}
			if denied == nil || denied.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("want a 429 after the limit, got %v", denied)
			}
			ra, err := strconv.Atoi(denied.Response.Header.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 60 {
				t.Errorf("Retry-After = %q, want whole seconds in 1..60", denied.Response.Header.Get("Retry-After"))
			}
			if denied.Type != "rate_limit_exceeded" || denied.Code != "acme-requests" {
				t.Errorf("429 body type=%q code=%q, want rate_limit_exceeded / acme-requests", denied.Type, denied.Code)
			}
			if h := denied.Response.Header.Get("RateLimit"); h != `"acme-requests";r=0;t=20` && h[:len(`"acme-requests";r=0;t=`)] != `"acme-requests";r=0;t=` {
				t.Errorf("RateLimit = %q", h)
			}

			l := s.srv.Ledger()
			if err := l.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			page, err := l.Entries(ctx, ledger.Query{Tenant: "acme", From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Entries) != len(got) {
				t.Fatalf("ledger has %d entries, want one per admitted request (%d)", len(page.Entries), len(got))
			}
			var wantIn, wantOut, gotIn, gotOut int64
			for i, e := range page.Entries {
				wantIn += got[i].prompt
				wantOut += got[i].completion
				gotIn += e.Actual.InputTokens
				gotOut += e.Actual.OutputTokens
				if e.Status != ledger.StatusSettled || e.User != "alice" || e.KeyID != "acme-key" || e.Model != "gpt-4o-mini" {
					t.Errorf("entry %d: %+v", i, e)
				}
				if e.ActualCost <= 0 {
					t.Errorf("entry %d: actual cost %v, want > 0", i, e.ActualCost)
				}
			}
			if gotIn != wantIn || gotOut != wantOut {
				t.Errorf("ledger usage in=%d out=%d, the simulator reported in=%d out=%d", gotIn, gotOut, wantIn, wantOut)
			}
		})
	}
}

// TestHeadersAndAuth checks the fields every answer carries and that a
// missing or unknown key is refused.
func TestHeadersAndAuth(t *testing.T) {
	s := newStack(t, "", `
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 100
    period: 1m
`)
	ctx := context.Background()
	var resp *http.Response
	_, err := s.client("cg-test-acme").Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     "gpt-4o-mini",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		MaxTokens: openai.Int(8),
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"acme-requests";q=100;w=60;qu="requests"` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if got := resp.Header.Get("RateLimit"); got[:len(`"acme-requests";r=99;t=`)] != `"acme-requests";r=99;t=` {
		t.Errorf("RateLimit = %q", got)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id")
	}

	for _, key := range []string{"", "cg-wrong"} {
		_, err := s.client(key).Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
			t.Errorf("key %q: want 401, got %v", key, err)
		}
	}
}
