package weighted

import (
	"context"
	"testing"
	"time"
)

// TestLeasedColdKeyRefund: on a cold key of a leased limit (no demand yet,
// so the request is debited strictly, as the README says: "a cold one
// none (its requests go to Redis as before)"), a reservation settled once,
// on the replica that debited it, below its estimate must be refunded as
// a strict Settle refunds it: the store then counts the actual cost.
func TestLeasedColdKeyRefund(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, algo := range []Algorithm{FixedWindow, TokenBucket} {
		for _, sn := range []string{"memory", "redis"} {
			t.Run(algo.String()+"/"+sn, func(t *testing.T) {
				clk := newClock()
				inner := testLeaseStore(c, sn, clk)
				l := inlineOver(t, inner, clk)
				lim := Limit{Name: "usd", Algorithm: algo, Rate: 1000, Period: 24 * time.Hour,
					Lease: Lease{Max: 100, TTL: 2 * time.Second}}
				if algo == TokenBucket {
					lim.Rate, lim.Burst = 1, 1000
				}
				it := Item{Limit: lim, Key: "cold", Cost: 500}
				res, err := l.Debit(ctx, "r", []Item{it})
				if err != nil || !res.Allowed {
					t.Fatalf("debit: %+v %v", res, err)
				}
				if err := l.Settle(ctx, "r", []Item{it}, []int64{10}); err != nil {
					t.Fatal(err)
				}
				left, err := inner.Peek(ctx, []Item{it})
				if err != nil {
					t.Fatal(err)
				}
				counted := lim.Capacity() - left.Items[0].Remaining
				t.Logf("stats %+v; estimate 500, settled 10, the store counts %d", l.Stats(), counted)
				// And a cancel: another cold reservation, cancelled.
				it2 := it
				it2.Key = "cold2"
				if res, err := l.Debit(ctx, "r2", []Item{it2}); err != nil || !res.Allowed {
					t.Fatalf("debit: %+v %v", res, err)
				}
				if err := l.Cancel(ctx, "r2", []Item{it2}); err != nil {
					t.Fatal(err)
				}
				left2, err := inner.Peek(ctx, []Item{it2})
				if err != nil {
					t.Fatal(err)
				}
				counted2 := lim.Capacity() - left2.Items[0].Remaining
				t.Logf("a cold reservation of 500 cancelled: the store counts %d", counted2)
				if counted != 10 || counted2 != 0 {
					t.Fatalf("strict debits of 500 on a cold key, on the replica that debited them: settled at 10, the store counts %d (want 10); cancelled, it counts %d (want 0)", counted, counted2)
				}
			})
		}
	}
}
