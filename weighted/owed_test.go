package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestChargesAreOwed attacks a meter with costs reserved low and settled
// high (a stream reserved at 1 token that used 10; Envoy's two phases: a
// check, then the actual tokens): what a settlement charges beyond empty
// is owed, so over a long run the actual spend stays within the limit's
// rate plus two capacities, on both stores. A meter that forgave the
// charge beyond empty would admit one request per unit refilled, each
// spending ten.
func TestChargesAreOwed(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, algo := range []Algorithm{TokenBucket, GCRA} {
		for _, s := range bothStores(c, newClock()) {
			t.Run(fmt.Sprintf("%s/%s", algo, s.name), func(t *testing.T) {
				clk := newClock()
				if r, ok := s.Store.(*Redis); ok {
					r.now = clk.Now
				} else {
					s.Store = NewMemory(MemoryConfig{Now: clk.Now})
				}
				l := Limit{Name: "tokens", Algorithm: algo, Rate: 10, Period: time.Second, Burst: 10}
				const run = 20 * time.Second
				var spent int64
				for i := 0; clk.Now().Sub(start) < run; i++ {
					id := fmt.Sprint("r", i)
					items := []Item{{Limit: l, Key: "k:" + algo.String(), Cost: 1}}
					res, err := s.Debit(ctx, id, items)
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed {
						if err := s.Settle(ctx, id, items, []int64{10}); err != nil {
							t.Fatal(err)
						}
						spent += 10
					}
					clk.Advance(10 * time.Millisecond)
				}
				// 20 s at 10/s, plus the burst and one capacity owed.
				if most := int64(run/time.Second)*l.Rate + 2*l.Burst; spent > most {
					t.Fatalf("spent %d in %s, more than %d", spent, run, most)
				}
				if spent < int64(run/time.Second)*l.Rate-l.Burst {
					t.Fatalf("spent %d in %s: the debt is not paid back at the rate", spent, run)
				}
			})
		}
	}
}
