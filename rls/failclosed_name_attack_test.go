package rls_test

import (
	"context"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/costgate/costgate/rls"
)

// TestRLSAtkFailClosedWhateverItsName: a fail-closed limit whose store is
// down refuses, and its refusal's code is the limit's name. The server
// told an outage (the gRPC error UNAVAILABLE, which Envoy's
// failure_mode_deny: false lets through) from a decision by that code: a
// fail-closed limit named "overloaded", "limiter_unavailable" or
// "ledger_unavailable" failed open. It is OVER_LIMIT whatever its name.
func TestRLSAtkFailClosedWhateverItsName(t *testing.T) {
	for _, name := range []string{"overloaded", "limiter_unavailable", "ledger_unavailable"} {
		t.Run(name, func(t *testing.T) {
			cfg := `
admin_token: t
tenants: [{name: acme, plan: free}]
limits: [{name: free-requests, plans: [free], dimensions: [tenant], unit: requests, rate: 3, period: 1m}]
rls:
  domains:
    - domain: edge
      descriptors:
        - key: closed
          on_store_failure: fail_closed
          rate_limit: {name: ` + name + `, unit: minute, requests_per_unit: 100}
`
			e := newEnv(t, cfg, true, rls.Options{})
			e.redis.Stop(t)
			defer e.redis.Restart(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for _, hitsAddend := range []uint64{0, 1} { // a check, a debit
				resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
					Descriptors: []*commonv3.RateLimitDescriptor{hits(hitsAddend, d("closed", "x"))}})
				if err != nil || resp.GetOverallCode() != OVER || headerOf(resp, "Costgate-Degraded") != "fail-closed" {
					t.Errorf("hits %d on fail-closed limit %q with Redis down: %s, %v; want OVER_LIMIT, fail-closed", hitsAddend, name, codes_(resp), err)
				}
			}
		})
	}
}
