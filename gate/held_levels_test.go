package gate_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// oneKeyDirectory is a control plane of tenant acme's keys "cg-dir-key"
// (id k1), whose own level has the budget, and "cg-dir-key2" (id k2),
// whose level has none.
type oneKeyDirectory struct {
	budget *gate.LevelLimit
}

func (d oneKeyDirectory) Lookup(sum [sha256.Size]byte, _ time.Time) (gate.Principal, bool) {
	switch sum {
	case sha256.Sum256([]byte("cg-dir-key")):
		p := gate.Principal{Tenant: "acme", KeyID: "k1", Plan: "small"}
		p.Levels[0] = &gate.Level{Kind: "key", Name: "k1", Limits: []*gate.LevelLimit{d.budget}}
		return p, true
	case sha256.Sum256([]byte("cg-dir-key2")):
		p := gate.Principal{Tenant: "acme", KeyID: "k2", Plan: "small"}
		p.Levels[0] = &gate.Level{Kind: "key", Name: "k2"}
		return p, true
	}
	return gate.Principal{}, false
}

func (d oneKeyDirectory) Budgets(tenant string) []gate.LevelBudget {
	if tenant != "acme" {
		return nil
	}
	return []gate.LevelBudget{{Limit: d.budget, KeyIDs: []string{"k1"}}}
}

func (d oneKeyDirectory) BudgetTenants() []string { return []string{"acme"} }

// TestHeldLevelBudgetSettledOnAnotherReplica: a control-plane key's own
// budget is debited with the rest of a reservation, and its item is in
// the reservation's ticket. A tenant that reserves $0.01 on one replica
// and settles $0.90 on another (any replica behind the load balancer, as
// the README promises: "any replica can settle or release it without a
// lookup") must be charged $0.90 on that budget, as on every other one,
// so that a later reserve of $0.50 is refused (402): $1.00 a day is the
// key's budget.
func TestHeldLevelBudgetSettledOnAnotherReplica(t *testing.T) {
	for _, settler := range []string{"cg-dir-key", "cg-dir-key2"} {
		t.Run(settler, func(t *testing.T) { heldLevelBudgetSettledOnAnotherReplica(t, settler) })
	}
}

// heldLevelBudgetSettledOnAnotherReplica is the test with settler, a key
// of the tenant, settling on the other replica.
func heldLevelBudgetSettledOnAnotherReplica(t *testing.T, settler string) {
	ctx := context.Background()
	srv := redistest.New(t)
	budget, err := gate.CompileLevelLimit(gate.LevelLimitSpec{Name: "key/k1/day", Tenant: "acme", Entity: "k1", ID: "day",
		KeySuffix: "key:k1:day", Budget: true, AmountNano: int64(costmodel.Dollar), Period: "day"})
	if err != nil {
		t.Fatal(err)
	}
	open := func() *gate.Gate {
		g := openGateStore(t, patient(srv), heldLimits)
		g.SetDirectory(oneKeyDirectory{budget: budget})
		return g
	}
	a, b := open(), open()
	ca, cb := a.Identify("cg-dir-key"), b.Identify(settler)
	if ca == nil || cb == nil {
		t.Fatal("the directory's key is unknown")
	}
	res, d := a.Reserve(ctx, &gate.Request{Caller: ca, Route: "/v1/costgate/reserve", Estimate: costmodel.Estimate{Cost: usd("0.01")}})
	if res == nil {
		t.Fatalf("reserve: %+v", d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatal(d)
	}
	id, _ := res.Hold(time.Minute)

	r, _, err := b.Resume(ctx, cb, id)
	if err != nil {
		t.Fatal(err)
	}
	if got, again, err := r.SettleHeld(ctx, gate.Charge{Cost: usd("0.90"), HTTPStatus: 200}); err != nil || again || got.Cost != usd("0.90") {
		t.Fatalf("settle on the other replica: %+v %v %v", got, again, err)
	}

	left := func(g *gate.Gate, c *gate.Caller) int64 {
		_, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x", Check: true, States: true})
		for _, l := range d.Limits {
			if l.Name == "key/k1/day" {
				return l.Remaining
			}
		}
		t.Fatalf("no state of the key's budget: %+v", d.Limits)
		return 0
	}
	if got, want := left(a, ca), int64(usd("0.10")); got != want {
		t.Errorf("the key's budget has %v left after $0.90 settled, want %v", costmodel.NanoUSD(got), costmodel.NanoUSD(want))
	}
	res, d = b.Reserve(ctx, &gate.Request{Caller: b.Identify("cg-dir-key"), Route: "/v1/costgate/reserve", Estimate: costmodel.Estimate{Cost: usd("0.50")}})
	if res != nil {
		res.Cancel(ctx)
		t.Errorf("a reserve of $0.50 after $0.90 of a $1.00 budget was settled: admitted, want 402")
	}
}
