package weighted

import (
	"context"
	"testing"
	"time"
)

// TestLeasedGiveBack: a reservation spent from this replica's lease and
// ended on another replica (which refunds nothing of a leased item) is
// given back here, once: all of it for a release, what the actual cost
// leaves of the estimate for a settlement, nothing for one above it. A
// reservation this replica does not remember gives nothing.
func TestLeasedGiveBack(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, sn := range []string{"memory", "redis"} {
		for _, tc := range []struct {
			name   string
			actual []int64
			back   int64
		}{{"released", nil, 300}, {"settled low", []int64{50}, 250}, {"settled high", []int64{400}, 0}} {
			t.Run(sn+"/"+tc.name, func(t *testing.T) {
				clk := newClock()
				inner := testLeaseStore(c, sn, clk)
				l := NewLeased(inner, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
				defer l.Close(ctx)
				l.inline = true
				lim := Limit{Name: "usd", Algorithm: FixedWindow, Rate: 10000, Period: 24 * time.Hour,
					Lease: Lease{Max: 1000, TTL: time.Minute}}
				it := Item{Limit: lim, Key: "k", Cost: 300}
				l.state(&it).rate = 1e9 // hot
				if res, err := l.Debit(ctx, "r", []Item{it}); err != nil || !res.Allowed {
					t.Fatalf("debit: %+v %v", res, err)
				}
				if !l.Local("r", 1) {
					t.Fatal("the debit was not spent from a lease")
				}
				before := l.Unspent(it)
				if l.GiveBack("other", []Item{it}, tc.actual) {
					t.Error("gave back a reservation it does not remember")
				}
				if !l.GiveBack("r", []Item{it}, tc.actual) {
					t.Fatal("did not remember its own reservation")
				}
				if l.GiveBack("r", []Item{it}, tc.actual) {
					t.Error("gave back twice")
				}
				if got := l.Unspent(it) - before; got != tc.back {
					t.Errorf("gave back %d, want %d", got, tc.back)
				}
			})
		}
	}
}
