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
