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
