package weighted

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestLeaseStoreExpiry takes a lease on every leasable algorithm, on
// Memory and on a real Redis at the same times, and checks the store's
// rule step by step: the lease is counted spent when taken; a report
// changes nothing counted; one µs before the TTL nothing comes back; at
// the TTL, what was not reported spent comes back; a report that comes
// after that charges what was spent beyond it; a lease reported done
// before its TTL gives back its unspent units at once and nothing later.
func TestLeaseStoreExpiry(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	const ttl = 100 * time.Millisecond
	for _, base := range leaseLimits() {
		t.Run(base.Name, func(t *testing.T) {
			lim := base
			if lim.Algorithm <= GCRA {
				lim.Rate, lim.Period = 1, time.Hour // no refill in the test
			}
			lim.Lease = Lease{Max: lim.Capacity() / 2, TTL: ttl}
			capy := lim.Capacity()
			grant := capy * 2 / 5
			clk := newClock()
			clk.Advance(time.Millisecond)
			stores := []LeaseStore{NewMemory(MemoryConfig{Now: clk.Now}), newRedisStore(c, clk)}
			it := Item{Limit: lim, Key: "{k}"}
			// remaining returns each store's remaining, which must agree.
			remaining := func(step string) int64 {
				t.Helper()
				var got []int64
				for _, s := range stores {
					res, err := s.Peek(ctx, []Item{it})
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, res.Items[0].Remaining)
				}
				if got[0] != got[1] {
					t.Fatalf("%s: Memory has %d remaining, Redis %d", step, got[0], got[1])
				}
				return got[0]
			}
			lease := func(seq uint64, cost int64, reps ...LeaseReport) {
				t.Helper()
				for _, s := range stores {
					one := it
					one.Cost = cost
					st, err := s.Lease(ctx, one, LeaseCall{Prefix: "r0-", Seq: seq, TTL: ttl, Reports: reps})
					if err != nil {
						t.Fatal(err)
					}
					if !st.Allowed {
						t.Fatalf("lease %d of %d refused: %+v", seq, cost, st)
					}
				}
			}
			want := func(step string, n int64) {
				t.Helper()
				if got := remaining(step); got != n {
					t.Fatalf("%s: remaining %d, want %d", step, got, n)
				}
			}
			lease(1, grant)
			want("taken", capy-grant)
			lease(0, 0, LeaseReport{Seq: 1, Used: grant / 4})
			want("reported", capy-grant)
			clk.Advance(ttl - time.Microsecond)
			want("just before the TTL", capy-grant)
			clk.Advance(time.Microsecond)
			want("at the TTL", capy-grant/4)
			lease(0, 0, LeaseReport{Seq: 1, Used: grant / 2, Done: true})
			want("a report after the TTL", capy-grant/2)
			lease(0, 0, LeaseReport{Seq: 1, Used: grant, Done: true})
			want("a report of a lease gone", capy-grant/2)

			lease(2, grant)
			want("second lease", capy-grant/2-grant)
			lease(3, 1, LeaseReport{Seq: 2, Used: 3, Done: true})
			want("done before its TTL", capy-grant/2-3-1)
			clk.Advance(ttl)
			want("after the TTL of a lease done", capy-grant/2-3)
		})
	}
}

// TestLeaseStoreAttacks sends Lease calls that no replica sends: each is
// refused with an error, by both stores, and changes nothing.
func TestLeaseStoreAttacks(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	lim := Limit{Name: "a", Algorithm: FixedWindow, Rate: 100, Period: time.Minute, Lease: Lease{Max: 50}}
	strict := lim
	strict.Lease = Lease{}
	many := make([]LeaseReport, maxLeaseReports+1)
	cases := []struct {
		name string
		it   Item
		c    LeaseCall
	}{
		{"strict limit", Item{Limit: strict, Key: "k", Cost: 1}, LeaseCall{Prefix: "p-", Seq: 1, TTL: time.Second}},
		{"empty prefix", Item{Limit: lim, Key: "k", Cost: 1}, LeaseCall{Seq: 1, TTL: time.Second}},
		{"prefix ending in a digit", Item{Limit: lim, Key: "k", Cost: 1}, LeaseCall{Prefix: "p1", Seq: 1, TTL: time.Second}},
		{"no ttl", Item{Limit: lim, Key: "k", Cost: 1}, LeaseCall{Prefix: "p-", Seq: 1}},
		{"ttl of a day", Item{Limit: lim, Key: "k", Cost: 1}, LeaseCall{Prefix: "p-", Seq: 1, TTL: 24 * time.Hour}},
		{"cost above capacity", Item{Limit: lim, Key: "k", Cost: 101}, LeaseCall{Prefix: "p-", Seq: 1, TTL: time.Second}},
		{"negative cost", Item{Limit: lim, Key: "k", Cost: -1}, LeaseCall{Prefix: "p-", Seq: 1, TTL: time.Second}},
		{"negative used", Item{Limit: lim, Key: "k"}, LeaseCall{Prefix: "p-", TTL: time.Second, Reports: []LeaseReport{{Seq: 1, Used: -5, Done: true}}}},
		{"used above capacity", Item{Limit: lim, Key: "k"}, LeaseCall{Prefix: "p-", TTL: time.Second, Reports: []LeaseReport{{Seq: 1, Used: 1 << 60}}}},
		{"huge sequence", Item{Limit: lim, Key: "k", Cost: 1}, LeaseCall{Prefix: "p-", Seq: 1 << 60, TTL: time.Second}},
		{"too many reports", Item{Limit: lim, Key: "k"}, LeaseCall{Prefix: "p-", TTL: time.Second, Reports: many}},
	}
	for _, s := range []LeaseStore{NewMemory(MemoryConfig{}), newRedisStore(c, nil)} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%T/%s", s, tc.name), func(t *testing.T) {
				if _, err := s.Lease(ctx, tc.it, tc.c); err == nil {
					t.Fatal("accepted")
				}
				res, err := s.Peek(ctx, []Item{{Limit: lim, Key: "k"}})
				if err != nil {
					t.Fatal(err)
				}
				if res.Items[0].Remaining != 100 {
					t.Fatalf("remaining %d after a refused call", res.Items[0].Remaining)
				}
			})
		}
	}
	// A report of a lease the store never gave, or another replica's,
	// changes nothing.
	for _, s := range []LeaseStore{NewMemory(MemoryConfig{}), newRedisStore(c, nil)} {
		it := Item{Limit: lim, Key: "j", Cost: 30}
		if _, err := s.Lease(ctx, it, LeaseCall{Prefix: "a-", Seq: 1, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		it.Cost = 0
		for _, c := range []LeaseCall{
			{Prefix: "b-", TTL: time.Minute, Reports: []LeaseReport{{Seq: 1, Used: 0, Done: true}}},
			{Prefix: "a-", TTL: time.Minute, Reports: []LeaseReport{{Seq: 9, Used: 0, Done: true}}},
		} {
			if _, err := s.Lease(ctx, it, c); err != nil {
				t.Fatal(err)
			}
		}
		res, err := s.Peek(ctx, []Item{it})
		if err != nil {
			t.Fatal(err)
		}
		if res.Items[0].Remaining != 70 {
			t.Fatalf("%T: remaining %d after reports of leases not held, want 70", s, res.Items[0].Remaining)
		}
	}
	if _, err := NewMemory(MemoryConfig{}).Lease(ctx, Item{Limit: strict, Key: "k"}, LeaseCall{}); !errors.Is(err, errBadLease) {
		t.Fatalf("got %v, want errBadLease", err)
	}
}
