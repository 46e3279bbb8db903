package gate_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/weighted"
)

// TestRegionSyncClock: a region measures its store's clock against its
// host's, on Memory (a store clock off by skew from the host's, both
// ways, up to hours, across a day's end) and on a real Redis (the same
// machine's clock: no offset beyond the round trip).
func TestRegionSyncClock(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	for _, skew := range []time.Duration{0, 15 * time.Minute, -15 * time.Minute, 5*time.Hour + 3*time.Second, -11 * time.Hour} {
		for _, at := range []time.Time{time.Date(2026, 12, 2, 23, 59, 0, 0, time.UTC), time.Date(2026, 12, 3, 0, 1, 0, 0, time.UTC), time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)} {
			store := weighted.NewMemory(weighted.MemoryConfig{Now: func() time.Time { return at.Add(skew) }})
			rg := newRegion(t, dsn, "eu", store, func() time.Time { return at }, "eu", "us")
			for range 2 { // the day's first probe debits, the next peeks
				if err := rg.SyncClock(ctx); err != nil {
					t.Fatal(err)
				}
				if got, want := rg.Info().StoreClockOffsetMS, float64(skew.Milliseconds()); math.Abs(got-want) > 1 {
					t.Fatalf("host at %v, store %v ahead: offset %v ms, want %v", at, skew, got, want)
				}
			}
		}
	}
	c := redistest.New(t).Client(t)
	rg := newRegion(t, dsn, "eu", weighted.NewRedis(c, weighted.RedisConfig{}), time.Now, "eu", "us")
	for range 3 {
		if err := rg.SyncClock(ctx); err != nil {
			t.Fatal(err)
		}
		if got := rg.Info().StoreClockOffsetMS; math.Abs(got) > 100 {
			t.Fatalf("Redis on this host: offset %v ms, want about 0", got)
		}
	}
}

// TestRegionClockAheadCrossesPeriod: a region whose host clock runs a few
// minutes ahead crossed the budget's period boundary before its Redis did
// (the counters' windows follow Redis TIME, the caps' period followed the
// Go clock). It then read a cap in a fresh, empty period, while its
// counter still held its spend of the old one and the other region still
// held its old-period cap: global 150 of 100. The caps' periods now
// follow the store's clock (SyncClock). The README bound is "global spend
// is at most the budget".
func TestRegionClockAheadCrossesPeriod(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 100
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	trueClock, advance := fakeClock(time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC)) // true time
	skew := 15 * time.Minute
	euClock := func() time.Time { return trueClock().Add(skew) }
	names := []string{"eu", "us"}
	// Each region's store keeps true time (Redis TIME); only eu's host clock is off.
	euStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	usStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	eu := newRegion(t, dsn, "eu", euStore, euClock, names...)
	us := newRegion(t, dsn, "us", usStore, trueClock, names...)
	var euSpent, usSpent int64
	spend := func(rg *gate.Regions, st weighted.Store, n int) (got int64) {
		for range n {
			if debitOnce(t, st, rg.Limit(lim, key), key, 1) {
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
		advance(5 * time.Minute)
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

// TestRegionClockSkewPerTrueDay runs two regions through a true midnight
// with eu's host clock off by skew, and counts each true day's spend (the
// stores keep true time): at most the budget each.
func TestRegionClockSkewPerTrueDay(t *testing.T) {
	for _, skew := range []time.Duration{-15 * time.Minute, 15 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			ctx := context.Background()
			dsn := pgtest.New(t)
			const key = "{acme}:tenant=acme"
			const budget = 100
			lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
			trueClock, advance := fakeClock(time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC))
			euClock := func() time.Time { return trueClock().Add(skew) }
			names := []string{"eu", "us"}
			euStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
			usStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
			eu := newRegion(t, dsn, "eu", euStore, euClock, names...)
			us := newRegion(t, dsn, "us", usStore, trueClock, names...)
			perDay := map[int]int64{}
			spend := func(rg *gate.Regions, st weighted.Store, n int) {
				for range n {
					if debitOnce(t, st, rg.Limit(lim, key), key, 1) {
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
				advance(5 * time.Minute)
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
