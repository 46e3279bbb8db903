package gate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/weighted"
)

// TestRegionBudgetLoweredByReload: a reload lowers the budget from 100 to
// 40 before any rebalance: each region scales its cap (50) by 40/100, so
// that together they spend at most the new budget (each enforced min(its
// cap, 40) before: 80 in all).
func TestRegionBudgetLoweredByReload(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: 100, Period: 24 * time.Hour}
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	names := []string{"eu", "us"}
	var global int64
	var seq int
	type region struct {
		rg *gate.Regions
		st weighted.Store
	}
	var rs []region
	for _, n := range names {
		st := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
		rs = append(rs, region{newRegion(t, dsn, n, st, clock, names...), st})
	}
	for _, r := range rs {
		_ = r.rg.Limit(lim, key) // caps read: 50 each
	}
	lowered := lim
	lowered.Rate = 40
	for _, r := range rs {
		for range 100 {
			seq++
			res, err := r.st.Debit(ctx, fmt.Sprint("q", seq), []weighted.Item{{Limit: r.rg.Limit(lowered, key), Key: key, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				global++
			}
		}
	}
	if global > lowered.Rate {
		t.Fatalf("global spend %d after the budget was lowered to %d (nothing spent before the reload)", global, lowered.Rate)
	}
}
