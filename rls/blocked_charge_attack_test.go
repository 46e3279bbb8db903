package rls_test

import (
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/costgate/costgate/rls"
)

// blockedChargeConfig is testConfig with a model an operator has blocked
// for every tenant: its output tokens' descriptor has a limit of 0.
const blockedChargeConfig = testConfig + `
    - domain: blocking
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - key: model
              as: model
              descriptors:
                - {key: tokens, value: output, hits: output_tokens}
            - key: model
              value: test-model
              as: model
              descriptors:
                - key: tokens
                  value: output
                  hits: output_tokens
                  rate_limit: {name: test-model-blocked, unit: minute, requests_per_unit: 0}
`

// TestRLSAtkBlockedChargeIsBilled: a limit of 0 refuses every request
// that matches it, but usage already served is charged whatever its
// limits say. A charge whose own descriptor carries a limit of 0 (the
// operator blocked the model while streams were running, or Envoy sent
// an override of 0 with the stream-done call) was dropped whole: 900
// output tokens served, none counted on the tenant's plan, none billed.
// It is charged as any other charge, and its answer is OK; a check of
// the same descriptor is still refused.
func TestRLSAtkBlockedChargeIsBilled(t *testing.T) {
	for _, tc := range []struct {
		name   string
		domain string
		desc   func(n uint64) *commonv3.RateLimitDescriptor
	}{
		{"configured limit of 0", "blocking", func(n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", "acme", "model", "test-model", "tokens", "output"))
		}},
		{"override of 0", "edge", func(n uint64) *commonv3.RateLimitDescriptor {
			return overridden(hits(n, d("tenant", "acme", "model", "test-model", "tokens", "output")), 0, typev3.RateLimitUnit_SECOND)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stores(t, func(t *testing.T, redis bool) {
				e := newEnv(t, blockedChargeConfig, redis, rls.Options{})
				if got := codes_(e.ask(t, tc.domain, 0, tc.desc(0))); got != "OVER_LIMIT OVER_LIMIT" {
					t.Errorf("a check of the blocked descriptor: %s, want OVER_LIMIT", got)
				}
				// 900 output tokens served, at $10/M: $0.009; the plan's
				// free-tokens holds 1,000 a minute.
				resp := e.ask(t, tc.domain, 0, tc.desc(900))
				if resp.GetOverallCode() != OK {
					t.Errorf("the charge: %s %s, want OK (usage served is never refused)", codes_(resp), resp.GetRawBody())
				}
				if got := e.spentOf(t, "acme"); got != 9_000_000 {
					t.Errorf("acme is billed %d nano-dollars for 900 output tokens served, want 9000000", got)
				}
				resp = e.ask(t, "edge", 0, hits(200, d("tenant", "acme", "model", "test-model", "tokens", "input")))
				if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "free-tokens" || st.GetLimitRemaining() > 0 {
					t.Errorf("acme's free-tokens after 900 and 200 tokens charged: %v, want spent", st)
				}
				if strings.Contains(codes_(resp), "OVER") {
					t.Errorf("a charge after the blocked one: %s", codes_(resp))
				}
			})
		})
	}
}
