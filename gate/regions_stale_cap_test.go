package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/weighted"
)

// TestRegionDebitWithStaleCapDuringLowering: a request reads its region's
// cap (gate/pipeline.go builds its items with g.regional, then debits
// them), and its debit lands while a rebalance lowers that cap: after the
// rebalance's second peek, before its row is written. The request is
// debited against the old cap. Before, the row was lowered at once, the
// region spent past it, and the other region was given that spend again
// (global 127 of 100). Now a lowering is announced in the row and
// written there two intervals later.
// Costs here are at their estimates: nothing overruns, and global spend
// stays within the budget.
func TestRegionDebitWithStaleCapDuringLowering(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 100
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	clock, advance := fakeClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	names := []string{"eu", "us"}
	euMem := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
	euStore := &peekHook{Store: euMem, key: key}
	usStore := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
	eu := newRegion(t, dsn, "eu", euStore, clock, names...)
	us := newRegion(t, dsn, "us", usStore, clock, names...)
	var euSpent, usSpent int64
	debit := func(st weighted.Store, l weighted.Limit, cost int64) bool { return debitOnce(t, st, l, key, cost) }
	// Both read their caps: 50 each.
	_ = eu.Limit(lim, key)
	_ = us.Limit(lim, key)
	// us is busy, eu idle: one rebalance round each with us spending.
	for range 3 {
		advance(time.Minute)
		for range 10 {
			if debit(usStore, us.Limit(lim, key), 1) {
				usSpent++
			}
		}
		if err := us.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A request of eu reads the cap it holds now, then its debit is slow.
	stale := eu.Limit(lim, key)
	t.Logf("eu's cap as the request read it: %d", stale.Rate)
	euStore.arm(1, func() {
		// The debit lands after the rebalance's second peek.
		if debit(euMem, stale, 30) {
			euSpent += 30
		}
	})
	if err := eu.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	euCap, _ := eu.Cap(lim, key)
	t.Logf("eu's cap after its rebalance: %d; eu spent %d", euCap, euSpent)
	// us goes on, takes what the rows say is left.
	for range 20 {
		advance(time.Minute)
		if err := us.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		for range 100 { // us's demand exceeds what it holds
			if debit(usStore, us.Limit(lim, key), 1) {
				usSpent++
			}
		}
		if err := eu.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("eu spent %d, us %d, global %d of %d", euSpent, usSpent, euSpent+usSpent, budget)
	if g := euSpent + usSpent; g > budget {
		t.Fatalf("global spend %d, above the budget %d (no request overran its estimate)", g, budget)
	}
}
