package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/rls"
)

// TestKeyInjectAttackTenantNameTheRLSCannotName: a configured tenant may
// be named with a '%' ("a%b"). The rate limit service reads a tenant
// value with a '%' (or a NUL, or bytes that are not UTF-8) as "%XX", one
// to one ("a%25b"), so that no value lands on another's counters: Envoy
// can then never name tenant "a%b", and its requests for it come as tenant
// "a%25b", one the configuration does not list, with none of a%b's plan
// limits and budgets. The tenant spends its per-tenant limit through the
// gate's door (a key's request), and the RLS request naming it is still
// admitted. What must hold, on both stores: either the configuration
// refuses a tenant name the doors do not read as itself (an error naming
// the field), or every door's request of the tenant counts on its one
// counter.
func TestKeyInjectAttackTenantNameTheRLSCannotName(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			yaml := fmt.Sprintf(`
admin_token: t
data_dir: %q
tenants: [{name: "a%%b", plan: free, keys: [{key: k-pct}]}]
limits: [{name: per-tenant, plans: [free], dimensions: [tenant], unit: requests, rate: 1, period: 1m, algorithm: fixed_window}]
rls:
  domains:
    - domain: edge
      descriptors: [{key: tenant, as: tenant}]
`, t.TempDir())
			if store == "redis" {
				yaml += fmt.Sprintf("store: {redis: %q}\n", redistest.New(t).URL)
			}
			cfg, err := config.Parse([]byte(yaml))
			if err != nil {
				if !strings.Contains(err.Error(), "tenants[0].name") {
					t.Fatalf("refused, but the error names no field: %v", err)
				}
				return
			}
			ctx := context.Background()
			g, err := gate.Open(ctx, cfg, gate.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { g.Close() })
			res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("k-pct"), Route: "/v1/costgate/reserve"})
			if res == nil {
				t.Fatalf("the key's first request was refused: %+v", d)
			}
			if d, ok := res.Record(ctx); !ok {
				t.Fatalf("record: %+v", d)
			}
			res.Settle(ctx, gate.Charge{HTTPStatus: 200})

			srv := rls.New(g, rls.Options{})
			t.Cleanup(func() { srv.Close() })
			resp, err := srv.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1,
				Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "a%b"}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if code := resp.GetOverallCode(); code != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("tenant a%%b spent its 1 request a minute through its key; the RLS request naming it: %s, want OVER_LIMIT (it counted as another tenant)", code)
			}
		})
	}
}
