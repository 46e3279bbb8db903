package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// TestCountsByRegion: CountsBy and TotalCountsBy group by the region an
// entry records (the limiter's, which keys a limit by it), on both
// stores, each group with what its entries add up to; a query that names
// a region and groups by it answers that region's group alone.
func TestCountsByRegion(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		reserve := func(id, tenant, user, model, region string) {
			t.Helper()
			countsReserve(ctx, t, l, id, func(e *ledger.Entry) {
				e.Tenant, e.User, e.KeyID, e.Model, e.Region = tenant, user, "k-"+user, model, region
			})
		}
		reserve("e1", "acme", "ann", "gpt-4o", "eu")
		countsSettle(ctx, t, l, settlement("e1", 2_000))
		reserve("e2", "acme", "ann", "gpt-4o", "eu")
		reserve("e3", "acme", "bob", "gpt-4o-mini", "eu")
		reserve("u1", "acme", "ann", "gpt-4o", "us")
		reserve("n1", "acme", "ann", "gpt-4o", "")
		reserve("g1", "globex", "ann", "gpt-4o", "us")
		flush(t, l)

		from, to := t0.Add(-time.Hour), t0.Add(time.Hour)
		acme := all(t, l, ledger.Query{Tenant: "acme", From: from, To: to})
		every := append(all(t, l, ledger.Query{Tenant: "globex", From: from, To: to}), acme...)
		for _, c := range []struct {
			name    string
			total   bool
			region  string
			by      ledger.GroupBy
			entries []ledger.Entry
			groups  int
		}{
			{"tenant and region", false, "", ledger.GroupBy{Region: true}, acme, 3},
			{"user and region", false, "", ledger.GroupBy{User: true, Region: true}, acme, 4},
			{"region and model", false, "", ledger.GroupBy{Region: true, Model: true}, acme, 4},
			{"region and model in eu", false, "eu", ledger.GroupBy{Region: true, Model: true}, acme, 2},
			{"every tenant's by region", true, "", ledger.GroupBy{Region: true}, every, 3},
			{"every tenant's by region and model", true, "", ledger.GroupBy{Region: true, Model: true}, every, 4},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := ledger.SpendQuery{Region: c.region, From: from, To: to}
				var gs []ledger.Group
				var err error
				if c.total {
					gs, err = l.TotalCountsBy(ctx, q, c.by)
				} else {
					q.Tenant = "acme"
					gs, err = l.CountsBy(ctx, q, c.by)
				}
				if err != nil {
					t.Fatal(err)
				}
				sel := inRegion(c.entries, c.region)
				refGroups(t, gs, sel, c.by, c.groups)
			})
		}
	})
}

// TestCountsByRegionWhileTheStoreIsDown: with PostgreSQL stopped,
// CountsBy by region answers from the last read plus this node's records
// spooled since, each in the group of the region it records.
func TestCountsByRegionWhileTheStoreIsDown(t *testing.T) {
	l, pg, ctx := storeDownLedger(t, ledger.Config{})
	reserve := func(id, region string) {
		t.Helper()
		countsReserve(ctx, t, l, id, func(e *ledger.Entry) { e.Region = region })
	}
	month := ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0}
	byRegion := ledger.GroupBy{Region: true}
	reserve("e1", "eu")
	flush(t, l)
	if gs, err := l.CountsBy(ctx, month, byRegion); err != nil || len(gs) != 1 || gs[0].Region != "eu" {
		t.Fatalf("CountsBy before the outage = %+v, %v", gs, err)
	}
	pg.Stop()
	reserve("e2", "eu")
	reserve("u1", "us")
	gs, err := l.CountsBy(ctx, month, byRegion)
	var le *ledger.LocalSpendError
	if !errors.As(err, &le) || le.Unknown {
		t.Fatalf("CountsBy with the store down = %+v, %v; want a *LocalSpendError, the store's part known", gs, err)
	}
	got := groupsOf(t, gs)
	if len(got) != 2 || got[ledger.Group{Region: "eu"}].Counts.Requests != 2 || got[ledger.Group{Region: "eu"}].PendingCounts.Requests != 1 ||
		got[ledger.Group{Region: "us"}].Counts.Requests != 1 || got[ledger.Group{Region: "us"}].PendingCounts.Requests != 1 {
		t.Fatalf("groups with the store down = %+v; want eu 2 (1 pending), us 1 (1 pending)", gs)
	}
	pg.Start()
}
