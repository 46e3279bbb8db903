package weighted

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// TestMemoryAndRedisAgree runs the same random sequences of multi-item
// debits, settles, renewals, cancels, peeks and resets on both stores and
// requires identical results and errors at every step.
func TestMemoryAndRedisAgree(t *testing.T) {
	c := testRedis(t)
	limits := []Limit{
		{Name: "tokens", Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 1500},
		{Name: "requests", Algorithm: FixedWindow, Rate: 20, Period: 500 * time.Millisecond},
		{Name: "gcra", Algorithm: GCRA, Rate: 50, Period: time.Second, Burst: 10},
		{Name: "sliding", Algorithm: SlidingWindow, Rate: 300, Period: 700 * time.Millisecond},
		{Name: "log", Algorithm: SlidingLog, Rate: 40, Period: 300 * time.Millisecond},
		{Name: "inflight", Algorithm: Concurrency, Rate: 8, Period: 2 * time.Second},
		{Name: "daily-nanousd", Algorithm: TokenBucket, Rate: 50_000_000_000, Period: 24 * time.Hour},
		// Counted in ticks of 10ms (see Limit.Validate).
		{Name: "minute-nanousd", Algorithm: SlidingWindow, Rate: 100_000_000_000, Period: time.Minute},
		{Name: "gcra-ticks", Algorithm: GCRA, Rate: 100_000_000_000, Period: time.Minute, Burst: 20_000_000_000},
		// The windows above under other periods, as after a config change:
		// their counts are carried over.
		{Name: "requests", Algorithm: FixedWindow, Rate: 20, Period: 1300 * time.Millisecond},
		{Name: "sliding", Algorithm: SlidingWindow, Rate: 300, Period: 300 * time.Millisecond},
	}
	keys := []string{"{acme}", "{acme}:model=gpt-4o", "{globex}", "plain"}
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			ctx := context.Background()
			clk := newClock()
			stores := bothStores(c, clk)
			rng := rand.New(rand.NewPCG(seed, 7))
			type reservation struct {
				id    string
				items []Item
			}
			var held []reservation
			var admitted, denied int
			randomItems := func() []Item {
				n := 1 + rng.IntN(4)
				var items []Item
				for _, li := range rng.Perm(len(limits))[:n] {
					l := limits[li]
					cost := rng.Int64N(l.Capacity()/3 + 1)
					if rng.IntN(50) == 0 {
						cost = l.Capacity() + 1
					}
					items = append(items, Item{Limit: l, Key: keys[rng.IntN(len(keys))], Cost: cost})
				}
				return items
			}
			for i := range 400 {
				clk.Advance(time.Duration(rng.Int64N(int64(40 * time.Millisecond))))
				var op string
				var results [2]any
				switch r := rng.IntN(20); {
				case r < 11 || len(held) == 0:
					op = "debit"
					items := randomItems()
					id := fmt.Sprintf("req-%d", i)
					for k, s := range stores {
						res, err := s.Debit(ctx, id, items)
						results[k] = fmt.Sprintf("%+v %v", res, err)
						if k == 0 && err == nil && res.Allowed {
							held = append(held, reservation{id, items})
							admitted++
						}
						if k == 0 && err == nil && !res.Allowed {
							denied++
						}
					}
				case r < 15:
					op = "settle"
					h := held[rng.IntN(len(held))]
					actual := make([]int64, len(h.items))
					for j, it := range h.items {
						actual[j] = rng.Int64N(it.Limit.Capacity() + 1)
					}
					for k, s := range stores {
						results[k] = fmt.Sprint(s.Settle(ctx, h.id, h.items, actual))
					}
				case r < 16:
					op = "renew"
					h := held[rng.IntN(len(held))]
					for k, s := range stores {
						results[k] = fmt.Sprint(s.Renew(ctx, h.id, h.items))
					}
				case r < 17:
					op = "cancel"
					h := held[rng.IntN(len(held))]
					for k, s := range stores {
						results[k] = fmt.Sprint(s.Cancel(ctx, h.id, h.items))
					}
				case r < 19:
					op = "peek"
					items := randomItems()
					for k, s := range stores {
						res, err := s.Peek(ctx, items)
						results[k] = fmt.Sprintf("%+v %v", res, err)
					}
				default:
					op = "reset"
					items := randomItems()
					for k, s := range stores {
						results[k] = fmt.Sprint(s.Reset(ctx, items))
					}
				}
				if results[0] != results[1] {
					t.Fatalf("step %d (%s):\nmemory %v\nredis  %v", i, op, results[0], results[1])
				}
			}
			if admitted < 20 || denied < 20 {
				t.Fatalf("%d debits admitted and %d denied: the sequence does not exercise both", admitted, denied)
			}
		})
	}
}

// TestAllOrNothing checks that a request denied by one limit debits none.
func TestAllOrNothing(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, s := range bothStores(c, newClock()) {
		t.Run(s.name, func(t *testing.T) {
			tokens := Limit{Name: "tokens", Rate: 100, Period: time.Minute}
			requests := Limit{Name: "requests", Algorithm: FixedWindow, Rate: 2, Period: time.Minute}
			inflight := Limit{Name: "inflight", Algorithm: Concurrency, Rate: 5, Period: time.Minute}
			req := func(cost int64) []Item {
				return []Item{
					{Limit: tokens, Key: "{a}", Cost: cost},
					{Limit: requests, Key: "{a}", Cost: 1},
					{Limit: inflight, Key: "{a}", Cost: 1},
				}
			}
			for i, want := range []bool{true, false, true, false} {
				cost := []int64{30, 80, 30, 10}[i]
				res, err := s.Debit(ctx, fmt.Sprint("r", i), req(cost))
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed != want {
					t.Fatalf("debit %d: allowed %v, want %v: %+v", i, res.Allowed, want, res)
				}
			}
			// Two admitted: 60 tokens, 2 requests, 2 in flight; the denied
			// debits took nothing from the limits that had room.
			res, err := s.Peek(ctx, req(0))
			if err != nil {
				t.Fatal(err)
			}
			got := []int64{res.Items[0].Remaining, res.Items[1].Remaining, res.Items[2].Remaining}
			if want := []int64{40, 0, 3}; !slices.Equal(got, want) {
				t.Fatalf("remaining %v, want %v", got, want)
			}
			res, _ = s.Debit(ctx, "r9", req(10))
			if res.Allowed || res.Decider != 1 || res.RetryAfter <= 0 || res.RetryAfter != res.Items[1].RetryAfter {
				t.Fatalf("denied by the request limit: got %+v", res)
			}
		})
	}
}

func TestDeciderAndRetryAfter(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, s := range bothStores(c, newClock()) {
		t.Run(s.name, func(t *testing.T) {
			slow := Limit{Name: "slow", Rate: 1, Period: time.Minute, Burst: 10}
			fast := Limit{Name: "fast", Rate: 10, Period: time.Second}
			roomy := Limit{Name: "roomy", Rate: 1000, Period: time.Second}
			items := []Item{{Limit: roomy, Key: "k", Cost: 9}, {Limit: fast, Key: "k", Cost: 9}, {Limit: slow, Key: "k", Cost: 8}}
			res, err := s.Debit(ctx, "a", items)
			if err != nil || !res.Allowed {
				t.Fatalf("first debit: %+v %v", res, err)
			}
			// fast has 1 of 10 left, slow 2 of 10: fast is the least
			// remaining relative to capacity.
			if res.Decider != 1 {
				t.Fatalf("allowed decider %d, want 1 (fast): %+v", res.Decider, res)
			}
			res, err = s.Debit(ctx, "b", items)
			if err != nil || res.Allowed {
				t.Fatalf("second debit: %+v %v", res, err)
			}
			// Both fast (800ms) and slow (6m) fail; slow waits longest.
			if res.Decider != 2 || res.RetryAfter != 6*time.Minute || res.Items[1].RetryAfter != 800*time.Millisecond || !res.Items[0].Allowed {
				t.Fatalf("denied: %+v", res)
			}
			if res, _ := s.Debit(ctx, "c", nil); !res.Allowed || res.Decider != -1 {
				t.Fatalf("no items: %+v", res)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	l := Limit{Name: "l", Rate: 10, Period: time.Second}
	for _, s := range bothStores(c, newClock()) {
		t.Run(s.name, func(t *testing.T) {
			_, err := s.Debit(ctx, "a", []Item{{Limit: l, Key: "k", Cost: 11}})
			var ce *CostError
			if !errors.Is(err, ErrCostExceedsCapacity) || !errors.As(err, &ce) || ce.Limit != "l" || ce.Cost != 11 || ce.Capacity != 10 {
				t.Fatalf("cost above capacity: %v", err)
			}
			if _, err := s.Peek(ctx, []Item{{Limit: l, Key: "k", Cost: 11}}); !errors.Is(err, ErrCostExceedsCapacity) {
				t.Fatalf("peek above capacity: %v", err)
			}
			if _, err := s.Debit(ctx, "a", []Item{{Limit: l, Key: "k", Cost: 1}, {Limit: l, Key: "k", Cost: 1}}); !errors.Is(err, ErrDuplicateItem) {
				t.Fatalf("duplicate item: %v", err)
			}
			if _, err := s.Debit(ctx, "a", []Item{{Limit: l, Key: "k", Cost: -1}}); err == nil {
				t.Fatal("negative cost accepted")
			}
			if _, err := s.Debit(ctx, "", []Item{{Limit: l, Key: "k", Cost: 1}}); err == nil {
				t.Fatal("empty id accepted")
			}
			if _, err := s.Debit(ctx, "a", []Item{{Limit: Limit{Name: "bad"}, Key: "k"}}); err == nil {
				t.Fatal("invalid limit accepted")
			}
			if err := s.Settle(ctx, "a", []Item{{Limit: l, Key: "k", Cost: 1}}, nil); err == nil {
				t.Fatal("settle without actual costs accepted")
			}
			if err := s.Settle(ctx, "a", []Item{{Limit: l, Key: "k", Cost: 1}}, []int64{-1}); err == nil {
				t.Fatal("negative actual cost accepted")
			}
		})
	}
}

// TestDenialWritesNothing compares every key's dump before and after denied
// debits of every algorithm.
func TestDenialWritesNothing(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	clk := newClock()
	r := newRedisStore(c, clk)
	var items []Item
	for a := Algorithm(0); a < numAlgorithms; a++ {
		items = append(items, Item{Limit: Limit{Name: "l", Algorithm: a, Rate: 10, Period: time.Second}, Key: "{k}", Cost: 7})
	}
	if res, err := r.Debit(ctx, "first", items); err != nil || !res.Allowed {
		t.Fatalf("first debit: %+v %v", res, err)
	}
	dump := func() map[string]string {
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, k := range keys {
			out[k] = c.Dump(ctx, k).Val()
		}
		return out
	}
	before := dump()
	if len(before) != int(numAlgorithms)+1 { // the limits and the window record
		t.Fatalf("%d keys after the first debit: %v", len(before), before)
	}
	clk.Advance(100 * time.Millisecond)
	for i := range items {
		res, err := r.Debit(ctx, fmt.Sprint("second", i), items[i:i+1])
		if err != nil || res.Allowed {
			t.Fatalf("%s: second debit: %+v %v", items[i].Limit.Algorithm, res, err)
		}
	}
	if after := dump(); !reflect.DeepEqual(before, after) {
		t.Fatal("a denied debit changed Redis")
	}
}

// TestRedisDownIsAnError checks that an unreachable Redis is an error, never
// a decision.
func TestRedisDownIsAnError(t *testing.T) {
	srv := redistest.New(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	r := NewRedis(c, patient(RedisConfig{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	items := []Item{{Limit: Limit{Name: "l", Rate: 10, Period: time.Second}, Key: "k", Cost: 1}}
	if res, err := r.Debit(ctx, "a", items); err != nil || !res.Allowed {
		t.Fatalf("before the outage: %+v %v", res, err)
	}
	srv.Stop(t)
	if res, err := r.Debit(ctx, "b", items); err == nil {
		t.Fatalf("Redis down: got a decision %+v, want an error", res)
	}
	if err := r.Settle(ctx, "a", items, []int64{1}); err == nil {
		t.Fatal("Redis down: settle succeeded")
	}
	srv.Restart(t)
	// The restarted server has no scripts: EVALSHA falls back to EVAL.
	if res, err := r.Debit(ctx, "c", items); err != nil || !res.Allowed {
		t.Fatalf("after the restart: %+v %v", res, err)
	}
}

// TestExactUnderConcurrency races 200 goroutines on the same limits, with
// the clock stopped, and requires that exactly the capacity is admitted.
func TestExactUnderConcurrency(t *testing.T) {
	c := testRedis(t)
	cases := []struct {
		name  string
		items []Item // costs are set by the goroutines
	}{
		{"token_bucket", []Item{{Limit: Limit{Name: "tb", Rate: 1000, Period: time.Minute}, Key: "{k}"}}},
		{"sliding_log", []Item{{Limit: Limit{Name: "log", Algorithm: SlidingLog, Rate: 300, Period: time.Minute}, Key: "{k}"}}},
		{"concurrency", []Item{{Limit: Limit{Name: "conc", Algorithm: Concurrency, Rate: 300, Period: time.Minute}, Key: "{k}"}}},
		{"three limits", []Item{
			{Limit: Limit{Name: "tb", Rate: 1000, Period: time.Minute}, Key: "{k}"},
			{Limit: Limit{Name: "fw", Algorithm: FixedWindow, Rate: 700, Period: time.Hour}, Key: "{k}"},
			{Limit: Limit{Name: "sw", Algorithm: SlidingWindow, Rate: 5000, Period: time.Hour}, Key: "{k}:x"},
		}},
	}
	for _, tc := range cases {
		for _, s := range bothStores(c, newClock()) {
			t.Run(tc.name+"/"+s.name, func(t *testing.T) {
				capacity := tc.items[0].Limit.Capacity()
				for _, it := range tc.items {
					capacity = min(capacity, it.Limit.Capacity())
				}
				admitted := raceDebits(t, s.Store, tc.items, 200)
				if admitted != capacity {
					t.Fatalf("admitted %d units, capacity %d", admitted, capacity)
				}
				res, err := s.Peek(context.Background(), tc.items)
				if err != nil {
					t.Fatal(err)
				}
				for i, it := range res.Items {
					if it.Remaining != tc.items[i].Limit.Capacity()-capacity {
						t.Fatalf("item %d: remaining %d after admitting %d of %d", i, it.Remaining, capacity, tc.items[i].Limit.Capacity())
					}
				}
			})
		}
	}
}

// raceDebits has n goroutines debit items (all with the same cost) until the
// limits are exhausted: each debits random costs of 1 to 5 while they fit,
// then 1 until denied. It returns the units admitted.
func raceDebits(t *testing.T, s Store, items []Item, n int) int64 {
	t.Helper()
	ctx := context.Background()
	var admitted atomic.Int64
	var seq atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			mine := make([]Item, len(items))
			copy(mine, items)
			for cost := 1 + rng.Int64N(5); ; {
				for i := range mine {
					mine[i].Cost = cost
				}
				res, err := s.Debit(ctx, fmt.Sprint("r", seq.Add(1)), mine)
				if err != nil {
					errs <- err
					return
				}
				switch {
				case res.Allowed:
					admitted.Add(cost)
					if cost > 1 {
						cost = 1 + rng.Int64N(5)
					}
				case cost > 1:
					cost = 1
				default:
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return admitted.Load()
}
