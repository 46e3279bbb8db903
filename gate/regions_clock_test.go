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
	// Both regions spend in day 2026-12-02 (true time), 23:00 to 23:50.
	perDay := skewedRegions(t, 15*time.Minute, 11)
	t.Logf("eu 15 min ahead, until 23:55: spend per true day %v", perDay)
	if len(perDay) != 1 || perDay[2] > skewBudget {
		t.Fatalf("spend per true day %v, want day 2 only, at most the budget %d", perDay, skewBudget)
	}
}

// TestRegionClockSkewPerTrueDay runs two regions through a true midnight
// with eu's host clock off by skew, and counts each true day's spend (the
// stores keep true time): at most the budget each.
func TestRegionClockSkewPerTrueDay(t *testing.T) {
	for _, skew := range []time.Duration{-15 * time.Minute, 15 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			perDay := skewedRegions(t, skew, 24) // 23:00 .. 00:55
			t.Logf("skew %v: spend per true day %v", skew, perDay)
			for d, s := range perDay {
				if s > skewBudget {
					t.Errorf("true day %d: global spend %d, above the budget %d", d, s, skewBudget)
				}
			}
		})
	}
}

const skewBudget = 100

// skewedRegions runs regions eu and us from 23:00 true time on 2026-12-02,
// eu's host clock off by skew, their stores on true time (Redis TIME):
// rounds of five minutes in which each rebalances and then asks for 10
// units of a daily budget of skewBudget (demand above it). It returns what
// was admitted, by true day of the month.
func skewedRegions(t *testing.T, skew time.Duration, rounds int) map[int]int64 {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: skewBudget, Period: 24 * time.Hour}
	trueClock, advance := fakeClock(time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC))
	euClock := func() time.Time { return trueClock().Add(skew) }
	euStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	usStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	eu := newRegion(t, dsn, "eu", euStore, euClock)
	us := newRegion(t, dsn, "us", usStore, trueClock)
	perDay := map[int]int64{}
	spend := func(rg *gate.Regions, st weighted.Store) {
		for range 10 {
			if debitOnce(t, st, rg.Limit(lim, key), key, 1) {
				perDay[trueClock().Day()]++
			}
		}
	}
	for range rounds {
		for _, rg := range []*gate.Regions{eu, us} {
			if err := rg.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
		}
		spend(eu, euStore)
		spend(us, usStore)
		advance(5 * time.Minute)
	}
	return perDay
}
