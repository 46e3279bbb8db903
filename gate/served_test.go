package gate_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
)

// TestServedIsCountedInDebt: a Served request (usage already served) is
// admitted whatever its limits say, even a token bucket that owes tokens,
// which refuses any debit, holds no concurrency slot, and its settlement
// charges the limits (into debt, one capacity beyond the reservation of
// zero at most) and bills the ledger. A check on the same limits is
// still refused.
func TestServedIsCountedInDebt(t *testing.T) {
	ctx := context.Background()
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
tenants: [{name: acme, plan: small}]
limits:
  - {name: tokens, dimensions: [tenant], unit: input_tokens, rate: 100, period: 1h}
  - {name: slots, dimensions: [tenant], algorithm: concurrency, rate: 1, period: 1m}
costs:
  prices:
    test-model: {input: "1.00", output: "10.00"}
`, t.TempDir()))
	c := g.Trusted("acme", "", "", "")
	held, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x"})
	if held == nil {
		t.Fatalf("holding the slot: %+v", d)
	}
	var total int64
	for i, n := range []int64{150, 50, 50} {
		res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x", NoRequests: true, Served: true,
			Estimate: costmodel.Estimate{Model: "test-model"}})
		if res == nil || !d.Allowed() {
			t.Fatalf("served %d (%d tokens): %+v, want admitted", i, n, d)
		}
		if _, ok := res.Record(ctx); !ok {
			t.Fatalf("served %d: not recorded", i)
		}
		u := costmodel.Usage{InputTokens: n}
		res.Settle(ctx, gate.Charge{Usage: u, Cost: res.Price("test-model", u), HTTPStatus: 200})
		total += n
	}
	held.Cancel(ctx)
	// 150 fills the limit; 100 more are owed: 101 tokens to wait for at
	// 100 an hour.
	_, d = g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x", Check: true})
	if d.Allowed() || d.Status != 429 || d.RetryAfter < 3600 {
		t.Errorf("a check after the served requests: %d, Retry-After %d; want 429 after at least 3600 s", d.Status, d.RetryAfter)
	}
	if err := g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	spent, err := g.Ledger().Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
	if err != nil || int64(spent) != total*1000 {
		t.Errorf("ledger: %d nano-dollars (%v), want %d: %d input tokens at $1/M", spent, err, total*1000, total)
	}
}
