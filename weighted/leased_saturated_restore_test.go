package weighted

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// TestLeasedRestoreSaturatedCount: a restore of a leased key to a count
// the ledger saturated (its sums stop at math.MaxInt64) while this
// replica holds a lease unspent. The count is above the capacity, so no
// room is left: the restore succeeds, the lease is cut whole and the key
// admits nothing more. The lease may hold more than the capacity the
// restore names (taken under a larger one before a reload): the count
// less the room, or the count plus the lease, then overflows, and a wrong
// sign either fails the restore (a negative count) or leaves the lease
// with a negative use that gives back more than it ever took. A count
// below the capacity, for contrast, cuts the lease to the room left.
func TestLeasedRestoreSaturatedCount(t *testing.T) {
	ctx := context.Background()
	// limit is a leased limit of the capacity, leases of half of it.
	limit := func(algo Algorithm, capacity int64) Limit {
		return Limit{Name: "usd", Algorithm: algo, Rate: capacity, Period: time.Hour,
			Lease: Lease{Max: capacity / 2, TTL: time.Hour}}
	}
	for _, algo := range []Algorithm{FixedWindow, TokenBucket, SlidingLog} {
		for _, tc := range []struct {
			name     string
			taken    int64 // the capacity the lease was taken under
			restored int64 // the capacity the restore names
			counted  int64
			room     int64 // what the key admits after the restore
		}{
			{"saturated", 1000, 1000, math.MaxInt64, 0},
			{"one below saturation", 1000, 1000, math.MaxInt64 - 1, 0},
			{"three below the capacity", 1000, 1000, 997, 3},
			{"saturated after a reload to less than the lease", 1000, 100, math.MaxInt64, 0},
			{"one below saturation after a reload to less than the lease", 1000, 100, math.MaxInt64 - 1, 0},
		} {
			t.Run(fmt.Sprintf("%s/%s", algo, tc.name), func(t *testing.T) {
				onLeasedStores(t, true, func(t *testing.T, l *Leased, clk *clock) {
					taken := Item{Limit: limit(algo, tc.taken), Key: "{t}:k", Cost: 1}
					l.state(&taken).rate = 1e9 // hot: the first debit takes a lease
					if err := l.Restore(ctx, []Item{taken}, []int64{0}); err != nil {
						t.Fatal(err)
					}
					if res, err := l.Debit(ctx, "first", []Item{taken}); err != nil || !res.Allowed {
						t.Fatalf("first debit: %+v %v", res, err)
					}
					held := l.Unspent(taken)
					if held <= tc.room {
						t.Fatalf("held %d after the first debit, want more than %d for the cut to show", held, tc.room)
					}
					it := Item{Limit: limit(algo, tc.restored), Key: taken.Key, Cost: 1}
					if err := l.Restore(ctx, []Item{it}, []int64{tc.counted}); err != nil {
						t.Fatalf("restore of %s to %d with %d held: %v", it.Limit, tc.counted, held, err)
					}
					if got := l.Unspent(it); got != tc.room {
						t.Fatalf("held %d after a restore of %s to %d, want %d", got, it.Limit, tc.counted, tc.room)
					}
					admitted := int64(0)
					for i := range it.Limit.Capacity() + 1 {
						res, err := l.Debit(ctx, fmt.Sprint("after-", i), []Item{it})
						if err != nil {
							t.Fatal(err)
						}
						if !res.Allowed {
							break
						}
						admitted++
					}
					if admitted != tc.room {
						t.Fatalf("admitted %d after a restore of %s to %d, want %d", admitted, it.Limit, tc.counted, tc.room)
					}
				})
			})
		}
	}
}
