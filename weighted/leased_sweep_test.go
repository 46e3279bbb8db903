package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// sweptStore is a LeaseStore that runs during once, during the first
// call that reports leases done and takes none (a retired state's leases
// going back): what a replica's sweeper does while that call is on its
// way.
type sweptStore struct {
	LeaseStore
	during func()
}

func (s *sweptStore) Lease(ctx context.Context, it Item, c LeaseCall) (ItemState, error) {
	if f := s.during; f != nil && it.Cost == 0 && len(c.Reports) > 0 {
		s.during = nil
		f()
	}
	return s.LeaseStore.Lease(ctx, it, c)
}

// TestLeasedSweptMidRequest: a reload lowers a leased fixed window (100,
// leases of 50, to 20, leases of 10) after 10 were admitted; the key's
// next request returns the old leases, and the sweeper runs while that
// call is on its way: at once (a sweep tick), or after the request has
// stalled for more than ten TTLs (a slow store). The request's new state
// of the key must not be forgotten by the sweeper under it, or, if it is,
// must take no lease into a state no request finds: before, the sweeper
// forgot the state just made (never used yet), the request took a lease
// of 10 into it, spent one, and the key's next request, on a new cold
// state, was refused by the store, which counted the orphan lease's 9
// unspent units: 11 admitted in a window of 20. Both ways, the window
// admits exactly 20, on Memory and Redis.
func TestLeasedSweptMidRequest(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	old := Limit{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: 24 * time.Hour, Lease: Lease{Max: 50, TTL: 2 * time.Second}}
	lowered := old
	lowered.Rate, lowered.Lease.Max = 20, 10
	for _, stall := range []time.Duration{0, 11 * old.Lease.TTL} {
		for _, sn := range []string{"memory", "redis"} {
			t.Run(fmt.Sprint(sn, "/stall=", stall), func(t *testing.T) {
				clk := newClock()
				ss := &sweptStore{LeaseStore: testLeaseStore(c, sn, clk)}
				l := inlineOver(t, ss, clk)
				it := Item{Limit: old, Key: fmt.Sprint("swept-", sn, stall), Cost: 1}
				l.state(&it).rate = 1e9 // hot: leased
				admitted := 0
				for i := range 10 {
					if res, err := l.Debit(ctx, fmt.Sprint("a", i), []Item{it}); err != nil || !res.Allowed {
						t.Fatalf("request %d under the first limit: %+v %v", i, res, err)
					}
					admitted++
				}
				ss.during = func() {
					clk.Advance(stall)
					l.sweepOnce(ctx)
				}
				it.Limit = lowered
				for i := range 30 {
					res, err := l.Debit(ctx, fmt.Sprint("b", i), []Item{it})
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed {
						admitted++
					}
				}
				if ss.during != nil {
					t.Fatal("the old leases were never reported done")
				}
				if admitted != 20 {
					t.Fatalf("admitted %d in the window across the reload, want the new limit, 20 (stats %+v)", admitted, l.Stats())
				}
			})
		}
	}
}
