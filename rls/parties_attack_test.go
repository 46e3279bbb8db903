package rls_test

import (
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/costgate/costgate/rls"
)

// TestPartiesAtkSecondTenantsTotalBilledOnce: a total of tokens that names
// no model (Envoy AI Gateway's llm_total_token under the tenant alone) is
// input plus output tokens, billed only beyond them, for the tenant the
// request is decided as. For a second tenant of the request, it was a
// party of its own, priced at the tenant's first model all the same:
// globex's 1,000 output tokens of test-model ($10/M) and their total were
// billed $0.02, where named first it was billed $0.01.
func TestPartiesAtkSecondTenantsTotalBilledOnce(t *testing.T) {
	cfg := strings.Replace(totalConfig, "  - {name: acme, plan: metered}", "  - {name: acme, plan: metered}\n  - {name: globex, plan: metered}", 1)
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, cfg, redis, rls.Options{})
		out := func(tenant string, n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", tenant, "model", "test-model", "tokens", "output"))
		}
		total := func(tenant string, n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", tenant, "tokens", "total"))
		}
		for _, tc := range []struct {
			name string
			ds   []*commonv3.RateLimitDescriptor
		}{
			{"globex first", []*commonv3.RateLimitDescriptor{out("globex", 1000), total("globex", 1000), out("acme", 100)}},
			{"globex second", []*commonv3.RateLimitDescriptor{out("acme", 100), out("globex", 1000), total("globex", 1000)}},
			{"globex second, total first", []*commonv3.RateLimitDescriptor{out("acme", 100), total("globex", 1000), out("globex", 1000)}},
		} {
			before := e.spentOf(t, "globex")
			if got := codes_(e.ask(t, "ai", 0, tc.ds...)); got != "OK OK OK OK" {
				t.Fatalf("%s: %s, want OK", tc.name, got)
			}
			if got := e.spentOf(t, "globex") - before; got != 10_000_000 {
				t.Errorf("%s: globex is billed %d nano-dollars for 1,000 output tokens and their total, want 10000000", tc.name, got)
			}
		}
		if got := e.spentOf(t, "acme"); got != 3_000_000 {
			t.Errorf("acme is billed %d nano-dollars, want 3000000 (3 × 100 output tokens)", got)
		}
	})
}

// usersConfig names a tenant's user by either of two keys (the
// authenticated user, and the user a service acts for), each user held
// to 2 requests an hour and charged its tokens.
const usersConfig = `
admin_token: t
tenants:
  - {name: acme, plan: free}
limits:
  - {name: user-requests, plans: [free], dimensions: [tenant, user], unit: requests, rate: 2, period: 1h, algorithm: fixed_window}
  - {name: user-tokens, plans: [free], dimensions: [tenant, user], unit: output_tokens, rate: 1000, period: 1h, algorithm: fixed_window}
costs:
  prices:
    test-model: {input: "1.00", output: "10.00"}
rls:
  domains:
    - domain: u
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - key: user
              as: user
              descriptors:
                - {key: tokens, value: output, hits: output_tokens}
            - key: on_behalf_of
              as: user
              descriptors:
                - {key: tokens, value: output, hits: output_tokens}
`

// TestPartiesAtkSecondUserKeepsItsLimits: a request was decided as the
// first user its descriptors name. alice, her 2 requests of the hour
// spent, was admitted again beside a descriptor naming bob first, and
// her 900 output tokens were counted on bob's limits. A request whose
// checks or debits name two users of one tenant is refused (two_users),
// debiting nothing; usage served is charged to the user each descriptor
// names.
func TestPartiesAtkSecondUserKeepsItsLimits(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, usersConfig, redis, rls.Options{})
		alice := func() *commonv3.RateLimitDescriptor { return d("tenant", "acme", "user", "alice") }
		bob := func() *commonv3.RateLimitDescriptor { return d("tenant", "acme", "on_behalf_of", "bob") }
		for i := range 2 {
			if got := codes_(e.ask(t, "u", 0, alice())); got != "OK OK" {
				t.Fatalf("alice's request %d: %s, want OK", i, got)
			}
		}
		if got := codes_(e.ask(t, "u", 0, alice())); got != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("alice's third request: %s, want OVER_LIMIT", got)
		}
		for _, ds := range [][]*commonv3.RateLimitDescriptor{{bob(), alice()}, {alice(), bob()}} {
			resp := e.ask(t, "u", 0, ds...)
			if resp.GetOverallCode() != OVER || !strings.Contains(string(resp.GetRawBody()), "two_users") {
				t.Errorf("a request naming alice and bob: %s %s, want OVER_LIMIT two_users", codes_(resp), resp.GetRawBody())
			}
		}
		// Nothing was debited: bob has his 2.
		for i := range 2 {
			if got := codes_(e.ask(t, "u", 0, bob())); got != "OK OK" {
				t.Errorf("bob's request %d: %s, want OK", i, got)
			}
		}
		// Usage served is charged to the user that used it, whatever
		// comes first: carol's 900 output tokens fill her hour's 1,000
		// with dave's 100 apart (neither has spent a request).
		out := func(key, user string, n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", "acme", key, user, "tokens", "output"))
		}
		if got := codes_(e.ask(t, "u", 0, out("on_behalf_of", "dave", 100), out("user", "carol", 900))); got != "OK OK OK" {
			t.Fatalf("charges of two users: %s, want OK", got)
		}
		check := func(key, user string) string {
			return codes_(e.ask(t, "u", 0, out(key, user, 0)))
		}
		if got := check("user", "carol"); got != "OK OK" {
			t.Errorf("carol's check after 900 of her 1,000 tokens: %s, want OK", got)
		}
		if got := codes_(e.ask(t, "u", 0, out("user", "carol", 100))); got != "OK OK" {
			t.Fatalf("carol's charge of 100: %s", got)
		}
		if got := check("user", "carol"); got != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("carol's check after her 1,000 tokens: %s, want OVER_LIMIT", got)
		}
		if got := check("on_behalf_of", "dave"); got != "OK OK" {
			t.Errorf("dave's check after 100 of his 1,000 tokens: %s, want OK", got)
		}
	})
}
