package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestLeasedStrictStatCounted: LeaseStats.Strict is documented as "Debits
// of the store for a leased item's own cost (a cold key)". A cold key's
// request is such a debit.
func TestLeasedStrictStatCounted(t *testing.T) {
	clk := newClock()
	l := inlineOver(t, NewMemory(MemoryConfig{Now: clk.Now}), clk)
	lim := Limit{Name: "b", Algorithm: FixedWindow, Rate: 1000, Period: time.Hour, Lease: Lease{Max: 100}}
	for i := range 3 {
		clk.Advance(time.Second)
		if res, err := l.Debit(context.Background(), fmt.Sprint("r", i), []Item{{Limit: lim, Key: "cold", Cost: 200}}); err != nil || !res.Allowed {
			t.Fatalf("debit: %+v %v", res, err)
		}
	}
	if s := l.Stats(); s.Strict != 3 {
		t.Fatalf("3 strict debits of a leased limit's cold key (above Lease.Max): Stats %+v, want Strict 3", s)
	}
}

// TestLeasedTinyLimits: limits of capacity 1 and 2 leased whole (Max =
// capacity), drained by three replicas: never more than the capacity
// in a window that does not refill, and, once they close, all of it.
func TestLeasedTinyLimits(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, capacity := range []int64{1, 2} {
		for _, base := range leaseLimits() {
			for _, sn := range []string{"memory", "redis"} {
				t.Run(fmt.Sprint(base.Name, "/cap", capacity, "/", sn), func(t *testing.T) {
					lim := base
					lim.Rate, lim.Burst = capacity, 0
					if lim.Algorithm <= GCRA {
						lim.Period = 24 * time.Hour
					} else if lim.Calendar == NoCalendar {
						lim.Period = time.Hour
					}
					lim.Lease = Lease{Max: capacity, TTL: time.Second}
					clk := newClock()
					inner := testLeaseStore(c, sn, clk)
					var reps []*Leased
					for range 3 {
						l := NewLeased(inner, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
						l.inline = true
						reps = append(reps, l)
					}
					var admitted int64
					for i := range 60 {
						clk.Advance(10 * time.Microsecond)
						res, err := reps[i%3].Debit(ctx, fmt.Sprint("r", i), []Item{{Limit: lim, Key: "k", Cost: 1}})
						if err != nil {
							t.Fatal(err)
						}
						if res.Allowed {
							admitted++
						}
					}
					for _, l := range reps {
						if err := l.Close(ctx); err != nil {
							t.Fatal(err)
						}
					}
					if admitted > capacity {
						t.Fatalf("admitted %d, capacity %d", admitted, capacity)
					}
					last := NewLeased(inner, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
					defer last.Close(ctx)
					for i := range 10 {
						res, err := last.Debit(ctx, fmt.Sprint("z", i), []Item{{Limit: lim, Key: "k", Cost: 1}})
						if err != nil {
							t.Fatal(err)
						}
						if res.Allowed {
							admitted++
						}
					}
					if admitted != capacity {
						t.Fatalf("admitted %d in all after the replicas closed, want the capacity %d", admitted, capacity)
					}
				})
			}
		}
	}
}
