package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/examples"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/simulator"
	"github.com/costgate/costgate/telemetry"
)

// stack is costgate in front of the simulator, both on loopback.
type stack struct {
	srv *proxy.Server
	url string // costgate's data plane
}

// stackOptions vary the stack of a test.
type stackOptions struct {
	redisURL string           // empty: the in-memory store
	extra    string           // more config YAML (limits, budgets, ...)
	policies fs.FS            // default: the quickstart's
	sim      simulator.Config // the simulator's knobs; its Estimator is set for it
	upstream http.Handler     // replaces the simulator when set
	// upstreamURL, when set, is where the openai and anthropic upstreams
	// point instead.
	upstreamURL string
	// store is more of the store section, indented by two spaces.
	store string
	// ledgerDSN is a PostgreSQL ledger; empty: the embedded ledger.
	ledgerDSN string
	// upstreamTimeout bounds an upstream exchange; default 10m.
	upstreamTimeout time.Duration
	// telemetry is the server's; nil: one with defaults.
	telemetry *telemetry.Telemetry
	// dataDir is the data directory; empty: a new temporary one.
	dataDir string
}

// onEachStore runs f as a subtest on each limiter store, with url the
// private Redis's address, or "" for the in-memory store.
func onEachStore(t *testing.T, f func(t *testing.T, url string)) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			url := ""
			if store == "redis" {
				url = redistest.New(t).URL
			}
			f(t, url)
		})
	}
}

// newStack starts the simulator and costgate with the given limits YAML;
// redisURL empty means the in-memory store.
func newStack(t testing.TB, redisURL, limits string) *stack {
	t.Helper()
	return newStackWith(t, stackOptions{redisURL: redisURL, extra: limits})
}

func newStackWith(t testing.TB, o stackOptions) *stack {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	o.sim.Estimator = est
	var up http.Handler = simulator.New(o.sim)
	if o.upstream != nil {
		up = o.upstream
	}
	sim := httptest.NewServer(up)
	t.Cleanup(sim.Close)
	upURL := sim.URL
	if o.upstreamURL != "" {
		upURL = o.upstreamURL
	}
	redisURL, limits := o.redisURL, o.extra
	// Lines before a "limits:" line at the top of extra are more upstreams.
	upstreams := ""
	if i := strings.Index(limits, "\nlimits:"); i >= 0 && strings.HasPrefix(limits, "\n  - name:") {
		upstreams, limits = limits[:i], limits[i:]
	}
	if o.store == "" {
		// Slow CI machines under -race must not look like a store outage.
		o.store = "  timeout: 2s\n  queue_timeout: 2s"
	}
	if o.upstreamTimeout == 0 {
		o.upstreamTimeout = 10 * time.Minute
	}
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}

	yaml := fmt.Sprintf(`
admin_token: test-admin
data_dir: %q
store:
  redis: %q
%s
upstreams:
  - name: openai
    kind: openai
    base_url: %s
    api_key: sk-upstream-secret
    timeout: %s
  - name: anthropic
    kind: anthropic
    base_url: %s
    api_key: sk-ant-upstream-secret
%s
tenants:
  - name: acme
    plan: free
    keys:
      - id: acme-key
        key: cg-test-acme
        user: alice
  - name: globex
    plan: strict
    keys:
      - id: globex-key
        key: cg-test-globex
%s`, o.dataDir, redisURL, o.store, upURL, o.upstreamTimeout, upURL, upstreams, limits)
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	// The environment's REDIS_URL and DATABASE_URL must not leak into a
	// test's stack: it uses exactly the stores it asked for.
	cfg.Store.Redis, cfg.Ledger.DSN = redisURL, o.ledgerDSN
	if o.policies == nil {
		o.policies = examples.QuickstartPolicies()
	}
	cfg.WithPolicyFS(o.policies)
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{Telemetry: o.telemetry})
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
	for _, store := range []string{"memory", "redis+postgres"} {
		t.Run(store, func(t *testing.T) {
			// The production mode: Redis and PostgreSQL; the default:
			// in-memory and the embedded ledger.
			o := stackOptions{extra: limits}
			if store == "redis+postgres" {
				o.redisURL = redistest.New(t).URL
				o.ledgerDSN = pgtest.New(t)
			}
			s := newStackWith(t, o)
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

			if err := s.srv.WaitIdle(ctx); err != nil {
				t.Fatal(err)
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
