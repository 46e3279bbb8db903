//go:build knownbugs

// Known bugs of multi-region budgets, open: each test fails today and
// shows one way global spend exceeds the README's bound (see the README,
// "Multi-region budgets", known limits). They stay out of the suite until
// fixed: go test -tags knownbugs -run TestAttackRegion ./gate/

package gate_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/weighted"
)

// A region whose host clock runs a few minutes ahead crosses the budget's
// period boundary before its Redis does (the counters' windows follow
// Redis TIME, the caps' period follows the Go clock). It then reads a cap
// in a fresh, empty period, while its counter still holds its spend of the
// old one and the other region still holds its old-period cap. The README
// bound is "global spend is at most the budget".
func TestAttackRegionClockAheadCrossesPeriod(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 100
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	var mu sync.Mutex
	now := time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC) // true time
	trueClock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	skew := 15 * time.Minute
	euClock := func() time.Time { return trueClock().Add(skew) }
	names := []string{"eu", "us"}
	// Each region's store keeps true time (Redis TIME); only eu's host clock is off.
	euStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	usStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	eu := newRegion(t, dsn, "eu", euStore, euClock, names...)
	us := newRegion(t, dsn, "us", usStore, trueClock, names...)
	var seq int
	var euSpent, usSpent int64
	spend := func(rg *gate.Regions, st weighted.Store, n int) (got int64) {
		for range n {
			seq++
			l := rg.Limit(lim, key)
			res, err := st.Debit(ctx, fmt.Sprint("q", seq), []weighted.Item{{Limit: l, Key: key, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				got++
			}
		}
		return got
	}
	// Both regions spend in day 2026-12-02 (true time), rebalancing every
	// five minutes, demand above the budget.
	for range 11 { // 23:00 .. 23:50
		if err := eu.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		if err := us.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		euSpent += spend(eu, euStore, 10)
		usSpent += spend(us, usStore, 10)
		mu.Lock()
		now = now.Add(5 * time.Minute)
		mu.Unlock()
	}
	// True time 23:55 of day 2; everything above was spent in day 2.
	if d := trueClock(); d.Day() != 2 {
		t.Fatalf("true day %v", d)
	}
	t.Logf("true %v: eu spent %d, us %d, global %d of %d", trueClock().Format(time.TimeOnly), euSpent, usSpent, euSpent+usSpent, budget)
	if g := euSpent + usSpent; g > budget {
		t.Fatalf("global spend %d in one true day, above the budget %d", g, budget)
	}
}

// rebalanceHook runs after once, right after the second Peek it sees
// since armed: the lowering path of a rebalance peeks twice.
type rebalanceHook struct {
	weighted.Store
	peeks atomic.Int64
	mu    sync.Mutex
	after func()
}

func (p *rebalanceHook) Peek(ctx context.Context, items []weighted.Item) (weighted.Result, error) {
	res, err := p.Store.Peek(ctx, items)
	if p.peeks.Add(1) == 2 {
		p.mu.Lock()
		f := p.after
		p.after = nil
		p.mu.Unlock()
		if f != nil {
			f()
		}
	}
	return res, err
}

// A request reads its region's cap (gate/pipeline.go builds its items with
// g.regional, then debits them), and its debit lands while a rebalance
// lowers that cap: after the rebalance's second peek, before its row is
// written. The request is debited against the old cap, so the region
// spends past the row it wrote, and the other region is given that spend
// again. Costs here are at their estimates: nothing overruns.
func TestAttackRegionDebitWithStaleCapDuringLowering(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 100
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	var mu sync.Mutex
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	names := []string{"eu", "us"}
	euMem := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
	euStore := &rebalanceHook{Store: euMem}
	usStore := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
	eu := newRegion(t, dsn, "eu", euStore, clock, names...)
	us := newRegion(t, dsn, "us", usStore, clock, names...)
	var seq int
	var euSpent, usSpent int64
	debit := func(st weighted.Store, l weighted.Limit, cost int64) bool {
		seq++
		res, err := st.Debit(ctx, fmt.Sprint("q", seq), []weighted.Item{{Limit: l, Key: key, Cost: cost}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Allowed
	}
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
	euStore.peeks.Store(0)
	euStore.mu.Lock()
	euStore.after = func() {
		// The debit lands after the rebalance's second peek.
		if debit(euMem, stale, 30) {
			euSpent += 30
		}
	}
	euStore.mu.Unlock()
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

// TestAttackRegionClockSkewPerTrueDay runs two regions through a true
// midnight with eu's host clock off by skew, and counts each true day's
// spend (the stores keep true time).
func TestAttackRegionClockSkewPerTrueDay(t *testing.T) {
	for _, skew := range []time.Duration{-15 * time.Minute, 15 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			ctx := context.Background()
			dsn := pgtest.New(t)
			const key = "{acme}:tenant=acme"
			const budget = 100
			lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
			var mu sync.Mutex
			now := time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC)
			trueClock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			euClock := func() time.Time { return trueClock().Add(skew) }
			names := []string{"eu", "us"}
			euStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
			usStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
			eu := newRegion(t, dsn, "eu", euStore, euClock, names...)
			us := newRegion(t, dsn, "us", usStore, trueClock, names...)
			perDay := map[int]int64{}
			var seq int
			spend := func(rg *gate.Regions, st weighted.Store, n int) {
				for range n {
					seq++
					l := rg.Limit(lim, key)
					res, err := st.Debit(ctx, fmt.Sprint("q", seq), []weighted.Item{{Limit: l, Key: key, Cost: 1}})
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed {
						perDay[trueClock().Day()]++
					}
				}
			}
			for range 24 { // 23:00 .. 00:55, every 5 minutes
				if err := eu.Rebalance(ctx); err != nil {
					t.Fatal(err)
				}
				if err := us.Rebalance(ctx); err != nil {
					t.Fatal(err)
				}
				spend(eu, euStore, 10)
				spend(us, usStore, 10)
				mu.Lock()
				now = now.Add(5 * time.Minute)
				mu.Unlock()
			}
			t.Logf("skew %v: spend per true day %v", skew, perDay)
			for d, s := range perDay {
				if s > budget {
					t.Errorf("true day %d: global spend %d, above the budget %d", d, s, budget)
				}
			}
		})
	}
}
