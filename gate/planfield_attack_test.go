package gate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
)

// TestPlanFieldAtkLongPlanKeepsTheEntry: a tenant's plan of 5,000 bytes,
// longer than the ledger stores in a field (neither the configuration
// nor the control plane checks a plan's length), must not cost the
// tenant its requests nor a request its ledger entry: the entry records
// no plan, which counts on every limit of some plans, and its spend is
// there. Before, every request of the tenant was refused (400), its entry
// too long to record.
func TestPlanFieldAtkLongPlanKeepsTheEntry(t *testing.T) {
	ctx := context.Background()
	plan := strings.Repeat("p", 5000)
	g := openYAML(t, `
admin_token: t
data_dir: `+t.TempDir()+`
tenants:
  - {name: acme, plan: `+plan+`, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: rpm, plans: [`+plan+`], dimensions: [model], unit: requests, rate: 100, period: 1m}
`)
	res, d := g.Reserve(ctx, &gate.Request{ID: "long-plan", Caller: g.Identify("cg-acme"), Route: "/x",
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
	e, ok, err := g.Ledger().Lookup(ctx, "long-plan")
	if err != nil || !ok {
		t.Fatalf("the entry of a tenant of a long plan: %v %v", ok, err)
	}
	if e.Plan != "" || e.Charge() != 9 {
		t.Errorf("entry plan %d bytes, charge %d; want no plan and 9", len(e.Plan), e.Charge())
	}
}
