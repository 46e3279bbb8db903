package rls_test

import (
	"fmt"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/costgate/costgate/rls"
)

// owedConfig gives acme 1,000 output tokens per 10 s on a meter (100 a
// second), charged after the stream by Envoy's second phase.
const owedConfig = `
admin_token: t
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
limits:
  - {name: tokens, plans: [free], dimensions: [tenant], unit: tokens, rate: 1000, period: 10s, algorithm: %s}
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
            - key: model
              as: model
              descriptors:
                - {key: tokens, value: output, hits: output_tokens}
`

// TestOwedLossAtkDebtSurvivesTheLoss: Envoy's two phases on a meter, a
// check of 0 hits, then a charge of the stream's 3,000 output tokens on
// acme's 1,000 per 10 s: acme owes one capacity beyond empty, two
// capacities used, so it has no room for 10 s (the charge beyond empty
// is owed, weighted.TestChargesAreOwed). Redis then loses its data and
// the ledger's 3,000 tokens restore the meter. A check 1.5 s later must
// still find no room. Before, a restore raised a meter by one capacity
// at most: acme owed nothing after the loss, and 150 tokens' room was
// back 1.5 s later, where it had 10 s more to wait.
func TestOwedLossAtkDebtSurvivesTheLoss(t *testing.T) {
	for _, algo := range []string{"token_bucket", "gcra"} {
		t.Run(algo, func(t *testing.T) {
			e := newEnv(t, fmt.Sprintf(owedConfig, algo), true, rls.Options{})
			tokens := func(n uint64) *commonv3.RateLimitDescriptor {
				return hits(n, d("tenant", "acme", "model", "test-model", "tokens", "output"))
			}
			if r := e.ask(t, "edge", 0, tokens(0)); r.GetOverallCode() != OK {
				t.Fatalf("the check before the stream: %s", codes_(r))
			}
			if r := e.ask(t, "edge", 0, tokens(3000)); r.GetOverallCode() != OK {
				t.Fatalf("the charge of the stream's 3,000 tokens: %s", codes_(r))
			}
			loseRedis(t, e)
			if r := e.ask(t, "edge", 0, tokens(0)); r.GetOverallCode() != OVER {
				t.Fatalf("right after the loss, a check: %s, want OVER_LIMIT", codes_(r))
			}
			time.Sleep(1500 * time.Millisecond) // 150 tokens refilled of the 2,000 owed
			if r := e.ask(t, "edge", 0, tokens(0)); r.GetOverallCode() != OVER {
				t.Fatalf("1.5 s after the loss, acme owing 850 tokens beyond empty: %s, want OVER_LIMIT", codes_(r))
			}
		})
	}
}
