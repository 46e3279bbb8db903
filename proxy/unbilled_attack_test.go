package proxy_test

import (
	"fmt"
	"testing"
)

// TestUnbilledAtkSettleOddAmounts: a settlement's amounts in forms a
// lenient parser would read as another number (an exponent, a sign, hex,
// digits of another script, a number as a string, a float for an integer,
// a duplicate member spelled with an escape) are 400 and leave the
// reservation open; the owner then settles it once at what it states
// plainly, and the forms a decimal reader may take (".5", "5.", spaces)
// mean what they say. (An empty "usd" is no amount, as an absent one: the
// reservation's dollars stand; not an attack, so not tried here.)
func TestUnbilledAtkSettleOddAmounts(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		s := newStack(t, url, `
budgets:
  - {name: daily, scope: tenant, amount: "10.00"}
`)
		h := s.srv.Handler()
		const acme = "cg-test-acme"
		id := reserveOn(t, s, acme, `{"cost":{"tokens":100,"usd":"1.00"}}`)
		settle := func(usage string) (int, map[string]any) {
			return reserveCall(t, h, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":%s}`, id, usage))
		}
		for _, usage := range []string{
			`{"usd":"1e-3"}`, `{"usd":"+0.10"}`, `{"usd":"0x10"}`, `{"usd":"\u0661"}`, `{"usd":"0.1.0"}`,
			`{"usd":"0.-1"}`, `{"usd":"0.+1"}`, `{"usd":"1_000"}`, `{"usd":"$-1"}`, `{"usd":"--1"}`, `{"usd":"NaN"}`,
			`{"usd":"Infinity"}`, `{"usd":0.5}`, `{"usd":"."}`, `{"usd":"-"}`,
			`{"tokens":1.0}`, `{"tokens":1e3}`, `{"tokens":"5"}`, `{"tokens":true}`,
			`{"usd":"0.50","\u0075sd":"0"}`, `{"input_tokens":5,"input\u005ftokens":0}`,
			`{"units":9223372036854775808}`,
		} {
			code, out := settle(usage)
			if code == 200 {
				t.Fatalf("usage %s settled: %v (want 400, and the reservation open)", usage, out)
			}
			if code != 400 {
				t.Errorf("usage %s: %d %v, want 400", usage, code, out)
			}
		}
		// ".5" is $0.50 (and "tokens":-0 would be 0 tokens, an integer). The
		// reservation is still open: the first settlement is this one.
		code, out := settle(`{"usd":" .5 "}`)
		if code != 200 || out["cost_usd"] != "0.500000000" || out["already_settled"] != false {
			t.Fatalf("settle at \" .5 \": %d %v, want $0.50, the first settlement", code, out)
		}
	})
}
