package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestLeasedCloseChargesDebt: a reservation spent from a lease is settled
// above its estimate, beyond what the replica's leases hold: the rest is
// a debt, to be paid from the next lease or charged to the store after a
// TTL. The replica is then closed (a rolling deploy) before either. The
// store must count the whole settled cost, as a strict Settle would:
// otherwise another replica admits beyond the window's capacity.
func TestLeasedCloseChargesDebt(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, sn := range []string{"memory", "redis"} {
		t.Run(sn, func(t *testing.T) {
			clk := newClock()
			inner := testLeaseStore(c, sn, clk)
			l := NewLeased(inner, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
			l.inline = true
			lim := Limit{Name: "usd", Algorithm: FixedWindow, Rate: 1000, Period: 24 * time.Hour,
				Lease: Lease{Max: 100, TTL: 2 * time.Second}}
			it := Item{Limit: lim, Key: "k", Cost: 10}
			l.state(&it).rate = 1e9 // hot
			if res, err := l.Debit(ctx, "r", []Item{it}); err != nil || !res.Allowed {
				t.Fatalf("debit: %+v %v", res, err)
			}
			clk.Advance(time.Millisecond)
			if err := l.Settle(ctx, "r", []Item{it}, []int64{600}); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Millisecond)
			t.Logf("before Close: %+v, held %d", l.Stats(), l.Unspent(it))
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
			left, err := inner.Peek(ctx, []Item{it})
			if err != nil {
				t.Fatal(err)
			}
			counted := lim.Rate - left.Items[0].Remaining
			// Another replica drains what the store says is left.
			other := NewLeased(inner, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
			defer other.Close(ctx)
			one := it
			one.Cost = 1
			more := admits(t, other, "o", one, 2000)
			t.Logf("settled 600; the store counts %d after Close; another replica then admits %d more", counted, more)
			if l.Stats().Local == 0 || counted != 600 || 600+more > lim.Rate {
				t.Fatalf("a settled cost of 600 is counted %d by the store after Close; the window admits %d in all, capacity %d", counted, 600+more, lim.Rate)
			}
		})
	}
}

// TestLeasedDebtChargedBySweep: the debt of a settlement above its
// estimate that the leases could not pay is charged to the store by the
// sweeper a TTL later, when no lease is held, on every algorithm.
func TestLeasedDebtChargedBySweep(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, base := range unrefilled(1000, 100) {
		for _, sn := range []string{"memory", "redis"} {
			t.Run(base.Name+"/"+sn, func(t *testing.T) {
				clk := newClock()
				inner := testLeaseStore(c, sn, clk)
				l := inlineOver(t, inner, clk)
				it := Item{Limit: base, Key: "k", Cost: 10}
				l.state(&it).rate = 1e9 // hot
				if res, err := l.Debit(ctx, "r", []Item{it}); err != nil || !res.Allowed {
					t.Fatalf("debit: %+v %v", res, err)
				}
				if err := l.Settle(ctx, "r", []Item{it}, []int64{600}); err != nil {
					t.Fatal(err)
				}
				for range 5 {
					clk.Advance(base.Lease.Life())
					l.sweepOnce(ctx)
				}
				left, err := inner.Peek(ctx, []Item{it})
				if err != nil {
					t.Fatal(err)
				}
				if counted := 1000 - left.Items[0].Remaining; counted != 600 {
					t.Fatalf("settled 600; after the sweeps the store counts %d", counted)
				}
			})
		}
	}
}

// TestLeasedDebtIsBounded: settlements above their estimates that the
// leases cannot pay pile up as a debt. Each Settle is clamped to the
// estimate plus the capacity, but their sum is not: with the largest
// capacity Validate allows (2^50 units, about 1.1 M$ in nano-dollars),
// 8192 such settles within a TTL overflow the int64 debt. Strictly, the
// store clamps what it counts (a window at its capacity): the key is
// spent, and stays spent for the window.
func TestLeasedDebtIsBounded(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, sn := range []string{"memory", "redis"} {
		t.Run(sn, func(t *testing.T) {
			clk := newClock()
			inner := testLeaseStore(c, sn, clk)
			l := inlineOver(t, inner, clk)
			const capacity = int64(1) << 50
			lim := Limit{Name: "usd", Algorithm: FixedWindow, Rate: capacity, Period: 24 * time.Hour,
				Lease: Lease{Max: 1 << 20, TTL: time.Minute}}
			if err := lim.Validate(); err != nil {
				t.Fatal(err)
			}
			it := Item{Limit: lim, Key: "k", Cost: 1}
			l.state(&it).rate = 1e12 // hot
			const n = 8200
			for i := range n {
				if res, err := l.Debit(ctx, fmt.Sprint("r", i), []Item{it}); err != nil || !res.Allowed {
					t.Fatalf("debit %d: %+v %v", i, res, err)
				}
			}
			for i := range n {
				if err := l.Settle(ctx, fmt.Sprint("r", i), []Item{it}, []int64{capacity + 1}); err != nil {
					t.Fatal(err)
				}
			}
			st := l.known(&it)
			st.mu.Lock()
			debt := st.debt
			st.mu.Unlock()
			t.Logf("debt after %d settles of the whole capacity: %d; held %d", n, debt, l.Unspent(it))
			// The key is spent: strictly, the store would count the whole
			// capacity (clamped) and refuse everything in the window.
			admitted := admits(t, l, "after", it, 100)
			if debt < 0 || admitted > 0 {
				t.Fatalf("debt %d (overflowed: %t); %d of 100 admitted after the key was settled far past its capacity", debt, debt < 0, admitted)
			}
		})
	}
}

// admits debits it n times on s, under ids prefix0 to prefixN-1, and
// returns the units admitted.
func admits(t *testing.T, s Store, prefix string, it Item, n int) int64 {
	t.Helper()
	var units int64
	for i := range n {
		res, err := s.Debit(context.Background(), fmt.Sprint(prefix, i), []Item{it})
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			units += it.Cost
		}
	}
	return units
}
