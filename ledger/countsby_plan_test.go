package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// TestCountsByPlan: TotalCountsBy and CountsBy group by the plan each
// entry records of its caller at the decision (Entry.Plan), on both
// stores, so that a limit of some plans is restored from their entries
// only: a tenant moved from free to enterprise has its earlier entries
// in free's group; an entry without a plan is in the group of the empty
// plan. An entry read back keeps its plan.
func TestCountsByPlan(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		reserve := func(id, tenant, plan string) {
			t.Helper()
			countsReserve(ctx, t, l, id, func(e *ledger.Entry) { e.Tenant, e.Plan = tenant, plan })
		}
		reserve("a1", "acme", "free")
		reserve("a2", "acme", "free")
		countsSettle(ctx, t, l, settlement("a2", 1_000)) // a settlement keeps the reservation's plan
		reserve("a3", "acme", "enterprise")
		reserve("g1", "globex", "enterprise")
		reserve("n1", "initech", "")
		flush(t, l)

		from, to := t0.Add(-time.Hour), t0.Add(time.Hour)
		if e, ok, err := l.Lookup(ctx, "a2"); err != nil || !ok || e.Plan != "free" {
			t.Fatalf("a2 read back: %+v, %v, %v; want plan free", e, ok, err)
		}
		var every []ledger.Entry
		for _, tenant := range []string{"acme", "globex", "initech"} {
			every = append(every, all(t, l, ledger.Query{Tenant: tenant, From: from, To: to})...)
		}
		gs, err := l.TotalCountsBy(ctx, ledger.SpendQuery{From: from, To: to}, ledger.GroupBy{Plan: true})
		if err != nil {
			t.Fatal(err)
		}
		got := groupsOf(t, gs)
		if len(got) != 3 || got[ledger.Group{Plan: "free"}].Counts.Requests != 2 ||
			got[ledger.Group{Plan: "enterprise"}].Counts.Requests != 2 || got[ledger.Group{Plan: ""}].Counts.Requests != 1 {
			t.Fatalf("every tenant's groups by plan = %+v; want free 2, enterprise 2, none 1", gs)
		}
		for k, w := range countsByRef(every, ledger.GroupBy{Plan: true}) {
			if got[k] != w {
				t.Errorf("group %+v = %+v; the entries add up to %+v", k, got[k], w)
			}
		}
		gs, err = l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", From: from, To: to}, ledger.GroupBy{Plan: true})
		if got := groupsOf(t, gs); err != nil || len(got) != 2 || got[ledger.Group{Plan: "free"}].Counts.Requests != 2 {
			t.Fatalf("acme's groups by plan = %+v, %v; want free 2 and enterprise 1", gs, err)
		}
	})
}
