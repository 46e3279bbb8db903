package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestLeasedReloadToStrict: a reload that turns a limit's lease policy off
// (the same capacity, now strict). The README: "a reload that changes a
// leased limit (capacity, rate, period, lease policy) ends the leases
// taken under the old one at the key's next request: they go back". So
// once the key is debited under the strict limit, the units the replica
// held unspent are the store's again: the window admits its whole
// capacity.
func TestLeasedReloadToStrict(t *testing.T) {
	ctx := context.Background()
	onLeasedStores(t, false, func(t *testing.T, l *Leased, clk *clock) {
		leased := Limit{Name: "usd", Algorithm: FixedWindow, Rate: 1000, Period: 24 * time.Hour,
			Lease: Lease{Max: 500, TTL: time.Hour}}
		strict := leased
		strict.Lease = Lease{}
		it := Item{Limit: leased, Key: "k", Cost: 10}
		l.state(&it).rate = 1e9 // hot
		if res, err := l.Debit(ctx, "a", []Item{it}); err != nil || !res.Allowed {
			t.Fatalf("debit: %+v %v", res, err)
		}
		admitted := it.Cost
		t.Logf("before the reload: held %d", l.Unspent(it))
		// The reload; the key's requests go on for a minute.
		for i := range 200 {
			clk.Advance(300 * time.Millisecond)
			l.sweepOnce(ctx)
			res, err := l.Debit(ctx, fmt.Sprint("s", i), []Item{{Limit: strict, Key: "k", Cost: 10}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				admitted += 10
			}
		}
		t.Logf("after a minute under the strict limit: admitted %d of 1000; the replica still holds %d of the old lease", admitted, l.Unspent(it))
		if admitted != 1000 {
			t.Fatalf("admitted %d in a window of 1000 after the lease policy was turned off; the old lease's unspent units never went back", admitted)
		}
	})
}
