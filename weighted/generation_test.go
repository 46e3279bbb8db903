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

// genLimits are limits of every algorithm that Restore raises.
var genLimits = []Limit{
	{Name: "budget", Algorithm: FixedWindow, Rate: 1000, Calendar: Month},
	{Name: "day", Algorithm: FixedWindow, Rate: 500, Period: 24 * time.Hour},
	{Name: "tokens", Algorithm: TokenBucket, Rate: 300, Period: time.Minute, Burst: 400},
	{Name: "gcra", Algorithm: GCRA, Rate: 300, Period: time.Minute},
	{Name: "sliding", Algorithm: SlidingWindow, Rate: 600, Period: time.Hour},
	{Name: "log", Algorithm: SlidingLog, Rate: 400, Period: time.Minute},
}

// wantStale requires that err is a *StaleError naming tags.
func wantStale(t *testing.T, err error, tags ...string) *StaleError {
	t.Helper()
	var se *StaleError
	if !errors.Is(err, ErrStale) || !errors.As(err, &se) {
		t.Fatalf("got %v, want a *StaleError", err)
	}
	if !slices.Equal(se.Tags, tags) {
		t.Fatalf("stale tags %q, want %q", se.Tags, tags)
	}
	if IsStoreFailure(err) {
		t.Fatal("a stale tag counts as a store failure")
	}
	return se
}

// TestGenerationsAgree runs random debits, peeks, settles and restores on a
// Memory and a Redis store with generations, losing all state now and then
// (FLUSHDB, and a fresh Memory), and requires identical results and errors
// at every step: both stores are stale at the same steps and restored the
// same way.
func TestGenerationsAgree(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	keys := []string{"{acme}", "{acme}:user=bob", "{globex}", "plain"}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			clk := newClock()
			rng := rand.New(rand.NewPCG(seed, 11))
			mem := NewMemory(MemoryConfig{Now: clk.Now, Generations: true})
			rs := NewRedis(c, patient(RedisConfig{Prefix: fmt.Sprintf("ga%d:", seed), Generations: true}))
			rs.now = clk.Now
			stores := func() []Store { return []Store{mem, rs} }
			type reservation struct {
				id    string
				items []Item
			}
			var held []reservation
			randomItems := func(costs bool) []Item {
				var items []Item
				for _, li := range rng.Perm(len(genLimits))[:1+rng.IntN(3)] {
					l := genLimits[li]
					var cost int64
					if costs {
						cost = rng.Int64N(l.Capacity()/4 + 1)
					}
					items = append(items, Item{Limit: l, Key: keys[rng.IntN(len(keys))], Cost: cost})
				}
				return items
			}
			var stale, restored, admitted int
			for i := range 300 {
				clk.Advance(time.Duration(rng.Int64N(int64(2 * time.Second))))
				var results [2]string
				var op string
				switch r := rng.IntN(20); {
				case r == 0:
					op = "lose"
					mem = NewMemory(MemoryConfig{Now: clk.Now, Generations: true})
					if err := c.FlushDB(ctx).Err(); err != nil {
						t.Fatal(err)
					}
					held = nil
				case r < 5:
					op = "restore"
					items := randomItems(false)
					counted := make([]int64, len(items))
					for j, it := range items {
						counted[j] = rng.Int64N(it.Limit.Capacity() + 1)
					}
					for k, s := range stores() {
						results[k] = fmt.Sprint(s.(Restorer).Restore(ctx, items, counted))
					}
					restored++
				case r < 13 || len(held) == 0:
					op = "debit"
					items := randomItems(true)
					id := fmt.Sprint("req-", i)
					for k, s := range stores() {
						res, err := s.Debit(ctx, id, items)
						results[k] = fmt.Sprintf("%+v %v", res, err)
						if k == 0 && err == nil && res.Allowed {
							held = append(held, reservation{id, items})
							admitted++
						}
						if k == 0 && errors.Is(err, ErrStale) {
							stale++
						}
					}
				case r < 17:
					op = "settle"
					h := held[rng.IntN(len(held))]
					actual := make([]int64, len(h.items))
					for j, it := range h.items {
						actual[j] = rng.Int64N(it.Limit.Capacity()/4 + 1)
					}
					for k, s := range stores() {
						results[k] = fmt.Sprint(s.Settle(ctx, h.id, h.items, actual))
					}
				default:
					op = "peek"
					items := randomItems(true)
					for k, s := range stores() {
						res, err := s.Peek(ctx, items)
						results[k] = fmt.Sprintf("%+v %v", res, err)
					}
				}
				if results[0] != results[1] {
					t.Fatalf("step %d (%s):\nmemory: %s\nredis:  %s", i, op, results[0], results[1])
				}
			}
			t.Logf("%d admitted, %d stale, %d restores", admitted, stale, restored)
			if stale == 0 || admitted == 0 {
				t.Fatal("the sequence never was stale, or never admitted")
			}
		})
	}
}

// lossCase is a way for Redis to lose state between two calls.
type lossCase struct {
	name string
	// prepare runs after the store is restored, before the debits that
	// the loss takes away; lose takes them away.
	prepare func(t *testing.T)
	lose    func(t *testing.T)
}

// TestGenerationsDetectLoss loses Redis's state in each way the store must
// notice, and requires ErrStale on the first call after it, nothing
// applied by that call, and exact counts after Restore.
func TestGenerationsDetectLoss(t *testing.T) {
	srv := redistest.New(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	cases := []lossCase{
		{name: "FLUSHALL", lose: func(t *testing.T) {
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "restarted empty", lose: func(t *testing.T) {
			srv.Stop(t)
			srv.Restart(t)
		}},
		{name: "older snapshot", prepare: func(t *testing.T) {
			// The snapshot holds the state restored; the debits after it
			// are lost when Redis loads it again, as a replica that lags
			// would lose them in a failover.
			if err := c.Save(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}, lose: func(t *testing.T) {
			if err := c.Do(ctx, "DEBUG", "RELOAD", "NOSAVE").Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "marker behind", lose: func(t *testing.T) {
			// A replica that missed the last write holds the marker's
			// previous value (and the counters before that write).
			v, err := c.Get(ctx, "gl:g:{acme}").Int64()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Set(ctx, "gl:g:{acme}", v-1, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	budget := Limit{Name: "budget", Algorithm: FixedWindow, Rate: 1000, Calendar: Month}
	tokens := Limit{Name: "tokens", Rate: 300, Period: time.Hour}
	global := Limit{Name: "global", Algorithm: FixedWindow, Rate: 5000, Period: time.Hour}
	items := func(cost int64) []Item {
		return []Item{
			{Limit: budget, Key: "{acme}", Cost: cost},
			{Limit: tokens, Key: "{acme}:user=bob", Cost: cost},
			{Limit: global, Key: "all", Cost: cost},
		}
	}
	tagged := items(0)[:2]
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			clk := newClock()
			r := NewRedis(c, patient(RedisConfig{Prefix: "gl:", Generations: true}))
			r.now = clk.Now
			// A fresh store: stale until restored.
			_, err := r.Debit(ctx, "first", items(10))
			if se := wantStale(t, err, "acme"); !slices.Equal(se.Items, []int{0, 1}) {
				t.Fatalf("stale items %v, want [0 1]", se.Items)
			}
			if err := r.Restore(ctx, tagged, []int64{100, 50}); err != nil {
				t.Fatal(err)
			}
			if tc.prepare != nil {
				tc.prepare(t)
			}
			res, err := r.Debit(ctx, "a", items(10))
			if err != nil || !res.Allowed || res.Items[0].Remaining != 890 || res.Items[1].Remaining != 240 {
				t.Fatalf("after the restore: %+v %v", res, err)
			}
			tc.lose(t)
			before, _ := c.Keys(ctx, "gl:*").Result()
			slices.Sort(before)
			_, err = r.Debit(ctx, "b", items(10))
			wantStale(t, err, "acme")
			_, err = r.Peek(ctx, items(10))
			wantStale(t, err, "acme")
			after, _ := c.Keys(ctx, "gl:*").Result()
			slices.Sort(after)
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("the stale debit wrote: keys %q, then %q", before, after)
			}
			// The ledger counted 110 of the budget and 60 tokens.
			if err := r.Restore(ctx, tagged, []int64{110, 60}); err != nil {
				t.Fatal(err)
			}
			res, err = r.Debit(ctx, "c", items(10))
			if err != nil || !res.Allowed || res.Items[0].Remaining != 880 || res.Items[1].Remaining != 230 {
				t.Fatalf("after restoring the loss: %+v %v", res, err)
			}
		})
	}
}

// TestRestoreRaisesOnly checks Restore against Peek on every algorithm it
// raises, on both stores: a counter below counted is raised to it (capped
// at the capacity), one above is left alone, and restoring twice charges
// nothing twice.
func TestRestoreRaisesOnly(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	clk := newClock()
	for _, s := range []namedStore{
		{"memory", NewMemory(MemoryConfig{Now: clk.Now, Generations: true})},
		{"redis", func() Store { r := newRedisStore(c, clk); r.gens = true; return r }()},
	} {
		for _, l := range genLimits {
			t.Run(s.name+"/"+l.Name, func(t *testing.T) {
				it := []Item{{Limit: l, Key: "{r-" + l.Name + "}"}}
				rs := s.Store.(Restorer)
				capacity := l.Capacity()
				for _, step := range []struct{ counted, used int64 }{
					{capacity / 4, capacity / 4},
					{capacity / 4, capacity / 4},
					{capacity / 8, capacity / 4},
					{capacity / 2, capacity / 2},
					{2 * capacity, capacity},
				} {
					if err := rs.Restore(ctx, it, []int64{step.counted}); err != nil {
						t.Fatal(err)
					}
					res, err := s.Peek(ctx, it)
					if err != nil {
						t.Fatal(err)
					}
					if got := capacity - res.Items[0].Remaining; got != step.used {
						t.Fatalf("restore %d: used %d, want %d", step.counted, got, step.used)
					}
				}
			})
		}
		t.Run(s.name+"/invalid", func(t *testing.T) {
			rs := s.Store.(Restorer)
			conc := Limit{Name: "conc", Algorithm: Concurrency, Rate: 10, Period: time.Second}
			for _, tc := range []struct {
				items   []Item
				counted []int64
			}{
				{[]Item{{Limit: genLimits[0], Key: "{x}"}}, []int64{-1}},
				{[]Item{{Limit: genLimits[0], Key: "{x}"}}, nil},
				{[]Item{{Limit: conc, Key: "{x}"}}, []int64{1}},
			} {
				err := rs.Restore(ctx, tc.items, tc.counted)
				if !errors.Is(err, ErrInvalidCost) || IsStoreFailure(err) {
					t.Fatalf("Restore(%v, %v): %v, want ErrInvalidCost", tc.items, tc.counted, err)
				}
			}
			if err := rs.Restore(ctx, []Item{{Limit: conc, Key: "{x}"}}, []int64{0}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestGenerationsBatched races debits through a batching store with
// generations, on a restored tag and one stale tag in the same batches:
// the restored tag admits exactly its capacity less what was restored,
// and every debit of the stale tag is refused without touching it.
func TestGenerationsBatched(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, cfg := range []RedisConfig{{Generations: true}, {Generations: true, Sharded: true}, {Generations: true, MaxBatch: 1}} {
		t.Run(fmt.Sprintf("sharded=%v,MaxBatch=%d", cfg.Sharded, cfg.MaxBatch), func(t *testing.T) {
			r := newBatchStore(c, newClock(), cfg)
			items := []Item{
				{Limit: Limit{Name: "budget", Algorithm: FixedWindow, Rate: 700, Calendar: Month}, Key: "{ok}"},
				{Limit: Limit{Name: "tb", Rate: 900, Period: time.Hour}, Key: "{ok}:user=a"},
			}
			if err := r.Restore(ctx, items, []int64{100, 0}); err != nil {
				t.Fatal(err)
			}
			staleItems := []Item{{Limit: items[0].Limit, Key: "{gone}"}}
			done := make(chan int, 1)
			go func() {
				n := 0
				for i := range 200 {
					staleItems[0].Cost = 1
					_, err := r.Debit(ctx, fmt.Sprint("s", i), staleItems)
					if errors.Is(err, ErrStale) {
						n++
					}
				}
				done <- n
			}()
			admitted := raceDebits(t, r, items, 32)
			if n := <-done; n != 200 {
				t.Fatalf("%d of 200 debits of a stale tag refused as stale", n)
			}
			if admitted != 600 {
				t.Fatalf("admitted %d racing, want 600", admitted)
			}
			res, err := r.Peek(ctx, items)
			if err != nil || res.Items[0].Remaining != 0 || res.Items[1].Remaining != 300 {
				t.Fatalf("after the race: %+v %v", res, err)
			}
			if n, err := c.Exists(ctx, r.key(&staleItems[0])).Result(); err != nil || n != 0 {
				t.Fatalf("the stale tag's key exists: %d %v", n, err)
			}
		})
	}
}

// TestGenerationsCluster restores two tenants on a Redis Cluster, loses one
// primary's keys, and requires that only the tenant whose slot was on it
// is stale, and that it counts exactly after Restore.
func TestGenerationsCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	cc := cl.Client(t)
	ctx := context.Background()
	r := NewRedis(cc, patient(RedisConfig{Prefix: "gc:", Generations: true}))
	budget := Limit{Name: "budget", Algorithm: FixedWindow, Rate: 1000, Calendar: Month}
	global := Limit{Name: "global", Algorithm: FixedWindow, Rate: 5000, Period: time.Hour}
	request := func(tenant string, cost int64) []Item {
		return []Item{{Limit: budget, Key: "{" + tenant + "}", Cost: cost}, {Limit: global, Key: "all", Cost: cost}}
	}
	// Two tenants whose markers live on different primaries.
	tenants := []string{"t0"}
	for i := 1; len(tenants) < 2; i++ {
		name := fmt.Sprint("t", i)
		if slotNode(t, cl, cc, "gc:g:{"+name+"}") != slotNode(t, cl, cc, "gc:g:{t0}") {
			tenants = append(tenants, name)
		}
	}
	for _, tn := range tenants {
		_, err := r.Debit(ctx, "x-"+tn, request(tn, 1))
		wantStale(t, err, tn)
		if err := r.Restore(ctx, request(tn, 0)[:1], []int64{200}); err != nil {
			t.Fatal(err)
		}
		res, err := r.Debit(ctx, "a-"+tn, request(tn, 10))
		if err != nil || !res.Allowed || res.Items[0].Remaining != 790 {
			t.Fatalf("%s after the restore: %+v %v", tn, res, err)
		}
	}
	lost := slotNode(t, cl, cc, "gc:g:{"+tenants[1]+"}")
	n := redis.NewClient(&redis.Options{Addr: cl.Addrs[lost]})
	defer n.Close()
	if err := n.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := r.Debit(ctx, "b-"+tenants[0], request(tenants[0], 10))
	if err != nil || !res.Allowed || res.Items[0].Remaining != 780 {
		t.Fatalf("%s, on a primary that kept its keys: %+v %v", tenants[0], res, err)
	}
	_, err = r.Debit(ctx, "b-"+tenants[1], request(tenants[1], 10))
	wantStale(t, err, tenants[1])
	if err := r.Restore(ctx, request(tenants[1], 0)[:1], []int64{210}); err != nil {
		t.Fatal(err)
	}
	res, err = r.Debit(ctx, "c-"+tenants[1], request(tenants[1], 10))
	if err != nil || !res.Allowed || res.Items[0].Remaining != 780 {
		t.Fatalf("%s after restoring the loss: %+v %v", tenants[1], res, err)
	}
}

// slotNode returns the index of the primary that holds key.
func slotNode(t *testing.T, cl *redistest.Cluster, cc *redis.ClusterClient, key string) int {
	t.Helper()
	slot, err := cc.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return cl.Node(t, int(slot))
}

// TestRestoreCountersLeavesStale: RestoreCounters raises a stale tag's
// counters as Restore does and writes no marker, on both stores and
// through Leased: a debit of the tag still answers ErrStale and changes
// nothing, until a Restore of the tag marks it fresh with the counters
// raised. (A restore in several calls marks its tag in the last: one
// that marked it in the first let debits through on the counters of the
// calls after it at 0.)
func TestRestoreCountersLeavesStale(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	clk := newClock()
	day := genLimits[1]
	for _, s := range []namedStore{
		{"memory", NewMemory(MemoryConfig{Now: clk.Now, Generations: true})},
		{"redis", func() Store { r := newRedisStore(c, clk); r.gens = true; return r }()},
		{"leased", NewLeased(func() Store { r := newRedisStore(c, clk); r.gens = true; return r }(), LeasedConfig{Now: clk.Now})},
	} {
		t.Run(s.name, func(t *testing.T) {
			rs := s.Store.(Restorer)
			first := []Item{{Limit: day, Key: "{rc}:user=ann"}}
			last := []Item{{Limit: day, Key: "{rc}"}}
			_, err := s.Debit(ctx, "d0", []Item{{Limit: day, Key: "{rc}:user=ann", Cost: 1}})
			wantStale(t, err, "rc")
			if err := rs.RestoreCounters(ctx, first, []int64{400}); err != nil {
				t.Fatal(err)
			}
			_, err = s.Debit(ctx, "d1", []Item{{Limit: day, Key: "{rc}", Cost: 1}})
			wantStale(t, err, "rc")
			if err := rs.Restore(ctx, last, []int64{450}); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				it   Item
				want int64
			}{{first[0], 100}, {last[0], 50}} {
				res, err := s.Peek(ctx, []Item{tc.it})
				if err != nil {
					t.Fatal(err)
				}
				if got := res.Items[0].Remaining; got != tc.want {
					t.Errorf("%s after the restore: %d remaining, want %d", tc.it.Key, got, tc.want)
				}
			}
		})
	}
}

// TestGenerationsAtkNoFalseStale: while calls debit a restored tag
// (advancing its marker, and the value this store has seen), calls that
// name it beside a tag never restored are stale for that other tag
// alone. Before, a stale reply was judged by the value seen when it came
// back rather than by the one its call sent: the busy tag, whose marker
// others had advanced meanwhile, read as stale too, and the gate
// restored it again for each (a rate limit domain's tag, in every call,
// restored 6 times as 1,000 tenants came back after a loss).
func TestGenerationsAtkNoFalseStale(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, cfg := range []RedisConfig{{Generations: true}, {Generations: true, MaxBatch: 1}} {
		t.Run(fmt.Sprintf("MaxBatch=%d", cfg.MaxBatch), func(t *testing.T) {
			cfg.Prefix = fmt.Sprintf("falsestale%d:", cfg.MaxBatch)
			r := NewRedis(c, patient(cfg))
			day := Limit{Name: "day", Algorithm: FixedWindow, Rate: 1 << 40, Period: 24 * time.Hour}
			shared := Item{Limit: day, Key: "{shared}:a", Cost: 1}
			if err := r.Restore(ctx, []Item{shared}, []int64{0}); err != nil {
				t.Fatal(err)
			}
			var (
				wg    sync.WaitGroup
				stop  atomic.Bool
				wrong atomic.Int64
				other atomic.Int64
			)
			for w := range 8 {
				wg.Add(1)
				go func() { // the busy tag's own debits
					defer wg.Done()
					for i := 0; !stop.Load(); i++ {
						if _, err := r.Debit(ctx, fmt.Sprintf("busy-%d-%d", w, i), []Item{shared}); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			var fresh sync.WaitGroup
			for w := range 8 {
				fresh.Add(1)
				go func() { // first calls of tags never restored
					defer fresh.Done()
					for i := range 100 {
						tag := fmt.Sprintf("new-%d-%d", w, i)
						_, err := r.Debit(ctx, "first-"+tag, []Item{{Limit: day, Key: "{" + tag + "}:x", Cost: 1}, shared})
						var se *StaleError
						if !errors.As(err, &se) {
							t.Errorf("the first call of %s: %v, want stale", tag, err)
							return
						}
						other.Add(1)
						if slices.Contains(se.Tags, "shared") {
							wrong.Add(1)
						}
					}
				}()
			}
			fresh.Wait()
			stop.Store(true)
			wg.Wait()
			if n := wrong.Load(); n > 0 {
				t.Fatalf("%d of %d stale replies named the restored, busy tag stale", n, other.Load())
			}
		})
	}
}
