package rls_test

import (
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"strings"
	"testing"

	"github.com/costgate/costgate/rls"
)

// TestRLSAtkSecondTenantKeepsItsPlan: a request is decided for the first
// tenant its descriptors name. A descriptor naming another tenant before
// the caller's (partner, whose value a client may send, names any tenant
// with the pro plan) made the caller's descriptors count on no plan at
// all: acme, 3 requests a minute, passed six times, and 900 output tokens
// it reported were billed to nobody. A request whose checks or debits name
// two tenants is refused, debiting nothing (two plans cannot be decided
// all or nothing as one caller's); usage already served is charged to the
// tenant each descriptor names, on its plan and in the ledger.
func TestRLSAtkSecondTenantKeepsItsPlan(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		for i := range 6 {
			resp := e.ask(t, "edge", 0, d("partner", "zz"), d("tenant", "acme"))
			if resp.GetOverallCode() != OVER {
				t.Fatalf("request %d naming zz and acme: %s, want OVER_LIMIT", i, codes_(resp))
			}
			if !strings.Contains(string(resp.GetRawBody()), "two_tenants") {
				t.Fatalf("request %d: raw_body %s", i, resp.GetRawBody())
			}
		}
		// Nothing was debited: acme has its 3 requests, zz its 100.
		if st := e.ask(t, "edge", 0, hits(0, d("tenant", "acme"))).GetStatuses()[0]; st.GetCurrentLimit().GetName() != "free-requests" || st.GetLimitRemaining() != 3 {
			t.Errorf("acme after refused requests: %v, want free-requests with 3 left", st)
		}
		if st := e.ask(t, "edge", 0, hits(0, d("partner", "zz"))).GetStatuses()[0]; st.GetCurrentLimit().GetName() != "pro-requests" || st.GetLimitRemaining() != 100 {
			t.Errorf("zz after refused requests: %v, want pro-requests with 100 left", st)
		}

		// Usage served is charged to the tenant that used it: acme's 900
		// output tokens at $10/M, $0.009, and globex's 100, $0.001.
		resp := e.ask(t, "edge", 0,
			hits(100, d("tenant", "globex", "model", "test-model", "tokens", "output")),
			hits(900, d("tenant", "acme", "model", "test-model", "tokens", "output")))
		if got := codes_(resp); got != "OK OK OK" {
			t.Fatalf("charges of two tenants: %s, want OK", got)
		}
		if st := resp.GetStatuses()[1]; st.GetCurrentLimit().GetName() != "free-tokens" || st.GetLimitRemaining() != 100 {
			t.Errorf("acme's charge: %v, want free-tokens with 100 left", st)
		}
		// A debit of zz beside a charge of acme, in either order: zz's
		// request on zz's plan, acme's tokens on acme's.
		resp = e.ask(t, "edge", 0, hits(400, d("tenant", "acme", "model", "test-model", "tokens", "output")), d("partner", "zz"))
		if got := codes_(resp); got != "OK OK OK" {
			t.Errorf("a charge of acme beside a debit of zz: %s, want OK", got)
		}
		if st := resp.GetStatuses()[1]; st.GetCurrentLimit().GetName() != "pro-requests" || st.GetLimitRemaining() != 99 {
			t.Errorf("zz's debit: %v, want pro-requests with 99 left", st)
		}
		resp = e.ask(t, "edge", 0, d("partner", "zz"), hits(500, d("tenant", "acme", "model", "test-model", "tokens", "output")))
		if got := codes_(resp); got != "OK OK OK" {
			t.Errorf("a debit of zz beside a charge of acme: %s, want OK", got)
		}
		// Checks of two tenants are refused too; the charge beside them
		// counts.
		resp = e.ask(t, "edge", 0, hits(0, d("partner", "zz")), hits(0, d("tenant", "globex")), hits(100, d("tenant", "globex", "model", "test-model", "tokens", "output")))
		if got := codes_(resp); got != "OVER_LIMIT OVER_LIMIT OVER_LIMIT OK" {
			t.Errorf("checks of zz and globex beside a charge of globex: %s", got)
		}
		if got := e.spentOf(t, "acme"); got != 18_000_000 {
			t.Errorf("acme is billed %d nano-dollars, want 18000000 (1,800 output tokens)", got)
		}
		if got := e.spentOf(t, "globex"); got != 2_000_000 {
			t.Errorf("globex is billed %d nano-dollars, want 2000000", got)
		}
		if got := e.spentOf(t, "zz"); got != 0 {
			t.Errorf("zz is billed %d nano-dollars, want 0", got)
		}
		resp = e.ask(t, "edge", 0, hits(0, d("tenant", "acme", "model", "test-model", "tokens", "output")))
		if resp.GetOverallCode() != OVER {
			t.Errorf("acme's check after 1,800 tokens of its 1,000 a minute: %s, want OVER_LIMIT", codes_(resp))
		}
	})
}

// TestRLSAtkChargePricedAtItsModel: a request's charge was priced at the
// first model its descriptors name, and of each kind of tokens counted
// its largest report: 100,000 output tokens of test-model ($10/M)
// reported beside one input token of gpt-4o-mini ($0.60/M output) cost
// $0.06 instead of $1, and 1,000 output tokens of each model counted
// once. Each model's usage is charged at its own price; a request whose
// checks or debits name two models is refused, as one naming two tenants
// is (a tenant's allowed models were held to the first alone).
func TestRLSAtkChargePricedAtItsModel(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		tok := func(model, kind string, n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", "globex", "model", model, "tokens", kind))
		}
		resp := e.ask(t, "edge", 0, tok("gpt-4o-mini", "input", 1), tok("test-model", "output", 100_000))
		if got := codes_(resp); got != "OK OK OK" {
			t.Fatalf("charges of two models: %s", got)
		}
		// 1 × $0.15/M + 100,000 × $10/M.
		if got := e.spentOf(t, "globex"); got != 1_000_000_150 {
			t.Fatalf("globex is billed %d nano-dollars, want 1000000150", got)
		}
		// 1,000 output tokens of each: $0.0006 + $0.01.
		e.ask(t, "edge", 0, tok("gpt-4o-mini", "output", 1000), tok("test-model", "output", 1000))
		if got := e.spentOf(t, "globex"); got != 1_000_000_150+10_600_000 {
			t.Errorf("globex is billed %d nano-dollars, want %d", got, 1_000_000_150+10_600_000)
		}
		resp = e.ask(t, "edge", 0, tok("gpt-4o-mini", "output", 0), tok("test-model", "output", 0))
		if got := codes_(resp); got != "OVER_LIMIT OVER_LIMIT OVER_LIMIT" || !strings.Contains(string(resp.GetRawBody()), "two_models") {
			t.Errorf("checks of two models: %s %s, want OVER_LIMIT two_models", got, resp.GetRawBody())
		}
	})
}
