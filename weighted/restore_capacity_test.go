package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// faultAtkMeters are the limits whose refunds need no record of the
// debit: a meter refunds whatever a settlement names.
var faultAtkMeters = []Limit{
	{Name: "tb", Algorithm: TokenBucket, Rate: 100, Period: time.Hour},
	{Name: "gcra", Algorithm: GCRA, Rate: 100, Period: time.Hour},
}

// faultAtkAdmit debits cost under id and reports whether it was admitted.
func faultAtkAdmit(t *testing.T, s Store, id string, it Item, cost int64) bool {
	t.Helper()
	it.Cost = cost
	res, err := s.Debit(context.Background(), id, []Item{it})
	if err != nil {
		t.Fatalf("debit %s: %v", id, err)
	}
	return res.Allowed
}

// TestFaultAttackRestoreAboveCapacity: a restore to a spend above the
// capacity (the ledger can hold more than a limit: in-flight overruns),
// on a fresh counter and on one partly used, leaves Memory and Redis in
// the same state, for every algorithm: Memory is the gate's store in a
// Redis outage and its standalone one.
func TestFaultAttackRestoreAboveCapacity(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	limits := append([]Limit{
		{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: time.Hour},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 100, Period: time.Hour},
	}, faultAtkMeters...)
	for _, l := range limits {
		for _, used := range []int64{0, 30} {
			t.Run(fmt.Sprintf("%s/used=%d", l.Name, used), func(t *testing.T) {
				clk := newClock()
				mem := NewMemory(MemoryConfig{Now: clk.Now, Generations: true})
				rs := NewRedis(c, patient(RedisConfig{Prefix: fmt.Sprintf("fr%s%d:", l.Name, used), Generations: true}))
				rs.now = clk.Now
				var got [2]string
				for k, s := range []Store{mem, rs} {
					items := []Item{{Limit: l, Key: "{acme}"}}
					if err := s.(Restorer).Restore(ctx, items, []int64{1}); err != nil {
						t.Fatal(err)
					}
					if used > 0 && !faultAtkAdmit(t, s, "used", items[0], used) {
						t.Fatal("the first debit was refused")
					}
					if err := s.(Restorer).Restore(ctx, items, []int64{2 * l.Capacity()}); err != nil {
						t.Fatal(err)
					}
					// Right away and a period later (a bucket that owed one
					// capacity is full again; one that owed two is empty).
					items[0].Cost = 1
					now, _ := s.Peek(ctx, items)
					clk.Advance(l.Period)
					later, err := s.Peek(ctx, items)
					got[k] = fmt.Sprintf("now %+v, a period later %+v %v", now, later, err)
					clk.Advance(-l.Period)
				}
				if got[0] != got[1] {
					t.Fatalf("restore to %d on %s:\nmemory: %s\nredis:  %s", 2*l.Capacity(), l, got[0], got[1])
				}
			})
		}
	}
}
