package weighted

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// The Redis benchmarks run 64 parallel clients (b.SetParallelism) against
// one local redis-server, each client on its own key, and report
// decisions/s and the server's CPU per script call (usec_per_call of
// EVALSHA in INFO commandstats). Compare them within one run: the ratio to
// BenchmarkRedisRateBaseline is what holds on a shared machine.

const benchClients = 64

// benchLimit is the limit of each algorithm in the benchmarks: generous
// enough that most debits are admitted at the rates one local Redis
// reaches; a sliding log holds at most 100 entries per key and a
// concurrency limit at most 100 leases of 50ms, since their cost grows with
// the entries a key holds.
func benchLimit(a Algorithm, i int) Limit {
	l := Limit{Name: fmt.Sprintf("l%d", i), Algorithm: a, Rate: 100_000, Period: time.Second}
	switch a {
	case SlidingLog:
		l.Rate, l.Period = 100, 100*time.Millisecond
	case Concurrency:
		l.Rate, l.Period = 100, 50*time.Millisecond
	}
	return l
}

func benchRedis(b *testing.B) *redis.Client {
	b.Helper()
	opt, err := redis.ParseURL(redistest.New(b).URL)
	if err != nil {
		b.Fatal(err)
	}
	opt.PoolSize = 2 * benchClients
	c := redis.NewClient(opt)
	b.Cleanup(func() { c.Close() })
	return c
}

// redisCPU resets the server's command statistics and returns a function
// that reports the server's µs per EVALSHA since then.
func redisCPU(b *testing.B, c *redis.Client) func() {
	b.Helper()
	ctx := context.Background()
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	return func() {
		b.ReportMetric(evalshaUsecPerCall(b, c), "redis-µs/call")
	}
}

func reportRate(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkRedisDebit debits one or three limits of each algorithm per call,
// the three sharing a hash tag.
func BenchmarkRedisDebit(b *testing.B) {
	c := benchRedis(b)
	for a := Algorithm(0); a < numAlgorithms; a++ {
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("%s/%dkeys", a, n), func(b *testing.B) {
				r := NewRedis(c, patient(RedisConfig{}))
				var client atomic.Int64
				done := redisCPU(b, c)
				b.SetParallelism(benchClients / runtime.GOMAXPROCS(0))
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					key := "{tenant-" + strconv.FormatInt(client.Add(1), 10) + "}"
					items := make([]Item, n)
					for i := range items {
						items[i] = Item{Limit: benchLimit(a, i), Key: key, Cost: 1}
					}
					id := 0
					for pb.Next() {
						id++
						if _, err := r.Debit(ctx, key+strconv.Itoa(id), items); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.StopTimer()
				done()
				reportRate(b)
			})
		}
	}
}

// BenchmarkRedisRateBaseline is go-redis/redis_rate v10's AllowN under the
// same clients, keys and limit as BenchmarkRedisDebit's token bucket.
func BenchmarkRedisRateBaseline(b *testing.B) {
	c := benchRedis(b)
	limiter := redis_rate.NewLimiter(c)
	limit := redis_rate.Limit{Rate: 100_000, Burst: 100_000, Period: time.Second}
	var client atomic.Int64
	done := redisCPU(b, c)
	b.SetParallelism(benchClients / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		key := "{tenant-" + strconv.FormatInt(client.Add(1), 10) + "}"
		for pb.Next() {
			if _, err := limiter.AllowN(ctx, key, limit, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	done()
	reportRate(b)
}

// BenchmarkMemoryDebit debits one limit per call on the in-memory store,
// each parallel goroutine on its own key.
func BenchmarkMemoryDebit(b *testing.B) {
	for a := Algorithm(0); a < numAlgorithms; a++ {
		b.Run(a.String(), func(b *testing.B) {
			m := NewMemory(MemoryConfig{})
			var client atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				key := "tenant-" + strconv.FormatInt(client.Add(1), 10)
				items := []Item{{Limit: benchLimit(a, 0), Key: key, Cost: 1}}
				var ids [1024]string
				for i := range ids {
					ids[i] = "r" + strconv.Itoa(i)
				}
				id := 0
				for pb.Next() {
					id++
					if _, err := m.Debit(ctx, ids[id%len(ids)], items); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkMemoryDebitFixedClock is BenchmarkMemoryDebit's token bucket
// with a clock that does not read the system time, to separate the store's
// own cost from time.Now's, which is slow on some virtual machines.
func BenchmarkMemoryDebitFixedClock(b *testing.B) {
	now := time.Now()
	m := NewMemory(MemoryConfig{Now: func() time.Time { return now }})
	var client atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		key := "tenant-" + strconv.FormatInt(client.Add(1), 10)
		items := []Item{{Limit: benchLimit(TokenBucket, 0), Key: key, Cost: 1}}
		for pb.Next() {
			if _, err := m.Debit(ctx, "r", items); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkTimeNow measures time.Now on this machine, for reading the
// memory benchmarks.
func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		_ = time.Now()
	}
}

// BenchmarkRedisCPU measures the Redis CPU per call of one debit of one and
// of three token buckets (sharing a hash tag), of one fixed window, of one
// sliding window, of one fixed window on calendar months and of
// redis_rate's AllowN,
// one client at a time so that the server is never preempted by its own
// clients. Each iteration runs 2000 calls of each, interleaved, resetting
// INFO commandstats before each batch; the reported figures are the
// smallest usec_per_call of EVALSHA over the iterations (the least
// disturbed by other processes), their ratios, and the smallest wall time
// of a call from the client (round trip, client and server work). Run it
// with -benchtime=15x or so.
func BenchmarkRedisCPU(b *testing.B) {
	c := benchRedis(b)
	ctx := context.Background()
	r := NewRedis(c, patient(RedisConfig{}))
	gens := NewRedis(c, patient(RedisConfig{Prefix: "gen:", Generations: true}))
	limiter := redis_rate.NewLimiter(c)
	limit := redis_rate.Limit{Rate: 100_000, Burst: 100_000, Period: time.Second}
	items := func(n int) []Item {
		var items []Item
		for i := range n {
			items = append(items, Item{Limit: benchLimit(TokenBucket, i), Key: fmt.Sprintf("{cpu-%d}", n), Cost: 1})
		}
		return items
	}
	one, three := items(1), items(3)
	fixed := []Item{{Limit: benchLimit(FixedWindow, 0), Key: "{cpu-fw}", Cost: 1}}
	sliding := []Item{{Limit: benchLimit(SlidingWindow, 0), Key: "{cpu-sw}", Cost: 1}}
	month := []Item{{Limit: Limit{Name: "month", Algorithm: FixedWindow, Rate: 1 << 40, Calendar: Month}, Key: "{cpu-fwm}", Cost: 1}}
	calls := []struct {
		name string
		call func() error
	}{
		{"redis_rate", func() error { _, err := limiter.AllowN(ctx, "{cpu-rr}", limit, 1); return err }},
		{"1key", func() error { _, err := r.Debit(ctx, "id", one); return err }},
		{"3keys", func() error { _, err := r.Debit(ctx, "id", three); return err }},
		{"fixed", func() error { _, err := r.Debit(ctx, "id", fixed); return err }},
		{"sliding", func() error { _, err := r.Debit(ctx, "id", sliding); return err }},
		{"month", func() error { _, err := r.Debit(ctx, "id", month); return err }},
		// One token bucket with generations: a marker read and advanced.
		{"1key-gen", func() error { _, err := gens.Debit(ctx, "id", one); return err }},
	}
	if err := gens.Restore(ctx, one, []int64{0}); err != nil {
		b.Fatal(err)
	}
	best := make([]float64, len(calls))
	wall := make([]time.Duration, len(calls))
	for b.Loop() {
		for k, cl := range calls {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			begin := time.Now()
			for range 2000 {
				if err := cl.call(); err != nil {
					b.Fatal(err)
				}
			}
			if d := time.Since(begin) / 2000; wall[k] == 0 || d < wall[k] {
				wall[k] = d
			}
			us := evalshaUsecPerCall(b, c)
			if best[k] == 0 || us < best[k] {
				best[k] = us
			}
		}
	}
	for k, cl := range calls {
		b.ReportMetric(best[k], cl.name+"-µs/call")
		b.ReportMetric(float64(wall[k].Nanoseconds())/1000, cl.name+"-µs/round-trip")
	}
	b.ReportMetric(best[1]/best[0], "1key/redis_rate")
	b.ReportMetric(best[2]/best[0], "3keys/redis_rate")
	b.ReportMetric(best[6]/best[1], "1key-gen/1key")
	b.ReportMetric(float64(wall[6])/float64(wall[1]), "1key-gen/1key-round-trip")
}

func evalshaUsecPerCall(b *testing.B, c *redis.Client) float64 {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					x, err := strconv.ParseFloat(v, 64)
					if err != nil {
						b.Fatal(err)
					}
					return x
				}
			}
		}
	}
	b.Fatal("no cmdstat_evalsha in INFO commandstats")
	return 0
}

// BenchmarkRedisInterleaved runs redis_rate's AllowN and debits of one and
// of three token buckets (sharing a hash tag) in turns of 250ms, 64
// parallel clients each on its own key, for as many turns as -benchtime
// gives (-benchtime=12x: 12 turns of each). Taking turns, they meet the same
// load from other processes, so their ratios hold on a shared machine. It
// reports each one's decisions/s and Redis µs per EVALSHA (INFO
// commandstats) over all its turns, and the ratios to redis_rate. Batching
// is off (MaxBatch 1), so that one script call is compared with one:
// BenchmarkRedisBatch measures batching.
func BenchmarkRedisInterleaved(b *testing.B) {
	c := benchRedis(b)
	r := NewRedis(c, patient(RedisConfig{MaxBatch: 1}))
	limiter := redis_rate.NewLimiter(c)
	limit := redis_rate.Limit{Rate: 100_000, Burst: 100_000, Period: time.Second}
	items := func(client, n int) []Item {
		var items []Item
		for i := range n {
			items = append(items, Item{Limit: benchLimit(TokenBucket, i), Key: fmt.Sprintf("{il-%d-%d}", n, client), Cost: 1})
		}
		return items
	}
	type variant struct {
		name string
		call func(ctx context.Context, client int, items []Item) error
		n    int // items per debit; 0 for redis_rate
	}
	variants := []variant{
		{"redis_rate", func(ctx context.Context, client int, _ []Item) error {
			_, err := limiter.AllowN(ctx, "{il-rr-"+strconv.Itoa(client)+"}", limit, 1)
			return err
		}, 0},
		{"1key", func(ctx context.Context, _ int, items []Item) error { _, err := r.Debit(ctx, "id", items); return err }, 1},
		{"3keys", func(ctx context.Context, _ int, items []Item) error { _, err := r.Debit(ctx, "id", items); return err }, 3},
	}
	type total struct {
		calls    int64
		elapsed  time.Duration
		usec     float64
		cmdCalls float64
	}
	totals := make([]total, len(variants))
	ctx := context.Background()
	for b.Loop() {
		for k, v := range variants {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			var calls atomic.Int64
			var wg sync.WaitGroup
			begin := time.Now()
			deadline := begin.Add(250 * time.Millisecond)
			for client := range benchClients {
				wg.Go(func() {
					its := items(client, v.n)
					for time.Now().Before(deadline) {
						if err := v.call(ctx, client, its); err != nil {
							b.Error(err)
							return
						}
						calls.Add(1)
					}
				})
			}
			wg.Wait()
			totals[k].elapsed += time.Since(begin)
			totals[k].calls += calls.Load()
			n, usec := evalshaStats(b, c)
			totals[k].cmdCalls += n
			totals[k].usec += usec
		}
	}
	rate := func(k int) float64 { return float64(totals[k].calls) / totals[k].elapsed.Seconds() }
	cpu := func(k int) float64 { return totals[k].usec / totals[k].cmdCalls }
	for k, v := range variants {
		b.ReportMetric(rate(k), v.name+"-decisions/s")
		b.ReportMetric(cpu(k), v.name+"-redis-µs/call")
	}
	for k := 1; k < len(variants); k++ {
		b.ReportMetric(rate(k)/rate(0), variants[k].name+"/redis_rate-decisions")
		b.ReportMetric(cpu(k)/cpu(0), variants[k].name+"/redis_rate-cpu")
	}
}

// evalshaStats returns the calls and usec of EVALSHA since the last CONFIG
// RESETSTAT.
func evalshaStats(b *testing.B, c *redis.Client) (calls, usec float64) {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					calls, _ = strconv.ParseFloat(v, 64)
				}
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					usec, _ = strconv.ParseFloat(v, 64)
				}
			}
		}
	}
	return calls, usec
}

// BenchmarkRedisBatch runs what the proxy does per request, a Debit of
// three token buckets sharing a hash tag then its Settle, from 32
// goroutines on the same keys (one tenant), with batching on (the
// default), on with two script calls in flight per queue, and off
// (MaxBatch 1), in turns of 250ms like BenchmarkRedisInterleaved
// (-benchtime=8x: 8 turns of each), each turn on an empty Redis. A
// decision is one Debit and its Settle.
// It reports, for each, ns of wall time per decision, the Redis server's
// µs of EVALSHA per decision (INFO commandstats), this process's CPU µs
// per decision (getrusage: go-redis and the store, the client side),
// script calls per decision, and the ratios of batching on to off.
func BenchmarkRedisBatch(b *testing.B) {
	const clients = 32
	c := benchRedis(b)
	limit := func(i int) Limit {
		return Limit{Name: fmt.Sprintf("l%d", i), Rate: 10_000_000, Period: time.Second}
	}
	items := []Item{{Limit: limit(0), Key: "{acme}", Cost: 1}, {Limit: limit(1), Key: "{acme}", Cost: 1}, {Limit: limit(2), Key: "{acme}", Cost: 1}}
	actual := []int64{2, 2, 2}
	type variant struct {
		name string
		r    *Redis
	}
	batched2 := NewRedis(c, patient(RedisConfig{Prefix: "b2:"}))
	batched2.maxInFlight = 2
	variants := []variant{
		{"batched", NewRedis(c, patient(RedisConfig{Prefix: "b1:"}))},
		{"batched-2inflight", batched2},
		{"unbatched", NewRedis(c, patient(RedisConfig{Prefix: "u:", MaxBatch: 1}))},
	}
	type total struct {
		decisions int64
		elapsed   time.Duration
		cpu       time.Duration
		calls     float64
		usec      float64
	}
	totals := make([]total, len(variants))
	ctx := context.Background()
	var seq atomic.Int64
	for b.Loop() {
		for k, v := range variants {
			// Each turn starts from an empty Redis: a settled id's key
			// stays for SettleTTL, and the keys of the turns before,
			// more after faster ones, would slow the next one's commands.
			if err := c.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			var decisions atomic.Int64
			var wg sync.WaitGroup
			cpu0 := processCPU(b)
			begin := time.Now()
			deadline := begin.Add(250 * time.Millisecond)
			for range clients {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						id := "r" + strconv.FormatInt(seq.Add(1), 10)
						res, err := v.r.Debit(ctx, id, items)
						if err == nil && res.Allowed {
							err = v.r.Settle(ctx, id, items, actual)
						}
						if err != nil {
							b.Error(err)
							return
						}
						decisions.Add(1)
					}
				})
			}
			wg.Wait()
			totals[k].elapsed += time.Since(begin)
			totals[k].cpu += processCPU(b) - cpu0
			totals[k].decisions += decisions.Load()
			n, usec := evalshaStats(b, c)
			totals[k].calls += n
			totals[k].usec += usec
		}
	}
	per := func(k int, x float64) float64 { return x / float64(totals[k].decisions) }
	ns := func(k int) float64 { return per(k, float64(totals[k].elapsed.Nanoseconds())) }
	redisUS := func(k int) float64 { return per(k, totals[k].usec) }
	clientUS := func(k int) float64 { return per(k, float64(totals[k].cpu.Microseconds())) }
	for k, v := range variants {
		b.ReportMetric(ns(k), v.name+"-ns/decision")
		b.ReportMetric(redisUS(k), v.name+"-redis-µs/decision")
		b.ReportMetric(clientUS(k), v.name+"-client-µs/decision")
		b.ReportMetric(per(k, totals[k].calls), v.name+"-calls/decision")
	}
	off := len(variants) - 1
	for k := range off {
		b.ReportMetric(ns(k)/ns(off), variants[k].name+"/unbatched-ns")
		b.ReportMetric(redisUS(k)/redisUS(off), variants[k].name+"/unbatched-redis")
		b.ReportMetric(clientUS(k)/clientUS(off), variants[k].name+"/unbatched-client")
	}
}

// processCPU returns the CPU time this process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHotKey debits one hot key (a token bucket of 100,000 a second,
// burst 10,000) from 64 goroutines through one replica, strictly and
// leased (at most 1,000 units, a 1% share, held for 2 s). It reports the
// script calls Redis ran per 1,000 decisions (strictly, concurrent
// debits share script calls: store_calls counts the debits sent) and the
// over-admission: the
// units admitted beyond what the bucket allows over the run, over that
// allowance.
func BenchmarkHotKey(b *testing.B) {
	c := benchRedis(b)
	for _, leased := range []bool{false, true} {
		name := "strict"
		if leased {
			name = "leased"
		}
		b.Run(name, func(b *testing.B) {
			lim := Limit{Name: fmt.Sprintf("hot%d", prefixSeq.Add(1)), Algorithm: TokenBucket, Rate: 100_000, Period: time.Second, Burst: 10_000}
			if leased {
				lim.Lease = Lease{Max: 1_000, TTL: 2 * time.Second}
			}
			r := NewRedis(c, patient(RedisConfig{}))
			l := NewLeased(r, LeasedConfig{})
			defer l.Close(context.Background())
			var admitted, seq atomic.Int64
			b.SetParallelism(benchClients / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			calls0 := r.scriptCalls.Load()
			begin := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				items := []Item{{Limit: lim, Key: "{hot}", Cost: 1}}
				var ids [1024]string
				for i := range ids {
					ids[i] = "h" + strconv.FormatInt(seq.Add(1), 36)
				}
				n := 0
				for pb.Next() {
					n++
					res, err := l.Debit(ctx, ids[n%len(ids)], items)
					if err != nil {
						b.Error(err)
						return
					}
					if res.Allowed {
						admitted.Add(1)
					}
				}
			})
			b.StopTimer()
			elapsed := time.Since(begin)
			calls := r.scriptCalls.Load() - calls0
			allow := float64(lim.Burst) + elapsed.Seconds()*float64(lim.Rate)
			b.ReportMetric(float64(calls)*1000/float64(b.N), "redis_calls/1000decisions")
			b.ReportMetric(float64(l.Stats().Calls)*1000/float64(b.N), "store_calls/1000decisions")
			b.ReportMetric(max(0, float64(admitted.Load())-allow)/allow, "overadmit/limit")
			b.ReportMetric(float64(admitted.Load())/elapsed.Seconds(), "admitted/s")
			reportRate(b)
		})
	}
}

// BenchmarkLeasedHit decides and settles a request of three leased items
// (the proxy's three limits) from leases held, on one goroutine and from
// 64: the decision's local part, which makes no store call and allocates
// nothing.
//
//	go test -run XXX -bench LeasedHit -benchmem ./weighted/
func BenchmarkLeasedHit(b *testing.B) {
	for _, par := range []bool{false, true} {
		name := "serial"
		if par {
			name = "parallel"
		}
		b.Run(name, func(b *testing.B) {
			l, items := hotLease(b, newClock())
			calls := l.Stats().Calls
			// Each goroutine has its own ids, made before the timer starts.
			const perG = 256
			all := make([]string, 4*benchClients*perG)
			for i := range all {
				all[i] = "b" + strconv.Itoa(i)
			}
			var seq atomic.Int64
			b.ReportAllocs()
			work := func(next func() bool) {
				ctx := context.Background()
				var states [4]ItemState
				actual := [...]int64{3, 3, 3}
				g := int(seq.Add(1)-1) % (len(all) / perG)
				ids := all[g*perG : (g+1)*perG]
				for n := 0; next(); n++ {
					id := ids[n%len(ids)]
					if _, err := l.DebitInto(ctx, id, items, states[:]); err != nil {
						b.Error(err)
						return
					}
					if err := l.Settle(ctx, id, items, actual[:]); err != nil {
						b.Error(err)
						return
					}
				}
			}
			b.ResetTimer()
			if par {
				b.SetParallelism(benchClients / runtime.GOMAXPROCS(0))
				b.RunParallel(func(pb *testing.PB) { work(pb.Next) })
			} else {
				n := 0
				work(func() bool { n++; return n <= b.N })
			}
			b.StopTimer()
			b.ReportMetric(float64(l.Stats().Calls-calls)*1000/float64(b.N), "store_calls/1000decisions")
		})
	}
}

// BenchmarkRenew renews a reservation that holds a concurrency limit (and
// a token bucket, which Renew skips), each parallel client its own on its
// own key: on Redis (a moved lease: the record's GET, a ZSCORE, a ZADD and
// a PTTL) and on Memory. A renewal of an hour's lease moves it every time.
func BenchmarkRenew(b *testing.B) {
	c := benchRedis(b)
	conc := Limit{Name: "streams", Algorithm: Concurrency, Rate: 100, Period: time.Hour}
	tb := benchLimit(TokenBucket, 1)
	for _, name := range []string{"redis", "memory"} {
		b.Run(name, func(b *testing.B) {
			var s Store = NewMemory(MemoryConfig{})
			done := func() {}
			if name == "redis" {
				s = NewRedis(c, patient(RedisConfig{}))
				done = redisCPU(b, c)
				b.SetParallelism(benchClients / runtime.GOMAXPROCS(0))
			}
			var client atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				key := "{tenant-" + strconv.FormatInt(client.Add(1), 10) + "}"
				items := []Item{{Limit: tb, Key: key, Cost: 1}, {Limit: conc, Key: key, Cost: 1}}
				if _, err := s.Debit(ctx, key, items); err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					if err := s.Renew(ctx, key, items); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			done()
		})
	}
}
