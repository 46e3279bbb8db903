package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/weighted"
)

// TestRegionReplicasLowerTogether: two replicas of region eu share its
// Redis counter and its row, and each enforces the cap it took at its own
// last rebalance. eu1, idle, lowers eu's cap; eu2, refused at the cap
// (demand), then rebalances and would keep most of it; eu1, at its next rebalance,
// lowers eu's row. Before, the row went down to eu1's own cap in process
// while eu2 still enforced a higher one, its own: us was given the
// difference and spent it, and eu2 spent up to its cap too (global 126 of
// 100). Now
// a lowering is announced in the row, every replica takes it in process
// at its next rebalance, and the row follows once it has stood two
// intervals. Every replica rebalances on schedule here (the bound holds
// for replicas that do); global spend stays within the budget, and us
// gets what eu does not use once the lowering is written.
func TestRegionReplicasLowerTogether(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 100
	const every = 10 * time.Second
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	clock, advance := fakeClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	euMem := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
	usMem := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
	eu1 := newRegionEvery(t, dsn, "eu", euMem, clock, every)
	eu2 := newRegionEvery(t, dsn, "eu", euMem, clock, every)
	us := newRegionEvery(t, dsn, "us", usMem, clock, every)
	spend := func(st weighted.Store, l weighted.Limit, n int) (got int64) {
		for range n {
			if debitOnce(t, st, l, key, 1) {
				got++
			}
		}
		return got
	}
	rebalance := func(rs ...interface{ Rebalance(context.Context) error }) {
		for _, r := range rs {
			if err := r.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Both regions read their caps, half each; us spends its half.
	_ = eu1.Limit(lim, key)
	_ = eu2.Limit(lim, key)
	_ = us.Limit(lim, key)
	usSpent := spend(usMem, us.Limit(lim, key), 50)
	var euSpent int64

	advance(every)
	rebalance(us, eu1) // us reports its demand; eu idle: eu1 lowers eu's cap
	advance(every / 2)
	eu2.Refused(lim, key, 100) // eu2's callers want more
	rebalance(eu2)
	advance(every / 2)
	rebalance(eu1, us) // eu1 again, then us looks for room
	t.Logf("eu1's cap %d, eu2's %d, us's %d", capOf(eu1, lim, key), capOf(eu2, lim, key), capOf(us, lim, key))
	usSpent += spend(usMem, us.Limit(lim, key), 50)
	euSpent += spend(euMem, eu2.Limit(lim, key), 50)
	t.Logf("after eu's lowering: eu spent %d, us %d, global %d of %d", euSpent, usSpent, euSpent+usSpent, budget)
	if g := euSpent + usSpent; g > budget {
		t.Fatalf("global spend %d, above the budget %d (no request overran its estimate)", g, budget)
	}
	// On schedule from here on: eu idle, us busy.
	for range 12 {
		advance(every)
		rebalance(eu1, eu2, us)
		usSpent += spend(usMem, us.Limit(lim, key), 20)
	}
	t.Logf("a minute later: eu spent %d, us %d, global %d of %d", euSpent, usSpent, euSpent+usSpent, budget)
	if g := euSpent + usSpent; g > budget {
		t.Fatalf("global spend %d, above the budget %d", g, budget)
	}
	if usSpent <= 50 {
		t.Fatalf("us spent %d: what eu left never came to it", usSpent)
	}
}

func capOf(rg interface {
	Cap(weighted.Limit, string) (int64, bool)
}, l weighted.Limit, key string) int64 {
	c, _ := rg.Cap(l, key)
	return c
}
