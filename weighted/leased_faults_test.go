package weighted

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
)

// TestLeasedLimitChange changes a leased limit under a replica that holds
// a lease of it, as a config reload does: the new limit is debited under
// its own capacity, never under the old one's, and a lowered capacity
// admits in the window no more than it (the old lease's units it had not
// spent go back).
func TestLeasedLimitChange(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	olds := []Limit{
		{Name: "tb", Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: 1000},
		{Name: "gcra", Algorithm: GCRA, Rate: 1, Period: time.Hour, Burst: 1000},
		{Name: "fw", Algorithm: FixedWindow, Rate: 1000, Period: time.Hour},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 1000, Period: time.Hour},
		{Name: "log", Algorithm: SlidingLog, Rate: 1000, Period: time.Hour},
		{Name: "month", Algorithm: FixedWindow, Calendar: Month, Rate: 1000},
	}
	for _, old := range olds {
		for _, sn := range []string{"memory", "redis"} {
			t.Run(old.Name+"/"+sn, func(t *testing.T) {
				clk := newClock()
				l := inlineLeased(t, c, sn, clk)
				old.Lease = Lease{Max: 100, TTL: time.Minute}
				lowered := old
				if lowered.Burst > 0 {
					lowered.Burst = 100
				} else {
					lowered.Rate = 100
				}
				lowered.Lease = Lease{Max: 10, TTL: time.Minute}
				st := l.state(&Item{Limit: old, Key: "k"})
				st.rate = 1e9 // hot
				var admitted int64
				for i := range 10 {
					clk.Advance(time.Microsecond)
					res, err := l.Debit(ctx, fmt.Sprint("a", i), []Item{{Limit: old, Key: "k", Cost: 1}})
					if err != nil || !res.Allowed {
						t.Fatalf("debit %d under the old limit: %+v %v", i, res, err)
					}
					admitted++
				}
				if l.Stats().Acquired == 0 {
					t.Fatalf("no lease taken: %+v", l.Stats())
				}
				for i := range 500 {
					clk.Advance(time.Microsecond)
					res, err := l.Debit(ctx, fmt.Sprint("b", i), []Item{{Limit: lowered, Key: "k", Cost: 1}})
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed {
						admitted++
					}
					if res.Items[0].Capacity != 100 {
						t.Fatalf("debit %d under the lowered limit: capacity %d, want 100", i, res.Items[0].Capacity)
					}
				}
				if admitted > 100 {
					t.Fatalf("admitted %d in all after the capacity was lowered to 100", admitted)
				}
				if admitted < 100-lowered.Lease.Max {
					t.Fatalf("admitted %d in all, want at least %d: the old lease's unspent units must go back", admitted, 100-lowered.Lease.Max)
				}
			})
		}
	}
}

// TestLeasedRefundStaysInItsWindow settles below its estimate, in the next
// window, a reservation spent from a lease of a window that has ended:
// the refund belongs to the ended window, as a strict Settle's would, and
// must not let the next window admit more than its capacity.
func TestLeasedRefundStaysInItsWindow(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	lims := []Limit{
		{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: time.Second, Lease: Lease{Max: 50, TTL: time.Minute}},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 100, Period: time.Second, Lease: Lease{Max: 50, TTL: time.Minute}},
	}
	for _, lim := range lims {
		for _, sn := range []string{"memory", "redis"} {
			t.Run(lim.Name+"/"+sn, func(t *testing.T) {
				clk := newClock()
				clk.Advance(100 * time.Millisecond)
				l := inlineLeased(t, c, sn, clk)
				st := l.state(&Item{Limit: lim, Key: "k"})
				st.rate = 1e9 // hot
				it := Item{Limit: lim, Key: "k", Cost: 10}
				if res, err := l.Debit(ctx, "old", []Item{it}); err != nil || !res.Allowed || l.Stats().Acquired != 1 {
					t.Fatalf("the reservation in the first window: %+v %v %+v", res, err, l.Stats())
				}
				// The next window; for a sliding window, the one after, which
				// the first no longer weighs on.
				clk.Advance(time.Second)
				if lim.Algorithm == SlidingWindow {
					clk.Advance(time.Second)
				}
				admitted := refundAmidDebits(t, l, clk, lim, it)
				if admitted > 100 {
					t.Fatalf("admitted %d in one window of capacity 100", admitted)
				}
			})
		}
	}
}

// TestLeasedDataLoss loses the store's data (FLUSHALL, or a Memory
// store started anew) while a replica holds a lease of a budget-like
// window, and restores the key, as the gate does, to what the replica's
// ledger says it admitted: the units the replica held unspent at the
// restore are its to spend, so the restore counts them, and the window
// admits no more than its capacity in all.
func TestLeasedDataLoss(t *testing.T) {
	srv := redistest.New(t)
	c := srv.Client(t)
	ctx := context.Background()
	lims := []Limit{
		{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: time.Hour},
		{Name: "month", Algorithm: FixedWindow, Calendar: Month, Rate: 100},
		{Name: "tb", Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: 100},
	}
	strict := Limit{Name: "strict", Algorithm: FixedWindow, Rate: 1_000_000, Period: time.Hour}
	for _, lim := range lims {
		for _, sn := range []string{"memory", "redis"} {
			t.Run(lim.Name+"/"+sn, func(t *testing.T) {
				clk := newClock()
				lim.Lease = Lease{Max: 50, TTL: time.Minute}
				var s Store
				var lose func()
				if sn == "redis" {
					r := NewRedis(c, patient(RedisConfig{Prefix: fmt.Sprintf("dl%d:", prefixSeq.Add(1)), Generations: true}))
					r.now = clk.Now
					s = r
					lose = func() {
						if err := c.FlushAll(ctx).Err(); err != nil {
							t.Fatal(err)
						}
					}
				} else {
					s = NewMemory(MemoryConfig{Now: clk.Now, Generations: true})
				}
				l := NewLeased(s, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
				if lose == nil {
					lose = func() { // a store started anew
						m := NewMemory(MemoryConfig{Now: clk.Now, Generations: true})
						l.store, l.ls = m, m
					}
				}
				l.inline = true
				defer l.Close(ctx)
				l.state(&Item{Limit: lim, Key: "{t}:k"}).rate = 1e9 // hot
				var admitted int64                                  // the ledger
				debit := func(id string) {
					t.Helper()
					clk.Advance(time.Microsecond)
					// With a strict limit of the same tenant, as a request's rate
					// limit beside its budget: its debit finds the loss at once.
					items := []Item{{Limit: lim, Key: "{t}:k", Cost: 1}, {Limit: strict, Key: "{t}:s", Cost: 1}}
					for range 3 {
						res, err := l.Debit(ctx, id, items)
						if errors.Is(err, ErrStale) {
							if err := l.Restore(ctx, []Item{{Limit: lim, Key: "{t}:k"}, {Limit: strict, Key: "{t}:s"}}, []int64{admitted, 0}); err != nil {
								t.Fatal(err)
							}
							continue
						}
						if err != nil {
							t.Fatal(err)
						}
						if res.Allowed {
							admitted++
						}
						return
					}
					t.Fatal("stale after three restores")
				}
				for i := range 10 {
					debit(fmt.Sprint("a", i))
				}
				if l.Stats().Acquired == 0 {
					t.Fatalf("no lease: %+v", l.Stats())
				}
				lose()
				for i := range 300 {
					debit(fmt.Sprint("b", i))
				}
				if admitted > 100 {
					t.Fatalf("admitted %d across the data loss, capacity 100", admitted)
				}
				if admitted < 100 {
					t.Fatalf("admitted %d across the data loss, want the capacity 100", admitted)
				}
			})
		}
	}
}

// TestLeasedRefundInItsWindow settles below its estimate a reservation
// spent from a lease that has ended since, within the same window: the
// refund goes into the window's newer lease, as a strict Settle's goes
// into the window, so the window still admits its whole capacity.
func TestLeasedRefundInItsWindow(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	lim := Limit{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: time.Hour, Lease: Lease{Max: 50, TTL: 100 * time.Millisecond}}
	for _, sn := range []string{"memory", "redis"} {
		t.Run(sn, func(t *testing.T) {
			clk := newClock()
			clk.Advance(time.Minute)
			l := inlineLeased(t, c, sn, clk)
			l.state(&Item{Limit: lim, Key: "k"}).rate = 1e9 // hot
			it := Item{Limit: lim, Key: "k", Cost: 10}
			if res, err := l.Debit(ctx, "old", []Item{it}); err != nil || !res.Allowed {
				t.Fatalf("the reservation: %+v %v", res, err)
			}
			clk.Advance(60 * time.Millisecond) // its lease has ended
			admitted := refundAmidDebits(t, l, clk, lim, it)
			if admitted != 100 {
				t.Fatalf("admitted %d in the window besides a reservation settled at 0, want its capacity 100", admitted)
			}
		})
	}
}

// refundAmidDebits makes 20 debits of 1 on lim's key "k", settles
// reservation "old" of it at 0, makes 300 more, a microsecond apart, and
// returns how many of the 320 were admitted.
func refundAmidDebits(t *testing.T, l *Leased, clk *clock, lim Limit, it Item) int64 {
	t.Helper()
	ctx := context.Background()
	var admitted int64
	debit := func(id string) {
		clk.Advance(time.Microsecond)
		res, err := l.Debit(ctx, id, []Item{{Limit: lim, Key: "k", Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
		}
	}
	for i := range 20 {
		debit(fmt.Sprint("f", i))
	}
	if err := l.Settle(ctx, "old", []Item{it}, []int64{0}); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		debit(fmt.Sprint("n", i))
	}
	return admitted
}

// inlineLeased is a Leased store that takes its leases in the requests
// (deterministic), over the memory store or, for sn "redis", c, on clk;
// closed at the end of t.
func inlineLeased(t *testing.T, c Scripter, sn string, clk *clock) *Leased {
	t.Helper()
	return inlineOver(t, testLeaseStore(c, sn, clk), clk)
}

// testLeaseStore is the memory store or, for sn "redis", a Redis store on
// c, on clk.
func testLeaseStore(c Scripter, sn string, clk *clock) LeaseStore {
	if sn == "redis" {
		return newRedisStore(c, clk)
	}
	return NewMemory(MemoryConfig{Now: clk.Now})
}

// inlineOver is inlineLeased over s.
func inlineOver(tb testing.TB, s Store, clk *clock) *Leased {
	tb.Helper()
	l := NewLeased(s, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
	l.inline = true
	tb.Cleanup(func() { l.Close(context.Background()) })
	return l
}

// TestLeasedRacedLeaseRefusal takes leases on a key that another replica
// debits just before each lease call, so that every answer is stale once
// read: a lease refused for more than the request needs is not a refusal
// of the request. Fixed window and token bucket, 100 units, 80 spent
// first; steals of 1 to 7 units per lease call.
//
// Bound: the replica refuses a request only when the store has less left
// than it needs, and it admits exactly what the other replica left.
func TestLeasedRacedLeaseRefusal(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, lim := range unrefilled(100, 50) {
		for _, sn := range []string{"memory", "redis"} {
			for _, steal := range []int64{1, 3, 7} {
				t.Run(fmt.Sprintf("%s/%s/steal%d", lim.Name, sn, steal), func(t *testing.T) {
					clk := newClock()
					inner := testLeaseStore(c, sn, clk)
					rs := &racingStore{LeaseStore: inner, steal: steal}
					l := inlineOver(t, rs, clk)
					it := Item{Limit: lim, Key: fmt.Sprint("k", steal), Cost: 80}
					if res, err := inner.Debit(ctx, "before", []Item{it}); err != nil || !res.Allowed {
						t.Fatalf("the first 80: %+v %v", res, err)
					}
					it.Cost = 1
					l.state(&it).rate = 1e9 // hot: leases from the first request
					admitted := drainUntilRefused(t, l, clk, it, 100)
					left, err := inner.Peek(ctx, []Item{it})
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("admitted %d, the other replica %d, %d lease calls; the store has %d left", admitted, rs.stolen, rs.calls, left.Items[0].Remaining)
					if left.Items[0].Remaining != 0 || 80+rs.stolen+admitted != 100 {
						t.Fatalf("refused with %d left in the store: admitted %d, the other replica %d, of the 20 left after 80",
							left.Items[0].Remaining, admitted, rs.stolen)
					}
				})
			}
		}
	}
}

// drainUntilRefused debits it from l, a microsecond apart on clk, until
// it is refused, and returns how many were admitted, at most most.
func drainUntilRefused(t *testing.T, l *Leased, clk *clock, it Item, most int) int64 {
	t.Helper()
	for i := 0; ; i++ {
		clk.Advance(time.Microsecond)
		res, err := l.Debit(context.Background(), fmt.Sprint("drain", i), []Item{it})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			return int64(i)
		}
		if i == most {
			t.Fatalf("more than %d admitted", most)
		}
	}
}

// racingStore is a LeaseStore on which another replica debits steal units
// of the key just before each lease is taken.
type racingStore struct {
	LeaseStore
	steal, stolen int64
	calls         int
}

func (r *racingStore) Lease(ctx context.Context, it Item, c LeaseCall) (ItemState, error) {
	if it.Cost > 0 {
		r.calls++
		other := it
		other.Cost = r.steal
		res, err := r.LeaseStore.Debit(ctx, fmt.Sprint("other", r.calls), []Item{other})
		if err != nil {
			return ItemState{}, err
		}
		if res.Allowed {
			r.stolen += r.steal
		}
	}
	return r.LeaseStore.Lease(ctx, it, c)
}

// TestLeasedLateRefusalKeepsTheLease: a strict debit sent before the
// replica took a lease of what was left reaches the store after it, and
// is refused. The lease's units are the replica's all the same: the
// request refused is admitted from them, and so are the next ones, the
// key not refused as spent.
func TestLeasedLateRefusalKeepsTheLease(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, sn := range []string{"memory", "redis"} {
		t.Run(sn, func(t *testing.T) {
			clk := newClock()
			inner := testLeaseStore(c, sn, clk)
			hs := &heldStore{LeaseStore: inner, entered: make(chan struct{}), release: make(chan struct{})}
			l := inlineOver(t, hs, clk)
			lim := Limit{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: 24 * time.Hour, Lease: Lease{Max: 50, TTL: 2 * time.Second}}
			it := Item{Limit: lim, Key: "late", Cost: 90}
			if res, err := inner.Debit(ctx, "before", []Item{it}); err != nil || !res.Allowed {
				t.Fatalf("the first 90: %+v %v", res, err)
			}
			it.Cost = 1
			late := make(chan Result, 1)
			hs.hold.Store(true)
			go func() {
				res, err := l.Debit(ctx, "late", []Item{it}) // cold: strict, held
				if err != nil {
					t.Error(err)
				}
				late <- res
			}()
			<-hs.entered
			hs.hold.Store(false)
			st := l.state(&it)
			st.mu.Lock()
			st.rate = 1e9 // hot now: the next request leases what is left
			st.mu.Unlock()
			if res, err := l.Debit(ctx, "lease", []Item{it}); err != nil || !res.Allowed || l.Stats().Acquired != 1 {
				t.Fatalf("the request that leases: %+v %v %+v", res, err, l.Stats())
			}
			close(hs.release)
			if res := <-late; !res.Allowed {
				t.Fatalf("the late request was refused with the lease in hand: %+v", res)
			}
			if u := l.Unspent(it); u != 8 {
				t.Fatalf("Unspent = %d after two of a lease of 10, want 8", u)
			}
			admitted := 2 + drainUntilRefused(t, l, clk, it, 20)
			left, err := inner.Peek(ctx, []Item{it})
			if err != nil {
				t.Fatal(err)
			}
			if admitted != 10 || left.Items[0].Remaining != 0 {
				t.Fatalf("admitted %d of the 10 left (the store has %d), want 10", admitted, left.Items[0].Remaining)
			}
		})
	}
}

// heldStore is a LeaseStore whose strict debits wait, while hold is set,
// for release (entered is closed when the first one waits).
type heldStore struct {
	LeaseStore
	hold             atomic.Bool
	entered, release chan struct{}
}

func (h *heldStore) Debit(ctx context.Context, id string, items []Item) (Result, error) {
	if h.hold.Load() {
		close(h.entered)
		<-h.release
	}
	return h.LeaseStore.Debit(ctx, id, items)
}

// TestLeasedRefundAfterItsLease settles a request below its estimate
// after the lease it was spent from was spent whole and a new lease
// taken, which has spent nothing yet: the refund is kept (the store
// counts it spent in the old lease), so that the key is refused only once
// what was really spent reaches the capacity, on Memory and Redis.
func TestLeasedRefundAfterItsLease(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, sn := range []string{"memory", "redis"} {
		t.Run(sn, func(t *testing.T) {
			clk := newClock()
			l := inlineLeased(t, c, sn, clk)
			lim := Limit{Name: "usd", Algorithm: FixedWindow, Rate: 10_000, Period: 24 * time.Hour, Lease: Lease{Max: 1000, TTL: time.Minute}}
			it := Item{Limit: lim, Key: "k", Cost: 200}
			l.state(&it).rate = 1e9 // hot: leases of 1000, the next taken when 200 are left
			for i := range 5 {
				clk.Advance(time.Microsecond)
				if res, err := l.Debit(ctx, fmt.Sprint("r", i), []Item{it}); err != nil || !res.Allowed {
					t.Fatalf("debit %d: %+v %v", i, res, err)
				}
			}
			if got, held := l.Stats().Acquired, l.Unspent(it); got != 2 || held != 800 {
				t.Fatalf("%d leases taken, %d held unspent; want 2 and 800 (the first spent whole, the next, of Max less the 200 then left, untouched)", got, held)
			}
			// r0 cost nothing (an error answer): its 200 come back, and the
			// lease that holds the key's units has spent none.
			if err := l.Settle(ctx, "r0", []Item{it}, []int64{0}); err != nil {
				t.Fatal(err)
			}
			spent := 4*200 + 200*drainUntilRefused(t, l, clk, it, 100)
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
			left, err := l.Inner().Peek(ctx, []Item{it})
			if err != nil {
				t.Fatal(err)
			}
			counted := 10_000 - left.Items[0].Remaining
			t.Logf("spent %d of 10000; the store counts %d", spent, counted)
			if spent != 10_000 || counted != spent {
				t.Fatalf("spent %d of 10000 when refused, the store counts %d; want all of it", spent, counted)
			}
		})
	}
}

// TestLeasedFragmentedLeases drains a key with requests of random costs
// from one replica, so that its leases often hold part of a request's
// cost and the store the rest: neither alone covers it, together they
// do; some cost more than a lease may hold. Fixed window and a token
// bucket that does not refill within the test, 1000 units, leases of at
// most 100; memory and Redis.
//
// Bound: a request is refused only when what the store has left and what
// the replica's leases hold unspent are, together, less than its cost;
// and all that was admitted, left in the store and held add up to the
// capacity.
func TestLeasedFragmentedLeases(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, lim := range unrefilled(1000, 100) {
		for _, sn := range []string{"memory", "redis"} {
			for seed := range int64(4) {
				t.Run(fmt.Sprintf("%s/%s/seed%d", lim.Name, sn, seed), func(t *testing.T) {
					clk := newClock()
					inner := testLeaseStore(c, sn, clk)
					l := inlineOver(t, inner, clk)
					rng := rand.New(rand.NewPCG(uint64(seed), 7))
					it := Item{Limit: lim, Key: fmt.Sprint("frag", seed)}
					var admitted, refused int64
					for i := range 400 {
						clk.Advance(time.Duration(1+rng.IntN(2000)) * time.Microsecond)
						it.Cost = 1 + rng.Int64N(150) // some above Lease.Max
						res, err := l.Debit(ctx, fmt.Sprint("r", i), []Item{it})
						if err != nil {
							t.Fatal(err)
						}
						if res.Allowed {
							admitted += it.Cost
							continue
						}
						refused++
						left, err := inner.Peek(ctx, []Item{it})
						if err != nil {
							t.Fatal(err)
						}
						if held := l.Unspent(it); left.Items[0].Remaining+held >= it.Cost {
							t.Fatalf("request %d of %d refused with %d left in the store and %d held unspent (admitted %d)",
								i, it.Cost, left.Items[0].Remaining, held, admitted)
						}
					}
					left, err := inner.Peek(ctx, []Item{it})
					if err != nil {
						t.Fatal(err)
					}
					held := l.Unspent(it)
					t.Logf("admitted %d, refused %d requests, %d left in the store, %d held; %d lease calls",
						admitted, refused, left.Items[0].Remaining, held, l.Stats().Calls)
					if refused == 0 || admitted+left.Items[0].Remaining+held != 1000 {
						t.Fatalf("admitted %d + left %d + held %d, want 1000 with some refused (%d)", admitted, left.Items[0].Remaining, held, refused)
					}
				})
			}
		}
	}
}

// TestLeasedBigRequestWithLeasesHeld: a request of more than a lease may
// hold goes to the store strictly; the leases its replica holds of the key
// go back first, so that it is not refused with its cost held between the
// two. Fixed window and token bucket, 1000 units, leases of at most 100:
// a lease of 100 held (99 unspent), another replica leaves 120 in the
// store, and a request of 150 comes.
func TestLeasedBigRequestWithLeasesHeld(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, lim := range unrefilled(1000, 100) {
		for _, sn := range []string{"memory", "redis"} {
			t.Run(lim.Name+"/"+sn, func(t *testing.T) {
				clk := newClock()
				inner := testLeaseStore(c, sn, clk)
				l := inlineOver(t, inner, clk)
				it := Item{Limit: lim, Key: "big", Cost: 1}
				l.state(&it).rate = 1e9 // hot: a lease from the first request
				if res, err := l.Debit(ctx, "first", []Item{it}); err != nil || !res.Allowed {
					t.Fatalf("the first request: %+v %v", res, err)
				}
				if held := l.Unspent(it); held != 99 {
					t.Fatalf("%d held unspent after the first request, want 99", held)
				}
				other := it
				other.Cost = 900 - 120
				if res, err := inner.Debit(ctx, "other", []Item{other}); err != nil || !res.Allowed {
					t.Fatalf("the other replica's %d: %+v %v", other.Cost, res, err)
				}
				it.Cost = 150
				res, err := l.Debit(ctx, "big", []Item{it})
				if err != nil {
					t.Fatal(err)
				}
				left, err := inner.Peek(ctx, []Item{it})
				if err != nil {
					t.Fatal(err)
				}
				held := l.Unspent(it)
				if !res.Allowed || left.Items[0].Remaining+held != 1000-1-780-150 {
					t.Fatalf("the request of 150 with 99 held and 120 in the store: allowed %v; after it %d left in the store, %d held",
						res.Allowed, left.Items[0].Remaining, held)
				}
			})
		}
	}
}

// unrefilled is a fixed window and a token bucket of capacity units
// that give nothing back within a test (a day's window, a unit a day),
// each leased in leases of at most most units for 2 s.
func unrefilled(capacity, most int64) []Limit {
	lease := Lease{Max: most, TTL: 2 * time.Second}
	return []Limit{
		{Name: "fw", Algorithm: FixedWindow, Rate: capacity, Period: 24 * time.Hour, Lease: lease},
		{Name: "tb", Algorithm: TokenBucket, Rate: 1, Period: 24 * time.Hour, Burst: capacity, Lease: lease},
	}
}
