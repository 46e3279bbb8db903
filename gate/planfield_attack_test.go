package gate_test

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
)

// planDir is a control plane of one key, cg-odd, of tenant oddco on plan.
type planDir struct{ plan string }

func (d planDir) Lookup(sum [sha256.Size]byte, _ time.Time) (gate.Principal, bool) {
	if sum != sha256.Sum256([]byte("cg-odd")) {
		return gate.Principal{}, false
	}
	return gate.Principal{Tenant: "oddco", KeyID: "key_odd", Plan: d.plan}, true
}
func (planDir) Budgets(string) []gate.LevelBudget { return nil }
func (planDir) BudgetTenants() []string           { return nil }

// TestPlanFieldAtkLongPlanKeepsTheEntry: a tenant's plan the ledger
// cannot store in a field (5,000 bytes, a NUL) must not cost the tenant
// its requests nor a request its ledger entry: the entry records no
// plan, which counts on every limit of some plans, and its spend is
// there. The configuration and the control plane refuse such a plan now,
// but a control plane's database written before holds it still, and any
// Directory may answer one. Before, every request of the tenant was
// refused (400), its entry too long to record, or holding a NUL.
func TestPlanFieldAtkLongPlanKeepsTheEntry(t *testing.T) {
	for name, plan := range map[string]string{
		"5000 bytes": strings.Repeat("p", 5000),
		"nul":        "free\x00x",
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			g := openYAML(t, `
admin_token: t
data_dir: `+t.TempDir()+`
limits:
  - {name: rpm, dimensions: [model], unit: requests, rate: 100, period: 1m}
`)
			g.SetDirectory(planDir{plan})
			c := g.Identify("cg-odd")
			if c.Plan != plan {
				t.Fatalf("the directory's plan is not the caller's: %q", c.Plan)
			}
			res, d := g.Reserve(ctx, &gate.Request{ID: "odd-plan", Caller: c, Route: "/x",
				Estimate: costmodel.Estimate{Model: "gpt-4o-mini", Cost: 7}})
			if res == nil {
				t.Fatalf("refused: %+v", d)
			}
			if d, ok := res.Record(ctx); !ok {
				t.Fatalf("not recorded: %+v", d)
			}
			res.Settle(ctx, gate.Charge{Cost: 9, HTTPStatus: 200})
			if err := g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			e, ok, err := g.Ledger().Lookup(ctx, "odd-plan")
			if err != nil || !ok {
				t.Fatalf("the entry of a tenant of an odd plan: %v %v", ok, err)
			}
			if e.Plan != "" || e.Charge() != 9 {
				t.Errorf("entry plan %d bytes, charge %d; want no plan and 9", len(e.Plan), e.Charge())
			}
		})
	}
}
