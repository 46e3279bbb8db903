package rls_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

const (
	OK   = rlsv3.RateLimitResponse_OK
	OVER = rlsv3.RateLimitResponse_OVER_LIMIT
)

// testConfig is the configuration most tests run with: two tenants on
// plans with limits and a budget, and a domain of descriptors.
const testConfig = `
admin_token: t
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
  - {name: globex, plan: pro, keys: [{key: k-globex}]}
limits:
  - {name: free-requests, plans: [free], dimensions: [tenant], unit: requests, rate: 3, period: 1m}
  - {name: free-tokens, plans: [free], dimensions: [tenant], unit: tokens, rate: 1000, period: 1m}
  - {name: pro-requests, plans: [pro], dimensions: [tenant], unit: requests, rate: 100, period: 1m}
budgets:
  - {name: free-daily, plans: [free], amount: "1.00"}
costs:
  prices:
    test-model: {input: "1.00", output: "10.00"}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - key: generic_key
              value: search
              price_per_hit: "0.01"
              rate_limit: {name: search, unit: minute, requests_per_unit: 2}
            - key: model
              as: model
              descriptors:
                - {key: tokens, value: input, hits: input_tokens}
                - {key: tokens, value: output, hits: output_tokens}
        - key: remote_address
          rate_limit: {name: per-ip, unit: minute, requests_per_unit: 4, algorithm: fixed_window}
        - key: remote_address
          value: 192.0.2.66
          rate_limit: {name: banned, unit: second, requests_per_unit: 0}
        - key: remote_address
          value: 192.0.2.77
          shadow_mode: true
          rate_limit: {name: watched, unit: second, requests_per_unit: 0}
        - key: route
          value: /v1/*
          rate_limit: {name: api-routes, unit: minute, requests_per_unit: 10}
        - key: route
          value: /v1/chat*
          rate_limit: {name: chat-routes, unit: minute, requests_per_unit: 5}
        - key: route
          value: /v1/chat/completions
          rate_limit: {name: chat-completions, unit: minute, requests_per_unit: 2}
        - key: route
          rate_limit: {name: any-route, unit: minute, requests_per_unit: 1}
        - key: probe
          rate_limit: {unlimited: true}
        - key: shadowed
          shadow_mode: true
          rate_limit: {name: shadowed, unit: minute, requests_per_unit: 1}
        - key: closed
          on_store_failure: fail_closed
          rate_limit: {name: closed, unit: minute, requests_per_unit: 100}
        - key: open
          rate_limit: {name: open, unit: minute, requests_per_unit: 100}
        - key: user
          as: user
          tenant: acme
          descriptors:
            - key: quota
              rate_limit: {name: user-quota, unit: hour, requests_per_unit: 2, algorithm: token_bucket}
        - key: partner
          as: tenant
          plan: pro
        - key: tok
          hits: tokens
          rate_limit: {name: tok, unit: minute, requests_per_unit: 100, algorithm: token_bucket}
`

// env is a gate with the RLS server on a loopback listener, and a client
// of it built from go-control-plane's generated code.
type env struct {
	g      *gate.Gate
	srv    *rls.Server
	conn   *grpc.ClientConn
	client rlsv3.RateLimitServiceClient
	redis  *redistest.Server // nil for the memory store
}

// stores runs f once with the in-memory store and once with Redis.
func stores(t *testing.T, f func(t *testing.T, redis bool)) {
	t.Run("memory", func(t *testing.T) { f(t, false) })
	t.Run("redis", func(t *testing.T) { f(t, true) })
}

func newEnv(t testing.TB, yaml string, withRedis bool, opts rls.Options) *env {
	t.Helper()
	e := &env{}
	yaml += "\ndata_dir: " + t.TempDir() + "\n"
	if withRedis {
		e.redis = redistest.New(t)
		// Calls get 5 s: on a loaded machine (the race detector, the other
		// packages' tests) a call past the default 100 ms was an outage,
		// and a charge made then went to the fallback, not to Redis.
		yaml += "store: {redis: '" + e.redis.URL + "', breaker_failures: 1, timeout: 5s, queue_timeout: 5s}\n"
	}
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	e.open(t, cfg, opts)
	return e
}

func (e *env) open(t testing.TB, cfg *config.Config, opts rls.Options) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := gate.Open(ctx, cfg, gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	e.g = g
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.srv = rls.New(g, opts)
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(ln) }()
	t.Cleanup(func() {
		e.srv.GracefulStop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	e.dial(t, ln.Addr().String())
}

// dial makes e's client of the server at addr.
func (e *env) dial(t testing.TB, addr string) {
	t.Helper()
	var err error
	e.conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.conn.Close() })
	e.client = rlsv3.NewRateLimitServiceClient(e.conn)
}

// d is a descriptor of key, value pairs.
func d(kv ...string) *commonv3.RateLimitDescriptor {
	out := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// hits sets a descriptor's own hits_addend.
func hits(n uint64, desc *commonv3.RateLimitDescriptor) *commonv3.RateLimitDescriptor {
	desc.HitsAddend = wrapperspb.UInt64(n)
	return desc
}

func (e *env) ask(t testing.TB, domain string, hitsAddend uint32, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hitsAddend})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.GetStatuses()) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(ds))
	}
	return resp
}

func headerOf(resp *rlsv3.RateLimitResponse, key string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), key) {
			return h.GetValue()
		}
	}
	return ""
}

func codes_(resp *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(resp.GetOverallCode().String())
	for _, s := range resp.GetStatuses() {
		b.WriteString(" " + s.GetCode().String())
	}
	return b.String()
}

func TestDescriptorMatching(t *testing.T) {
	e := newEnv(t, testConfig, false, rls.Options{})
	for _, tc := range []struct {
		name  string
		desc  *commonv3.RateLimitDescriptor
		limit string // the current_limit's name; empty for none
	}{
		{"any value", d("remote_address", "198.51.100.1"), "per-ip"},
		{"exact value before any value", d("route", "/v1/chat/completions"), "chat-completions"},
		{"longest wildcard", d("route", "/v1/chat/other"), "chat-routes"},
		{"shorter wildcard", d("route", "/v1/embeddings"), "api-routes"},
		{"no wildcard matches", d("route", "/admin"), "any-route"},
		{"unknown key", d("nothing", "x"), ""},
		{"too deep", d("remote_address", "198.51.100.2", "extra", "x"), ""},
		{"too shallow", d("tenant", "globex"), "pro-requests"},
		{"nested", d("tenant", "globex", "generic_key", "search"), "search"},
		{"nested miss", d("tenant", "globex", "generic_key", "other"), ""},
		{"fixed tenant", d("user", "alice", "quota", "x"), "user-quota"},
		{"the plan of a tenant not listed", d("partner", "newco"), "pro-requests"},
		{"a listed tenant keeps its plan", d("partner", "acme"), "free-requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.ask(t, "edge", 0, tc.desc)
			if got := resp.GetStatuses()[0].GetCurrentLimit().GetName(); got != tc.limit {
				t.Errorf("current_limit %q, want %q", got, tc.limit)
			}
			if resp.GetOverallCode() != OK {
				t.Errorf("overall %s", resp.GetOverallCode())
			}
		})
	}
	t.Run("each value counts on its own", func(t *testing.T) {
		for range 2 {
			e.ask(t, "edge", 0, d("route", "/v1/x1"))
		}
		resp := e.ask(t, "edge", 0, d("route", "/v1/x2"))
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 9 {
			t.Errorf("another value of a wildcard: remaining %d, want 9", got)
		}
	})
	t.Run("unknown domain", func(t *testing.T) {
		resp := e.ask(t, "nowhere", 0, d("tenant", "acme"))
		if resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Errorf("unknown domain: %v", resp)
		}
	})
}

func TestAllOrNothing(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		// per-ip admits 4 a minute and search 2: two requests pass, the
		// third is refused by search alone.
		both := []*commonv3.RateLimitDescriptor{d("remote_address", "198.51.100.7"), d("tenant", "globex", "generic_key", "search")}
		for i := range 2 {
			if resp := e.ask(t, "edge", 0, both...); resp.GetOverallCode() != OK {
				t.Fatalf("request %d: %s", i, codes_(resp))
			}
		}
		resp := e.ask(t, "edge", 0, both...)
		if got, want := codes_(resp), "OVER_LIMIT OK OVER_LIMIT"; got != want {
			t.Fatalf("third request: %s, want %s", got, want)
		}
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 2 {
			t.Errorf("per-ip in the refusal: remaining %d, want 2 (before the debit)", got)
		}
		// The refusal left per-ip and the tenant's plan as they were.
		resp = e.ask(t, "edge", 0, d("remote_address", "198.51.100.7"))
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 1 {
			t.Errorf("per-ip after a refused request: remaining %d, want 1", got)
		}
		resp = e.ask(t, "edge", 0, d("tenant", "globex"))
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "pro-requests" || st.GetLimitRemaining() != 97 {
			t.Errorf("the tenant's plan after a refused request: %v, want pro-requests with 97 left", st)
		}
	})
}

func TestHitsAddend(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		ip := func() *commonv3.RateLimitDescriptor { return d("remote_address", "198.51.100.9") }
		remaining := func(resp *rlsv3.RateLimitResponse) uint32 { return resp.GetStatuses()[0].GetLimitRemaining() }
		if got := remaining(e.ask(t, "edge", 0, ip())); got != 3 {
			t.Errorf("hits_addend unset counts 1: remaining %d, want 3", got)
		}
		if got := remaining(e.ask(t, "edge", 2, ip())); got != 1 {
			t.Errorf("request hits_addend 2: remaining %d, want 1", got)
		}
		if got := remaining(e.ask(t, "edge", 2, hits(0, ip()))); got != 1 {
			t.Errorf("a descriptor's hits_addend 0 only checks: remaining %d, want 1", got)
		}
		resp := e.ask(t, "edge", 3, hits(2, ip()))
		if resp.GetOverallCode() != OVER || remaining(resp) != 1 {
			t.Errorf("a descriptor's hits_addend 2 over the request's 3, 1 left: %s remaining %d, want OVER_LIMIT 1", codes_(resp), remaining(resp))
		}
		if got := remaining(e.ask(t, "edge", 3, hits(1, ip()))); got != 0 {
			t.Errorf("a descriptor's hits_addend 1: remaining %d, want 0", got)
		}
		if resp := e.ask(t, "edge", 0, hits(0, ip())); resp.GetOverallCode() != OVER {
			t.Errorf("a check on a spent limit: %s, want OVER_LIMIT", codes_(resp))
		}
		// The tenant's plan counts one request however many descriptors
		// name it.
		e.ask(t, "edge", 0, d("tenant", "acme"), d("tenant", "acme", "generic_key", "search"))
		resp = e.ask(t, "edge", 0, hits(0, d("tenant", "acme")))
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "free-requests" || st.GetLimitRemaining() != 2 {
			t.Errorf("the plan after one request of two descriptors: %v, want free-requests with 2 left", st)
		}
	})
}

func TestShadowUnlimitedAndBlock(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		for i := range 3 {
			resp := e.ask(t, "edge", 0, d("shadowed", "x"), d("remote_address", "198.51.100.10"))
			if resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetCode() != OK {
				t.Fatalf("request %d over a shadow limit: %s", i, codes_(resp))
			}
		}
		resp := e.ask(t, "edge", 0, d("remote_address", "198.51.100.10"))
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 0 {
			t.Errorf("the enforced limit beside a shadow one: remaining %d, want 0 (debited 4 times)", got)
		}
		resp = e.ask(t, "edge", 0, d("probe", "x"), d("tenant", "globex"))
		if st := resp.GetStatuses()[0]; st.GetCode() != OK || st.GetLimitRemaining() != 1<<32-1 {
			t.Errorf("unlimited: %v", st)
		}
		resp = e.ask(t, "edge", 0, d("tenant", "globex"), d("remote_address", "192.0.2.66"))
		if got, want := codes_(resp), "OVER_LIMIT OK OVER_LIMIT"; got != want {
			t.Errorf("a blocked address: %s, want %s", got, want)
		}
		if !strings.Contains(string(resp.GetRawBody()), `"code":"banned"`) {
			t.Errorf("raw body %s", resp.GetRawBody())
		}
		resp = e.ask(t, "edge", 0, d("remote_address", "192.0.2.77"))
		if st := resp.GetStatuses()[0]; resp.GetOverallCode() != OK || st.GetCurrentLimit().GetName() != "watched" {
			t.Errorf("a block in shadow mode: %s %v", codes_(resp), st)
		}
		resp = e.ask(t, "edge", 0, hits(0, d("tenant", "globex")))
		if st := resp.GetStatuses()[0]; st.GetLimitRemaining() != 99 {
			t.Errorf("a blocked request debited its other descriptors: %v (want 99 left: one request, by the unlimited call)", st)
		}
	})
}

func TestHeaders(t *testing.T) {
	e := newEnv(t, testConfig, false, rls.Options{})
	resp := e.ask(t, "edge", 0, d("tenant", "acme"))
	if got, want := headerOf(resp, "RateLimit-Policy"), `"free-requests";q=3;w=60;qu="requests"`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got := headerOf(resp, "RateLimit"); !strings.HasPrefix(got, `"free-requests";r=2;t=`) {
		t.Errorf("RateLimit %q", got)
	}
	if headerOf(resp, "Retry-After") != "" || resp.GetRawBody() != nil {
		t.Errorf("an admitted request carries Retry-After or a body: %v", resp)
	}
	e.ask(t, "edge", 0, d("tenant", "acme"))
	e.ask(t, "edge", 0, d("tenant", "acme"))
	resp = e.ask(t, "edge", 0, d("tenant", "acme"))
	if resp.GetOverallCode() != OVER {
		t.Fatalf("fourth request: %s", codes_(resp))
	}
	ra := headerOf(resp, "Retry-After")
	if ra == "" || ra == "0" {
		t.Errorf("Retry-After %q", ra)
	}
	if got := headerOf(resp, "RateLimit"); !strings.HasPrefix(got, `"free-requests";r=0;t=`+ra) {
		t.Errorf("RateLimit %q on a refusal, want t=%s", got, ra)
	}
	st := resp.GetStatuses()[0]
	if st.GetDurationUntilReset().AsDuration() < time.Duration(0) || st.GetDurationUntilReset() == nil {
		t.Errorf("duration_until_reset %v", st.GetDurationUntilReset())
	}
	if c := st.GetCurrentLimit(); c.GetRequestsPerUnit() != 3 || c.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit %v, want 3 a minute", c)
	}
	var body struct {
		Error gate.Error `json:"error"`
	}
	if err := json.Unmarshal(resp.GetRawBody(), &body); err != nil || body.Error.Type != "rate_limit_exceeded" || body.Error.Code != "free-requests" {
		t.Errorf("raw body %s: %v", resp.GetRawBody(), err)
	}
	if headerOf(resp, "Content-Type") != "application/json" {
		t.Errorf("no content type for the body")
	}
}

func TestFailOpenAndClosed(t *testing.T) {
	e := newEnv(t, testConfig, true, rls.Options{})
	if resp := e.ask(t, "edge", 0, d("open", "a"), d("closed", "b")); resp.GetOverallCode() != OK {
		t.Fatalf("with Redis up: %s", codes_(resp))
	}
	e.redis.Stop(t)
	resp := e.ask(t, "edge", 0, d("open", "a"))
	if resp.GetOverallCode() != OK || headerOf(resp, "Costgate-Degraded") != "fail-open" {
		t.Errorf("a fail-open limit with Redis down: %s %v", codes_(resp), resp.GetResponseHeadersToAdd())
	}
	resp = e.ask(t, "edge", 0, d("open", "a"), d("closed", "b"))
	if got, want := codes_(resp), "OVER_LIMIT OK OVER_LIMIT"; got != want {
		t.Errorf("a fail-closed limit with Redis down: %s, want %s", got, want)
	}
	if headerOf(resp, "Retry-After") != "1" || headerOf(resp, "Costgate-Degraded") != "fail-closed" {
		t.Errorf("fail-closed headers: %v", resp.GetResponseHeadersToAdd())
	}
	if !strings.Contains(string(resp.GetRawBody()), "service_unavailable") {
		t.Errorf("fail-closed body: %s", resp.GetRawBody())
	}
	// A fail-open check beside a fail-closed debit: one Costgate-Degraded,
	// the refusal's.
	resp = e.ask(t, "edge", 0, hits(0, d("open", "a")), d("closed", "b"))
	var degraded []string
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), "Costgate-Degraded") {
			degraded = append(degraded, h.GetValue())
		}
	}
	if resp.GetOverallCode() != OVER || len(degraded) != 1 || degraded[0] != "fail-closed" {
		t.Errorf("a fail-open check beside a fail-closed debit: %s, Costgate-Degraded %q; want one, fail-closed", codes_(resp), degraded)
	}
	e.redis.Restart(t)
}

func TestTwoPhaseTokens(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		in := func(n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", "acme", "model", "test-model", "tokens", "input"))
		}
		out := func(n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", "acme", "model", "test-model", "tokens", "output"))
		}
		// Phase 1: the request arrives, and its tokens are checked.
		if resp := e.ask(t, "edge", 0, in(0), out(0)); resp.GetOverallCode() != OK {
			t.Fatalf("phase 1: %s", codes_(resp))
		}
		// Phase 2: the stream ended, with 200 input and 900 output tokens,
		// more than free-tokens' 1000 a minute: it is debited all the same.
		resp := e.ask(t, "edge", 0, in(200), out(900))
		charged := time.Now()
		if resp.GetOverallCode() != OK {
			t.Fatalf("phase 2: %s", codes_(resp))
		}
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "free-tokens" || st.GetLimitRemaining() != 0 {
			t.Errorf("phase 2 status: %v, want free-tokens spent", st)
		}
		// The next request's phase 1 is refused, while the bucket, which
		// the charge left empty, has not refilled a token (one every
		// 60 ms): a machine too slow to ask again within that cannot
		// tell.
		resp = e.ask(t, "edge", 0, in(0), out(0))
		switch {
		case resp.GetOverallCode() == OVER:
			if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "free-tokens" || st.GetDurationUntilReset() == nil {
				t.Errorf("refused check: %v", st)
			}
		case time.Since(charged) < 50*time.Millisecond:
			t.Fatalf("phase 1 after the limit is spent: %s", codes_(resp))
		default:
			t.Logf("phase 1 asked %v after the limit was spent, when a token was back: not checked", time.Since(charged))
		}
		// The tokens were priced at test-model's price into the ledger:
		// 200 × $1/M + 900 × $10/M = $0.0092.
		ctx := context.Background()
		if err := e.g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		spent, err := e.g.Ledger().Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil || spent != 9_200_000 {
			t.Errorf("the ledger has %d nano-dollars for acme (%v), want 9200000", spent, err)
		}
		page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
		if err != nil || len(page.Entries) != 1 {
			t.Fatalf("ledger entries: %v, %v", page.Entries, err)
		}
		if en := page.Entries[0]; en.Route != "rls:edge" || en.Model != "test-model" || en.Actual.InputTokens != 200 || en.Actual.OutputTokens != 900 {
			t.Errorf("ledger entry %+v", en)
		}
	})
}

// TestPriceLandsInTheLedger: a priced search call is recorded at its
// price; a call that costs nothing is recorded at no cost when it counts
// on a limit of its tenant's that the ledger restores (acme's 3 requests
// a minute), and not at all when it counts on descriptor limits alone (a
// tenant of no plan of the config).
func TestPriceLandsInTheLedger(t *testing.T) {
	e := newEnv(t, testConfig, false, rls.Options{})
	e.ask(t, "edge", 0, d("tenant", "acme", "generic_key", "search"))
	e.ask(t, "edge", 0, d("tenant", "acme")) // free-requests: recorded at $0
	e.ask(t, "edge", 0, d("tenant", "nobody"))
	ctx := context.Background()
	if err := e.g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
	if err != nil || len(page.Entries) != 2 {
		t.Fatalf("ledger: %+v, %v; want two entries", page.Entries, err)
	}
	costs := []costmodel.NanoUSD{page.Entries[0].ActualCost, page.Entries[1].ActualCost}
	slices.Sort(costs)
	if costs[0] != 0 || costs[1] != 10_000_000 || page.Entries[0].Requests != 1 || page.Entries[1].Requests != 1 {
		t.Errorf("ledger: %+v; want one request at $0 and one at $0.01", page.Entries)
	}
	if page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "nobody"}); err != nil || len(page.Entries) != 0 {
		t.Errorf("a tenant with no plan has entries %+v, %v; want none", page.Entries, err)
	}
}

func TestInvalidRequests(t *testing.T) {
	e := newEnv(t, testConfig, false, rls.Options{})
	long := strings.Repeat("x", 2000)
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*commonv3.RateLimitDescriptor{d("a", "b")}}},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}},
		{"empty descriptor", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{{}}}},
		{"long key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d(long, "x")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v, want InvalidArgument", err)
			}
		})
	}
}

func TestHealthAndReflection(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("reflection ", on), func(t *testing.T) {
			e := newEnv(t, testConfig, false, rls.Options{Reflection: on})
			ctx := context.Background()
			for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
				hr, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("health of %q: %v, %v", svc, hr, err)
				}
			}
			stream, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctx)
			if err == nil {
				// A Send to a stream the server ended says io.EOF; Recv
				// says why.
				_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
			}
			var list *reflectionpb.ServerReflectionResponse
			if err == nil {
				list, err = stream.Recv()
			}
			switch {
			case on && err != nil:
				t.Errorf("reflection on: %v", err)
			case on && !strings.Contains(list.String(), "envoy.service.ratelimit.v3.RateLimitService"):
				t.Errorf("reflection lists %v", list)
			case !on && status.Code(err) != codes.Unimplemented:
				t.Errorf("reflection off: %v, want Unimplemented", err)
			}
		})
	}
}

func TestReload(t *testing.T) {
	e := newEnv(t, testConfig, false, rls.Options{})
	if resp := e.ask(t, "edge", 0, d("added", "x")); resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("before the reload: %v", resp)
	}
	cfg, err := config.Parse([]byte(testConfig + `
    - domain: more
      descriptors: [{key: added, rate_limit: {name: added, unit: minute, requests_per_unit: 1}}]
data_dir: ` + e.g.Config().DataDir + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	e.ask(t, "more", 0, d("added", "x"))
	if resp := e.ask(t, "more", 0, d("added", "x")); resp.GetOverallCode() != OVER {
		t.Errorf("after the reload: %s", codes_(resp))
	}
}

// rlsPolicy blocks globex on the domain edge, and asks acme to slow down.
const rlsPolicy = `package costgate.policies.rlstest

import rego.v1

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 402, "reason": "globex is blocked on the edge"} if {
	input.request.route == "rls:edge"
	input.caller.tenant == "globex"
}

decision := {"outcome": "soft", "reason": "slow down", "friction": {"delay_ms": 100, "warning": "near the\nlimit"}} if {
	input.request.route == "rls:edge"
	input.caller.tenant == "acme"
}
`

// The policies answer an RLS request of a tenant as they answer the
// proxy's: a hard decision is OVER_LIMIT on the check and the debit, and
// gives back nothing it did not take; a soft one is OK with its friction
// for the caller to apply; a stream's charge (usage already served) is
// debited whatever they say; a request that names no tenant is theirs to
// leave alone.
func TestPolicies(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "rlstest.rego"), []byte(rlsPolicy), 0o600); err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, testConfig+"policies: {dir: '"+dir+"'}\n", redis, rls.Options{})
		for _, hitsAddend := range []uint32{0, 1} { // the check, then the debit
			resp := e.ask(t, "edge", hitsAddend, d("tenant", "globex"))
			if resp.GetOverallCode() != OVER || !strings.Contains(string(resp.GetRawBody()), "globex is blocked") || headerOf(resp, "Retry-After") == "" {
				t.Fatalf("globex, hits_addend %d: %s, body %s", hitsAddend, codes_(resp), resp.GetRawBody())
			}
		}
		// Nothing was taken from globex's limit by the refusals, and a
		// refused check gave nothing back: pro-requests (100 a minute)
		// has all its room.
		res, dec := e.g.Reserve(context.Background(), &gate.Request{Caller: e.g.Trusted("globex", "", "", ""), Route: "/x", Check: true, NoPolicy: true, States: true})
		if res != nil || !dec.Allowed() {
			t.Fatalf("peek: %+v", dec)
		}
		found := false
		for _, l := range dec.Limits {
			if l.Name == "pro-requests" {
				found = true
				if l.Remaining != 100 {
					t.Errorf("pro-requests has %d left after two refused requests, want 100", l.Remaining)
				}
			}
		}
		if !found {
			t.Fatalf("no pro-requests state: %+v", dec.Limits)
		}
		// The charge at a stream's end is usage already served: debited,
		// priced into globex's ledger (50 input tokens at $1/M).
		resp := e.ask(t, "edge", 0, hits(50, d("tenant", "globex", "model", "test-model", "tokens", "input")))
		if resp.GetOverallCode() != OK {
			t.Fatalf("globex's charge: %s", codes_(resp))
		}
		ctx := context.Background()
		if err := e.g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "globex"}); err != nil || len(page.Entries) != 1 ||
			page.Entries[0].Actual.InputTokens != 50 || page.Entries[0].ActualCost != 50_000 {
			t.Errorf("globex's ledger after the charge: %+v, %v", page.Entries, err)
		}
		// acme is served, told what the policy asks.
		resp = e.ask(t, "edge", 1, d("tenant", "acme"))
		if resp.GetOverallCode() != OK {
			t.Fatalf("acme: %s", codes_(resp))
		}
		if got := headerOf(resp, "Costgate-Friction"); got != `delay_ms=100; policy="rlstest", warn; policy="rlstest"` {
			t.Errorf("Costgate-Friction %q", got)
		}
		if got := headerOf(resp, "Costgate-Warning"); got != "near the limit" {
			t.Errorf("Costgate-Warning %q", got)
		}
		// A request without a tenant is not the policies' to answer.
		if resp := e.ask(t, "edge", 1, d("remote_address", "10.1.2.3")); resp.GetOverallCode() != OK {
			t.Fatalf("no tenant: %s", codes_(resp))
		}
	})
}

// TestReplaces: a limit that replaces another, as envoyproxy/ratelimit's
// replaces, overrides it when a request matches both: the replaced one is
// neither debited nor shown, and applies again to a request that matches
// it alone. A replaced block admits; a replaced descriptor still names
// its tenant, whose plan applies.
func TestReplaces(t *testing.T) {
	const cfg = `
admin_token: t
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
limits:
  - {name: free-requests, plans: [free], dimensions: [tenant], unit: requests, rate: 3, period: 1m}
rls:
  domains:
    - domain: rep
      descriptors:
        - key: key1
          rate_limit: {name: a, unit: minute, requests_per_unit: 1, algorithm: fixed_window}
        - key: key2
          rate_limit: {name: b, unit: minute, requests_per_unit: 3, algorithm: fixed_window, replaces: [{name: a}]}
        - key: banned
          rate_limit: {name: blocked, unit: second, requests_per_unit: 0}
        - key: pass
          rate_limit: {name: pass, unit: minute, requests_per_unit: 100, replaces: [{name: blocked}]}
        - key: tenant
          as: tenant
          rate_limit: {name: per-tenant, unit: minute, requests_per_unit: 1, algorithm: fixed_window}
        - key: override
          rate_limit: {name: generous, unit: minute, requests_per_unit: 100, replaces: [{name: per-tenant}, {name: a}]}
`
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, cfg, redis, rls.Options{})
		for i := range 3 {
			resp := e.ask(t, "rep", 0, d("key1", "x"), d("key2", "y"))
			if got := codes_(resp); got != "OK OK OK" {
				t.Fatalf("request %d matching a and b: %s; a is replaced, b admits 3", i, got)
			}
			if st := resp.GetStatuses()[0]; st.GetCurrentLimit() != nil {
				t.Errorf("the replaced limit shows: %v", st)
			}
			if st := resp.GetStatuses()[1]; st.GetCurrentLimit().GetName() != "b" || st.GetLimitRemaining() != uint32(2-i) {
				t.Errorf("request %d: b %v, want %d left", i, st, 2-i)
			}
		}
		if got := codes_(e.ask(t, "rep", 0, d("key1", "x"), d("key2", "y"))); got != "OVER_LIMIT OK OVER_LIMIT" {
			t.Errorf("the fourth: %s, want b refusing", got)
		}
		// a was never debited: alone, it admits its one request.
		if got := codes_(e.ask(t, "rep", 0, d("key1", "x"))); got != "OK OK" {
			t.Errorf("a alone: %s", got)
		}
		if got := codes_(e.ask(t, "rep", 0, d("key1", "x"))); got != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("a alone, twice: %s", got)
		}
		if got := codes_(e.ask(t, "rep", 0, d("banned", "z"), d("pass", "w"))); got != "OK OK OK" {
			t.Errorf("a replaced block: %s", got)
		}
		if got := codes_(e.ask(t, "rep", 0, d("banned", "z"))); got != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("the block alone: %s", got)
		}
		// per-tenant is replaced; acme's plan (3 a minute) still applies.
		for i := range 3 {
			if got := codes_(e.ask(t, "rep", 0, d("tenant", "acme"), d("override", "o"))); got != "OK OK OK" {
				t.Fatalf("request %d of acme with the override: %s", i, got)
			}
		}
		resp := e.ask(t, "rep", 0, d("tenant", "acme"), d("override", "o"))
		if got := codes_(resp); got != "OVER_LIMIT OVER_LIMIT OK" {
			t.Errorf("acme's fourth: %s, want its plan refusing", got)
		}
		if name := resp.GetStatuses()[0].GetCurrentLimit().GetName(); name != "free-requests" {
			t.Errorf("acme's refusal names %q, want free-requests", name)
		}
	})
}

// overridden is desc with Envoy's limit override of rate per unit.
func overridden(desc *commonv3.RateLimitDescriptor, rate uint32, unit typev3.RateLimitUnit) *commonv3.RateLimitDescriptor {
	desc.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rate, Unit: unit}
	return desc
}

// TestLimitOverride: a limit Envoy sends with a descriptor applies in
// place of the configured one, as envoyproxy/ratelimit applies it: a fixed
// window of its own (the configured limit is not debited), also for a
// descriptor the configuration does not match; 0 refuses; a tenant the
// descriptor names still has its plan applied; an override costgate
// cannot apply refuses too.
func TestLimitOverride(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		ip := func() *commonv3.RateLimitDescriptor {
			return overridden(d("remote_address", "198.51.100.20"), 2, typev3.RateLimitUnit_MINUTE)
		}
		for i := range 2 {
			resp := e.ask(t, "edge", 0, ip())
			st := resp.GetStatuses()[0]
			if resp.GetOverallCode() != OK || st.GetCurrentLimit().GetName() != "edge.override.minute.1.2" ||
				st.GetCurrentLimit().GetRequestsPerUnit() != 2 || st.GetLimitRemaining() != uint32(1-i) {
				t.Fatalf("request %d under the override: %s %v", i, codes_(resp), st)
			}
		}
		if resp := e.ask(t, "edge", 0, ip()); resp.GetOverallCode() != OVER || resp.GetStatuses()[0].GetDurationUntilReset() == nil {
			t.Errorf("the third under an override of 2: %s %v", codes_(resp), resp.GetStatuses()[0])
		}
		// The configured per-ip (4 a minute) was never debited.
		resp := e.ask(t, "edge", 0, d("remote_address", "198.51.100.20"))
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "per-ip" || st.GetLimitRemaining() != 3 {
			t.Errorf("the configured limit after the overridden requests: %v, want per-ip with 3 left", st)
		}
		// No configured node matches: the override applies alone.
		other := func() *commonv3.RateLimitDescriptor {
			return overridden(d("nothing", "x"), 1, typev3.RateLimitUnit_HOUR)
		}
		if got := codes_(e.ask(t, "edge", 0, other())); got != "OK OK" {
			t.Errorf("an override on an unmatched descriptor: %s", got)
		}
		if got := codes_(e.ask(t, "edge", 0, other())); got != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("its second: %s", got)
		}
		resp = e.ask(t, "edge", 0, overridden(d("remote_address", "198.51.100.21"), 0, typev3.RateLimitUnit_SECOND))
		if resp.GetOverallCode() != OVER || !strings.Contains(string(resp.GetRawBody()), "edge.override.second.1.0") {
			t.Errorf("an override of 0: %s %s", codes_(resp), resp.GetRawBody())
		}
		// A tenant's descriptor: the override replaces no plan.
		tenant := func() *commonv3.RateLimitDescriptor {
			return overridden(d("tenant", "globex"), 1, typev3.RateLimitUnit_MINUTE)
		}
		if got := codes_(e.ask(t, "edge", 0, tenant())); got != "OK OK" {
			t.Errorf("globex under an override: %s", got)
		}
		if got := codes_(e.ask(t, "edge", 0, tenant())); got != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("globex's second under an override of 1: %s", got)
		}
		resp = e.ask(t, "edge", 0, hits(0, d("tenant", "globex")))
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "pro-requests" || st.GetLimitRemaining() != 99 {
			t.Errorf("globex's plan: %v, want pro-requests with 99 left (one admitted request)", st)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, lo := range []*commonv3.RateLimitDescriptor_RateLimitOverride{
			{RequestsPerUnit: 5},
			{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit(42)},
			{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(5)},
			{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32)},   // overflows a Duration
			{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32)}, // 136 years
		} {
			desc := d("remote_address", "198.51.100.22")
			desc.Limit = lo
			resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc}})
			if err != nil || resp.GetOverallCode() != OVER || !strings.Contains(string(resp.GetRawBody()), "invalid_limit_override") {
				t.Errorf("override %v: %s %s, %v; want OVER_LIMIT, invalid_limit_override (see TestRLSAtkOverrideCannotFailOpen)", lo, codes_(resp), resp.GetRawBody(), err)
			}
		}
	})
}

// TestChargeOutlivesTheCaller: usage Envoy reports, and a request it
// asks to debit, are counted even when Envoy stops waiting for the answer
// at once (its filter's timeout, past which it lets the request through).
func TestChargeOutlivesTheCaller(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{hits(30, d("tok", "gone"))}}
		if _, err := e.srv.ShouldRateLimit(gone, req); err != nil {
			t.Fatalf("a charge whose caller left: %v", err)
		}
		resp := e.ask(t, "edge", 0, hits(0, d("tok", "gone")))
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "tok" || st.GetLimitRemaining() > 70 {
			t.Errorf("tok after a charge of 30 whose caller left: %v, want at most 70 left", st)
		}
		if got := headerOf(resp, "Costgate-Degraded"); got != "" {
			t.Errorf("the check is degraded (%q): the charge went to the fallback", got)
		}
		// A debit too: Envoy, past its timeout, lets the request through.
		req = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("remote_address", "198.51.100.60")}}
		if _, err := e.srv.ShouldRateLimit(gone, req); err != nil {
			t.Fatalf("a debit whose caller left: %v", err)
		}
		resp = e.ask(t, "edge", 0, hits(0, d("remote_address", "198.51.100.60")))
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "per-ip" || st.GetLimitRemaining() != 3 {
			t.Errorf("per-ip after a debit whose caller left: %v, want 3 left", st)
		}
	})
}
