package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestLeasedRefundAfterRefill: a hot token bucket (burst 100, 100/s,
// leases of at most 50) is drained from leases on one replica; the
// reservations (five rounds of them, 2 s apart) are settled at a tenth of
// their estimate 5 s later, when
// the bucket has long refilled. Strictly, those refunds fall into a full
// bucket and are clamped away. The stated bound for a meter over any
// interval is the strict allowance plus R × Lease.Max (R = 1 here): over
// the instant after the refunds, burst + 50 = 150.
func TestLeasedRefundAfterRefill(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingLog} {
		for _, sn := range []string{"memory", "redis"} {
			for _, max := range []int64{0, 50} {
				t.Run(fmt.Sprint(algo, "/", sn, "/max", max), func(t *testing.T) {
					clk := newClock()
					l := inlineLeased(t, c, sn, clk)
					lim := Limit{Name: "tb", Algorithm: algo, Rate: 100, Period: time.Second, Burst: 100,
						Lease: Lease{Max: max, TTL: time.Minute}}
					it := Item{Limit: lim, Key: "k", Cost: 10}
					if max > 0 {
						l.state(&it).rate = 1e9 // hot
					}
					// Five rounds, 2 s apart: each drains the refilled bucket
					// with long requests (streams) that stay open.
					var ids []string
					for round := range 5 {
						clk.Advance(2 * time.Second)
						for i := range 40 {
							clk.Advance(time.Microsecond)
							id := fmt.Sprint("r", round, "-", i)
							res, err := l.Debit(ctx, id, []Item{it})
							if err != nil {
								t.Fatal(err)
							}
							if res.Allowed {
								ids = append(ids, id)
							}
						}
					}
					t.Logf("admitted %d requests of 10 in 5 rounds", len(ids))
					// The bucket refills whole; leases live 30 s on the replica.
					clk.Advance(10 * time.Second)
					for _, id := range ids {
						if err := l.Settle(ctx, id, []Item{it}, []int64{1}); err != nil {
							t.Fatal(err)
						}
					}
					// Now, in one instant, drain the key.
					admitted := admits(t, l, "d", it, 100)
					bound := lim.Capacity() + lim.Lease.Max
					t.Logf("admitted %d in one instant after the refunds; strict %d, stated bound %d", admitted, lim.Capacity(), bound)
					if admitted > bound {
						t.Fatalf("admitted %d in one instant, above the stated bound burst+R×Max = %d (strictly %d)", admitted, bound, lim.Capacity())
					}
				})
			}
		}
	}
}
