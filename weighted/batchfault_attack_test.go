package weighted

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestBatchFaultAtkOneCallFailsAlone: the script calls of concurrent
// requests share one EVALSHA, whatever their tenants. One tenant's request
// that Redis cannot run (its key spoiled: of the wrong type, or a value
// too short to read) fails alone: the other tenants' debits, settlements
// and peeks in the same batch, before it and after it, are decided and
// applied once, and their callers told so. Before, the whole batch failed:
// every tenant's caller got the spoiled key's error (a store failure, so
// the fail-open posture and the breaker's count), while the requests
// before it kept their debits in Redis.
func TestBatchFaultAtkOneCallFailsAlone(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	lim := Limit{Name: "per-tenant", Rate: 10, Period: time.Hour}
	fw := Limit{Name: "fw", Algorithm: FixedWindow, Rate: 10, Period: time.Hour}
	log := Limit{Name: "log", Algorithm: SlidingLog, Rate: 10, Period: time.Hour}
	items := func(tenant string) []Item {
		return []Item{{Limit: lim, Key: "{" + tenant + "}", Cost: 1}, {Limit: fw, Key: "{" + tenant + "}", Cost: 1},
			{Limit: log, Key: "{" + tenant + "}", Cost: 1}}
	}
	cases := []struct {
		name  string
		spoil func(r *Redis, it *Item) error
	}{
		{"meter of the wrong type", func(r *Redis, it *Item) error { return c.RPush(ctx, r.key(it), "x").Err() }},
		{"meter value too short", func(r *Redis, it *Item) error { return c.Set(ctx, r.key(it), "short", 0).Err() }},
		{"log of the wrong type", func(r *Redis, it *Item) error {
			l := *it
			l.Limit = log
			return c.Set(ctx, r.key(&l), "x", 0).Err()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newBatchStore(c, newClock(), RedisConfig{})
			evil := items("evil")
			if err := tc.spoil(r, &evil[0]); err != nil {
				t.Fatal(err)
			}
			// globex's reservation, debited alone, is settled in the batch.
			if res, err := r.Debit(ctx, "g0", items("globex")); err != nil || !res.Allowed {
				t.Fatalf("globex's first debit: %+v, %v", res, err)
			}
			hold(r)
			type answer struct {
				who string
				err error
				ok  bool
			}
			answers := make(chan answer, 8)
			calls := []struct {
				who string
				f   func() (bool, error)
			}{
				{"acme debit", func() (bool, error) { res, err := r.Debit(ctx, "a1", items("acme")); return res.Allowed, err }},
				{"evil debit", func() (bool, error) { res, err := r.Debit(ctx, "e1", evil); return res.Allowed, err }},
				{"globex settle", func() (bool, error) {
					return true, r.Settle(ctx, "g0", items("globex"), []int64{3, 3, 3})
				}},
				{"evil peek", func() (bool, error) { res, err := r.Peek(ctx, evil); return res.Allowed, err }},
				{"acme debit", func() (bool, error) { res, err := r.Debit(ctx, "a2", items("acme")); return res.Allowed, err }},
			}
			for i, call := range calls {
				go func() {
					ok, err := call.f()
					answers <- answer{call.who, err, ok}
				}()
				waitPending(t, r, i+1)
			}
			release(r)
			for range calls {
				a := <-answers
				switch {
				case a.who == "evil debit" || a.who == "evil peek":
					// A list where a meter belongs reads as no meter (MGET), and
					// the debit overwrites it; the other spoils fail the call,
					// as the request's own failure: the store answered.
					var re redis.Error
					if a.err != nil && (!errors.As(a.err, &re) || !errors.Is(a.err, ErrUnreadable) || IsStoreFailure(a.err)) {
						t.Errorf("%s on a spoiled key: %v, want the store's reply as ErrUnreadable, no store failure", a.who, a.err)
					}
				case a.err != nil || !a.ok:
					t.Errorf("%s in a batch with evil's spoiled key: allowed %v, %v", a.who, a.ok, a.err)
				}
			}
			checkRemaining(t, r, items("acme"), 2)
			checkRemaining(t, r, items("globex"), 3)
			if s := r.Stats(); s.LateLost != 0 || s.UnknownOutcomes != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestBatchFaultAtkOneTenantFloodsTheQueue: on a store that is not
// sharded every tenant's requests wait in one queue while a script call
// runs, and go in arrival order, MaxBatch a call. One tenant that keeps
// many requests waiting (each a fresh key, say, which no prefilter
// refuses) put every other tenant's request behind all of its own: past
// QueueTimeout, the others were shed as overloaded (503) whatever their
// own limits. A tenant's hash tag may keep at most sixteen script calls'
// worth of debits waiting; its debits past that are shed at once, and
// another tenant's debit goes within seventeen script calls, also when
// both debit a global limit too, whose key comes first.
func TestBatchFaultAtkOneTenantFloodsTheQueue(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	const maxBatch, flood = 4, 400
	lim := Limit{Name: "per-user", Rate: 1000, Period: time.Hour}
	global := Limit{Name: "global", Rate: 1 << 20, Period: time.Hour}
	for _, tc := range []struct {
		name  string
		items func(tenant, user string) []Item
	}{
		{"tenant limit", func(tenant, user string) []Item {
			return []Item{{Limit: lim, Key: "{" + tenant + "}:user=" + user, Cost: 1}}
		}},
		{"global limit first", func(tenant, user string) []Item {
			return []Item{{Limit: global, Key: "{global}", Cost: 1}, {Limit: lim, Key: "{" + tenant + "}:user=" + user, Cost: 1}}
		}},
	} {
		for _, gens := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/generations %v", tc.name, gens), func(t *testing.T) {
				r := newBatchStore(c, newClock(), RedisConfig{MaxBatch: maxBatch, Generations: gens})
				if gens {
					// The tags' generation markers are set: the debits are not stale.
					for _, tenant := range []string{"evil", "acme"} {
						items := tc.items(tenant, "u")
						if err := r.Restore(ctx, items, make([]int64, len(items))); err != nil {
							t.Fatal(err)
						}
					}
				}
				floodQueue(t, r, flood, func(i int) []Item { return tc.items("evil", strconv.Itoa(i)) }, tc.items("acme", "u"), maxBatch)
			})
		}
	}
}

// floodQueue queues n debits of flood(i) behind a held script call, then
// one of victim, and requires victim's to be admitted within seventeen
// script calls of the release.
func floodQueue(t *testing.T, r *Redis, n int, flood func(i int) []Item, victim []Item, maxBatch int) {
	t.Helper()
	ctx := context.Background()
	hold(r)
	var shed atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.Debit(ctx, "e"+strconv.Itoa(i), flood(i))
			if errors.Is(err, ErrCrowded) && errors.Is(err, ErrOverloaded) && !IsStoreFailure(err) {
				shed.Add(1)
			} else if err != nil {
				t.Error(err)
			}
		}()
	}
	// Every flooding request waits or was shed.
	for deadline := time.Now().Add(10 * time.Second); ; {
		r.mu.Lock()
		q := len(r.queue.pending)
		r.mu.Unlock()
		if q+int(shed.Load()) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queued, %d shed, of %d", q, shed.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	r.mu.Lock()
	q := len(r.queue.pending)
	r.mu.Unlock()
	before := r.scriptCalls.Load()
	done := make(chan int64, 1)
	go func() {
		res, err := r.Debit(ctx, "victim", victim)
		if err != nil || !res.Allowed {
			t.Errorf("the victim's debit behind the flood: %+v, %v", res, err)
		}
		done <- r.scriptCalls.Load() - before
	}()
	waitPending(t, r, q+1)
	release(r)
	if calls := <-done; calls > 16+1+1 {
		t.Errorf("the victim's debit was answered after %d script calls of %d requests each, behind %d waiting requests of the flood", calls, maxBatch, int64(n)-shed.Load())
	}
	wg.Wait()
}
