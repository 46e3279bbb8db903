package rls_test

import (
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/costgate/costgate/rls"
)

// modelNameConfig holds a domain whose model entry (as: model, often the
// client's own header or body field) leads to a per-model token limit of
// the tenant's (1,000 output tokens a minute), and a block list of one
// model for every tenant (requests_per_unit 0 on its exact value, beside
// an any-value node that limits nothing).
const modelNameConfig = `
admin_token: t
tenants: [{name: acme, plan: free, keys: [{key: k-acme}]}]
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
                - key: tokens
                  value: output
                  hits: output_tokens
                  rate_limit: {name: model-output, unit: minute, requests_per_unit: 1000, algorithm: fixed_window}
        - key: blocked_model
          value: gpt-4o
          as: model
          rate_limit: {name: no-gpt-4o, unit: minute, requests_per_unit: 0}
        - key: blocked_model
          as: model
`

// TestModelNameAtkOtherSpellingsOfOneModel: a model's other spellings
// (its dated snapshot, another case, surrounding space) are the model
// the price table prices and the gate's model limits key: the same
// model, run and billed as it. Read as their bytes, each was a counter of
// its own and missed the exact node of its model: acme, whose gpt-4o
// output tokens were spent, was admitted again on "gpt-4o-2024-08-06"
// and "GPT-4o", and a model every tenant is refused ran under another
// spelling.
func TestModelNameAtkOtherSpellingsOfOneModel(t *testing.T) {
	spellings := []string{"gpt-4o-2024-08-06", "GPT-4o", " gpt-4o", "gpt-4o-2024-11-20"}
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, modelNameConfig, redis, rls.Options{})
		out := func(model string, n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", "acme", "model", model, "tokens", "output"))
		}
		// Phase 2 of a gpt-4o stream: 1,000 output tokens, the minute's.
		if r := e.ask(t, "edge", 0, out("gpt-4o", 1000)); r.GetOverallCode() != OK {
			t.Fatalf("the charge of 1,000 gpt-4o output tokens: %s", codes_(r))
		}
		if r := e.ask(t, "edge", 0, out("gpt-4o", 0)); r.GetOverallCode() != OVER {
			t.Fatalf("phase 1 of gpt-4o after its minute was spent: %s, want OVER_LIMIT", codes_(r))
		}
		for _, m := range spellings {
			if r := e.ask(t, "edge", 0, out(m, 0)); r.GetOverallCode() != OVER {
				t.Errorf("phase 1 of %q, gpt-4o, after gpt-4o's minute was spent: %s, want OVER_LIMIT", m, codes_(r))
			}
		}
		for _, m := range append([]string{"gpt-4o"}, spellings...) {
			if r := e.ask(t, "edge", 1, d("blocked_model", m)); r.GetOverallCode() != OVER {
				t.Errorf("a request of %q, the blocked gpt-4o: %s, want OVER_LIMIT", m, codes_(r))
			}
		}
		if r := e.ask(t, "edge", 1, d("blocked_model", "gpt-4o-mini")); r.GetOverallCode() != OK {
			t.Errorf("a request of gpt-4o-mini, another model: %s, want OK", codes_(r))
		}
	})
}
