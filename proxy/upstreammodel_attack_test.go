package proxy_test

import (
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestReserveAtkGenericUpstreamMakesTokensFree: a reservation names a
// priced model and the tokens it will use, and beside them a generic
// upstream whose cost rule charges a cent a call. The rule priced the
// whole reservation, and its settlement: a million gpt-4o tokens, $2.50
// at the model's price, reserved and settled for $0.01, their tokens
// recorded in the ledger under gpt-4o at a cent, and a dollar budget
// never saw them. What must hold, as the README says (a generic
// upstream's rule prices units, a model prices tokens): the tokens are
// priced at the model and the units by the rule, at reserve and at
// settle, so that naming an upstream never makes a model's tokens cheaper;
// a failed call is charged its tokens at the model's price and no call.
func TestReserveAtkGenericUpstreamMakesTokensFree(t *testing.T) {
	s := newStackWith(t, stackOptions{policies: allowAll, extra: `
  - name: cheap
    kind: generic
    base_url: http://127.0.0.1:1
    cost:
      unit: credits
      per_call: "0.01"
      per_unit: "0.001"
limits:
  - {name: big, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 1000, period: 1h}
`})
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tokens := costmodel.Usage{InputTokens: 1_000_000}
	rule := costmodel.Price{PerCall: costmodel.Dollar / 100, PerUnit: costmodel.Dollar / 1000}
	for _, c := range []struct {
		name, reserve, settle string
		want                  costmodel.NanoUSD // at settle
		atLeast               costmodel.NanoUSD // at reserve
	}{
		{"tokens of a model", `{"cost":{"tokens":1000000},"model":"gpt-4o","upstream":"cheap"}`,
			`{"usage":{"input_tokens":1000000}}`, rule.Cost(costmodel.Usage{}) + est.Cost("gpt-4o", tokens), est.Cost("gpt-4o", tokens)},
		{"tokens and units", `{"cost":{"tokens":1000000,"units":5},"model":"gpt-4o","upstream":"cheap"}`,
			`{"usage":{"input_tokens":1000000,"units":5}}`, rule.Cost(costmodel.Usage{Units: 5}) + est.Cost("gpt-4o", tokens), est.Cost("gpt-4o", tokens)},
		{"failed: the model's tokens, no call", `{"cost":{"tokens":1000000},"model":"gpt-4o","upstream":"cheap"}`,
			`{"status":"failed","usage":{"input_tokens":1000000,"units":5}}`, est.Cost("gpt-4o", tokens), est.Cost("gpt-4o", tokens)},
		{"an LLM body, settled with counts", `{"kind":"chat_completions","body":{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]},"upstream":"cheap"}`,
			`{"usage":{"input_tokens":1000000}}`, rule.Cost(costmodel.Usage{}) + est.Cost("gpt-4o", tokens), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, r := reserveCall(t, s.srv.Handler(), "cg-test-acme", "/v1/costgate/reserve", c.reserve)
			if code != 200 {
				t.Fatalf("reserve: %d %v", code, r)
			}
			e, _ := r["estimate"].(map[string]any)
			if got := costmodel.NanoUSD(e["cost_nanousd"].(float64)); got < c.atLeast {
				t.Errorf("reserved %v, want at least %v", got, c.atLeast)
			}
			code, r = reserveCall(t, s.srv.Handler(), "cg-test-acme", "/v1/costgate/settle",
				`{"reservation_id":"`+r["reservation_id"].(string)+`",`+c.settle[1:])
			if code != 200 {
				t.Fatalf("settle: %d %v", code, r)
			}
			if got := costmodel.NanoUSD(r["cost_nanousd"].(float64)); got != c.want {
				t.Errorf("settled %v, want %v", got, c.want)
			}
		})
	}
}
