package weighted

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// leaseLimits are the algorithms that take leases, each with a capacity
// small enough for a test's demand to exceed it many times.
func leaseLimits() []Limit {
	return []Limit{
		{Name: "tb", Algorithm: TokenBucket, Rate: 200, Period: time.Second, Burst: 100},
		{Name: "gcra", Algorithm: GCRA, Rate: 200, Period: time.Second, Burst: 100},
		{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: 500 * time.Millisecond},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 100, Period: 500 * time.Millisecond},
		{Name: "log", Algorithm: SlidingLog, Rate: 100, Period: 500 * time.Millisecond},
		{Name: "month", Algorithm: FixedWindow, Calendar: Month, Rate: 5000},
	}
}

// leasePolicies are the lease policies the property tests run: off, and
// small and large shares with short and long TTLs.
var leasePolicies = []struct {
	name  string
	share int64 // Max = capacity / share; 0 is off
	ttl   time.Duration
}{
	{"strict", 0, 0},
	{"share10-ttl300ms", 10, 300 * time.Millisecond},
	{"share2-ttl2s", 2, 2 * time.Second},
	{"share4-ttl50ms", 4, 50 * time.Millisecond},
}

type admission struct {
	t    time.Time
	cost int64
}

// leaseRun is one random arrival pattern played on N replicas sharing a
// store: which decisions came out, and what was admitted when.
type leaseRun struct {
	decisions []bool
	admitted  []admission
	killed    int64 // unspent units of the replica killed, when it died
	// unreported is what the replica killed had spent and not reported:
	// what the store gives back at its leases' TTL beyond their unspent.
	unreported int64
	replicas   []*Leased
	stats      LeaseStats
}

// playLeases plays seed's pattern: steps of a random advance of the clock,
// a random replica and a random cost; a few settlements at the reserved
// cost and sweeps; replica 0 killed (never closed) halfway when kill is
// set. Replicas take their leases inline, so the run is deterministic.
func playLeases(t *testing.T, seed uint64, lim Limit, n int, kill bool, stores func(i int) Store, clk *clock) leaseRun {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	var run leaseRun
	for i := range n {
		l := NewLeased(stores(i), LeasedConfig{Now: clk.Now, Sweep: time.Hour})
		l.inline = true
		run.replicas = append(run.replicas, l)
	}
	t.Cleanup(func() {
		for _, l := range run.replicas {
			l.stopped.Do(func() { close(l.stop) })
			l.wg.Wait()
		}
	})
	maxCost := max(1, lim.Capacity()/100)
	type held struct {
		id   string
		item Item
	}
	open := make([][]held, n)
	dead := make([]bool, n)
	const steps = 2000
	for step := range steps {
		clk.Advance(time.Duration(rng.IntN(1500)) * time.Microsecond)
		r := rng.IntN(n)
		if dead[r] {
			r = (r + 1) % n
		}
		if kill && step == steps/2 {
			dead[0] = true
			for _, st := range run.replicas[0].keys {
				st.mu.Lock()
				st.expire(clk.Now())
				run.killed += st.avail()
				for _, h := range append(st.leases, st.ended...) {
					run.unreported += h.used - h.reported
				}
				st.mu.Unlock()
			}
			if r == 0 {
				r = 1
			}
		}
		l := run.replicas[r]
		switch op := rng.IntN(20); {
		case op == 0 && len(open[r]) > 0:
			h := open[r][0]
			open[r] = open[r][1:]
			if err := l.Settle(ctx, h.id, []Item{h.item}, []int64{h.item.Cost}); err != nil {
				t.Fatal(err)
			}
		case op == 1:
			l.sweepOnce(ctx)
		default:
			it := Item{Limit: lim, Key: "hot", Cost: 1 + rng.Int64N(maxCost)}
			id := fmt.Sprintf("r%d-%d", r, step)
			res, err := l.Debit(ctx, id, []Item{it})
			if err != nil {
				t.Fatal(err)
			}
			run.decisions = append(run.decisions, res.Allowed)
			if res.Allowed {
				run.admitted = append(run.admitted, admission{clk.Now(), it.Cost})
				open[r] = append(open[r], held{id, it})
			} else if res.RetryAfter <= 0 {
				t.Fatalf("step %d: a refusal without RetryAfter: %+v", step, res)
			}
		}
	}
	for _, l := range run.replicas {
		s := l.Stats()
		run.stats.Local += s.Local
		run.stats.Acquired += s.Acquired
		run.stats.Calls += s.Calls
	}
	return run
}

// checkBound checks what run admitted against the limit and the
// over-admission bound Leased states: slack over any interval for meters
// and logs (n replicas times Lease.Max, and Lease.Max more per replica
// killed), dead per window (Lease.Max per replica killed).
func checkBound(t *testing.T, lim Limit, run leaseRun, slack, dead int64) {
	t.Helper()
	adm := run.admitted
	if len(adm) == 0 {
		t.Fatal("nothing admitted")
	}
	end := adm[len(adm)-1].t
	switch lim.Algorithm {
	case TokenBucket, GCRA:
		// Over [a, end] for every admission a: at most the capacity,
		// the refill over the interval, and the slack.
		var sum int64
		for i := len(adm) - 1; i >= 0; i-- {
			sum += adm[i].cost
			refill := (int64(end.Sub(adm[i].t))*lim.Rate + int64(lim.Period) - 1) / int64(lim.Period)
			allow := lim.Capacity() + refill
			if i == 0 {
				slack = dead // from the start, nothing was leased before
			}
			if sum > allow+slack {
				t.Fatalf("admitted %d in [%s, end], strictly %d, bound %d", sum, adm[i].t.Sub(start), allow, allow+slack)
			}
		}
	case SlidingLog:
		for i := range adm {
			var sum int64
			for j := i; j >= 0 && adm[i].t.Sub(adm[j].t) < lim.Period; j-- {
				sum += adm[j].cost
			}
			if sum > lim.Rate+slack {
				t.Fatalf("admitted %d in the period ending %s, bound %d", sum, adm[i].t.Sub(start), lim.Rate+slack)
			}
		}
	case FixedWindow, SlidingWindow:
		per := map[int64]int64{}
		for _, a := range adm {
			w := int64(0) // a month: the run is within one
			if lim.Calendar == NoCalendar {
				w = a.t.UnixMicro() / lim.Period.Microseconds()
			}
			per[w] += a.cost
			if per[w] > lim.Rate+dead {
				t.Fatalf("window %d admitted %d, capacity %d, bound %d", w, per[w], lim.Rate, lim.Rate+dead)
			}
		}
	}
}

// TestLeasedBound plays random arrival patterns on three replicas sharing
// one real Redis, and the same on Memory: for every algorithm and lease
// policy, what is admitted stays within the stated bound (exactly the
// limit with leases off), one replica killed holding leases or not, and
// both stores make the same decisions.
func TestLeasedBound(t *testing.T) {
	c := testRedis(t)
	const n = 3
	for _, base := range leaseLimits() {
		for _, pol := range leasePolicies {
			for _, kill := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/kill=%t", base.Name, pol.name, kill)
				t.Run(name, func(t *testing.T) {
					lim := base
					if pol.share > 0 {
						lim.Lease = Lease{Max: lim.Capacity() / pol.share, TTL: pol.ttl}
					}
					for seed := range uint64(2) {
						clk := newClock()
						mem := NewMemory(MemoryConfig{Now: clk.Now})
						memRun := playLeases(t, seed, lim, n, kill, func(int) Store { return mem }, clk)
						prefix := fmt.Sprintf("lb%d:", prefixSeq.Add(1))
						clk = newClock()
						redisRun := playLeases(t, seed, lim, n, kill, func(int) Store {
							r := NewRedis(c, patient(RedisConfig{Prefix: prefix}))
							r.now = clk.Now
							return r
						}, clk)
						if !slices.Equal(memRun.decisions, redisRun.decisions) {
							t.Fatalf("seed %d: Memory and Redis decide differently", seed)
						}
						var dead int64
						if kill {
							dead = lim.Lease.Max
						}
						checkBound(t, lim, redisRun, n*lim.Lease.Max+dead, dead)
						if lim.Lease.On() && redisRun.stats.Local == 0 {
							t.Fatalf("seed %d: no decision was taken in process: %+v", seed, redisRun.stats)
						}
						if kill && lim.Lease.On() && redisRun.killed > lim.Lease.Max {
							t.Fatalf("the killed replica held %d unspent, more than Lease.Max %d", redisRun.killed, lim.Lease.Max)
						}
						if redisRun.unreported > lim.Lease.Max {
							t.Fatalf("the killed replica spent %d unreported, more than Lease.Max %d", redisRun.unreported, lim.Lease.Max)
						}
					}
				})
			}
		}
	}
}

// TestLeasedExact drains a limit that does not refill, within one window,
// on Memory and on a real Redis at the same times: strictly, exactly its
// capacity is admitted; with leases, never more, and once the replicas
// return their leases (Close), a last replica gets the rest, so that the
// total is again exactly the capacity. With a replica killed instead,
// what it held unspent is missing until its leases' TTL; then the store
// gives back what it had not reported spent, and the total is the
// capacity plus what the killed replica spent unreported, at most
// Lease.Max.
func TestLeasedExact(t *testing.T) {
	c := testRedis(t)
	const ttl = 100 * time.Millisecond
	for _, base := range leaseLimits() {
		for _, pol := range leasePolicies {
			for _, kill := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/kill=%t", base.Name, pol.name, kill), func(t *testing.T) {
					lim := base
					if lim.Algorithm <= GCRA {
						lim.Rate, lim.Period = 1, time.Hour
					}
					if pol.share > 0 {
						lim.Lease = Lease{Max: lim.Capacity() / pol.share, TTL: ttl}
					}
					clk := newClock()
					mem := NewMemory(MemoryConfig{Now: clk.Now})
					memTotal := drainExact(t, lim, kill, clk, func() Store { return mem })
					clk = newClock()
					prefix := fmt.Sprintf("lx%d:", prefixSeq.Add(1))
					redisTotal := drainExact(t, lim, kill, clk, func() Store {
						r := NewRedis(c, patient(RedisConfig{Prefix: prefix}))
						r.now = clk.Now
						return r
					})
					if memTotal != redisTotal {
						t.Fatalf("Memory admitted %d in all, Redis %d", memTotal, redisTotal)
					}
				})
			}
		}
	}
}

// drainExact is TestLeasedExact on one store, and returns the total
// admitted.
func drainExact(t *testing.T, lim Limit, kill bool, clk *clock, newStore func() Store) int64 {
	t.Helper()
	ctx := context.Background()
	var reps []*Leased
	for range 3 {
		l := NewLeased(newStore(), LeasedConfig{Now: clk.Now, Sweep: time.Hour})
		l.inline = true
		reps = append(reps, l)
	}
	var admitted, seq int64
	debit := func(l *Leased) bool {
		seq++
		res, err := l.Debit(ctx, fmt.Sprint("x", seq), []Item{{Limit: lim, Key: "k", Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
		}
		return res.Allowed
	}
	// Drain from all three, 20µs apart: within one window, and no meter
	// refills; the killed replica dies two thirds of the way, holding leases.
	// lost is what it held unspent; unreported what it spent that the
	// store had not heard of.
	var lost, unreported int64
	live := reps
	step := 20 * time.Microsecond
	if lim.Capacity() > 1000 {
		step = 2 * time.Microsecond // a month: within a TTL all the same
	}
	for i := range 4 * lim.Capacity() {
		if kill && i == lim.Capacity()*2/3 {
			t.Logf("at the kill: %+v", reps[0].Stats())
			for _, st := range reps[0].keys {
				st.expire(clk.Now())
				lost += st.avail()
				for _, h := range append(st.leases, st.ended...) {
					unreported += h.used - h.reported
				}
			}
			if unreported > lim.Lease.Max {
				t.Fatalf("the killed replica spent %d unreported, more than Lease.Max %d", unreported, lim.Lease.Max)
			}
			live = reps[1:]
		}
		clk.Advance(step)
		debit(live[i%int64(len(live))])
	}
	reps = live
	if admitted > lim.Capacity() {
		t.Fatalf("admitted %d, capacity %d", admitted, lim.Capacity())
	}
	if !lim.Lease.On() && admitted != lim.Capacity() {
		t.Fatalf("strict: admitted %d, want exactly %d", admitted, lim.Capacity())
	}
	for _, l := range reps {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	drain := func() {
		last := NewLeased(newStore(), LeasedConfig{Now: clk.Now, Sweep: time.Hour})
		for debit(last) {
		}
		if err := last.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	drain()
	if admitted != lim.Capacity()-lost {
		t.Fatalf("admitted %d in all, want the capacity %d less %d held by the killed replica", admitted, lim.Capacity(), lost)
	}
	if !kill || !lim.Lease.On() {
		return admitted
	}
	// One µs before the killed replica's leases' TTL, nothing came back;
	// at it, the store gives back what was not reported spent.
	clk.Advance(lim.Lease.TTL - time.Duration(4*lim.Capacity())*step - time.Microsecond)
	drain()
	if admitted != lim.Capacity()-lost {
		t.Fatalf("before the TTL: admitted %d in all, want %d", admitted, lim.Capacity()-lost)
	}
	clk.Advance(time.Duration(4*lim.Capacity())*step + time.Microsecond)
	drain()
	if want := lim.Capacity() + unreported; admitted != want {
		t.Fatalf("after the TTL: admitted %d in all, want the capacity %d and %d spent unreported by the killed replica (lost %d)", admitted, lim.Capacity(), unreported, lost)
	}
	t.Logf("killed replica: %d held unspent, %d spent unreported; %d admitted in all", lost, unreported, admitted)
	return admitted
}

// TestLeasedConcurrent drives a leased token bucket from 4 replicas of 16
// goroutines each, on one real Redis and the system clock, with one
// replica killed halfway: the total admitted never exceeds what the
// bucket allows over the run, and most decisions are taken in process.
func TestLeasedConcurrent(t *testing.T) {
	c := testRedis(t)
	lim := Limit{Name: "hot", Algorithm: TokenBucket, Rate: 20_000, Period: time.Second, Burst: 2_000,
		Lease: Lease{Max: 200, TTL: 200 * time.Millisecond}}
	prefix := fmt.Sprintf("lc%d:", prefixSeq.Add(1))
	var reps []*Leased
	for range 4 {
		reps = append(reps, NewLeased(NewRedis(c, patient(RedisConfig{Prefix: prefix})), LeasedConfig{}))
	}
	defer func() {
		for _, l := range reps[1:] {
			l.Close(context.Background())
		}
	}()
	var admitted, decisions atomic.Int64
	begin := time.Now()
	stop := begin.Add(400 * time.Millisecond)
	kill := begin.Add(200 * time.Millisecond)
	var wg sync.WaitGroup
	var seq atomic.Int64
	for r, l := range reps {
		for range 16 {
			wg.Go(func() {
				for {
					now := time.Now()
					if now.After(stop) || (r == 0 && now.After(kill)) {
						return
					}
					res, err := l.Debit(context.Background(), fmt.Sprint("c", seq.Add(1)), []Item{{Limit: lim, Key: "k", Cost: 1}})
					if err != nil {
						t.Error(err)
						return
					}
					decisions.Add(1)
					if res.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	// Admissions end by the time the last call returns.
	elapsed := time.Since(begin)
	allow := lim.Burst + int64(elapsed.Seconds()*float64(lim.Rate)) + 1
	if got := admitted.Load(); got > allow {
		t.Fatalf("admitted %d in %s; the bucket allows %d", got, elapsed, allow)
	}
	var st LeaseStats
	for _, l := range reps {
		s := l.Stats()
		st.Local += s.Local
		st.Calls += s.Calls
	}
	t.Logf("%d decisions, %d admitted (bucket: %d), %d store calls, %d decided in process", decisions.Load(), admitted.Load(), allow, st.Calls, st.Local)
	if st.Calls*5 > decisions.Load() {
		t.Fatalf("%d store calls for %d decisions: leases are not used", st.Calls, decisions.Load())
	}
}

// TestLeasedSettle: a refund goes back to the lease, once; a cost settled
// above its estimate is paid from the lease or, without one, charged to
// the store; a reservation settled on a replica that did not debit it is
// settled by the store.
func TestLeasedSettle(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	mem := NewMemory(MemoryConfig{Now: clk.Now})
	lim := Limit{Name: "b", Algorithm: FixedWindow, Rate: 1000, Period: time.Hour, Lease: Lease{Max: 500, TTL: time.Minute}}
	l := NewLeased(mem, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
	l.inline = true
	defer l.Close(ctx)
	st := l.state(&Item{Limit: lim, Key: "k"})
	st.rate = 1e6 // hot: the next debit takes a lease
	it := Item{Limit: lim, Key: "k", Cost: 10}
	if res, err := l.Debit(ctx, "a", []Item{it}); err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	unspent := func() int64 { st.mu.Lock(); defer st.mu.Unlock(); return st.avail() }
	before := unspent()
	if before <= 0 {
		t.Fatalf("no lease taken: %+v", l.Stats())
	}
	// Spent from the lease: its settlement calls no store.
	if !l.Local("a", 1) || l.Local("a", 2) || l.Local("unknown", 1) {
		t.Fatalf("Local: a %v, a with 2 items %v, unknown %v", l.Local("a", 1), l.Local("a", 2), l.Local("unknown", 1))
	}
	if err := l.Settle(ctx, "a", []Item{it}, []int64{4}); err != nil {
		t.Fatal(err)
	}
	if l.Local("a", 1) {
		t.Fatal("Local after the settlement")
	}
	if got := unspent(); got != before+6 {
		t.Fatalf("after a refund of 6: unspent %d, want %d", got, before+6)
	}
	if err := l.Settle(ctx, "a", []Item{it}, []int64{0}); err != nil {
		t.Fatal(err)
	}
	if got := unspent(); got != before+6 {
		t.Fatalf("a second settle changed the lease: unspent %d, want %d", got, before+6)
	}
	// Overcharge beyond every unit held: a debt, charged to the store
	// when no lease pays it within a TTL.
	if res, err := l.Debit(ctx, "b", []Item{it}); err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	peek := func() int64 {
		res, err := mem.Peek(ctx, []Item{{Limit: lim, Key: "k"}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Items[0].Remaining
	}
	storeBefore := peek()
	held := unspent()
	if err := l.Settle(ctx, "b", []Item{it}, []int64{10 + held + 30}); err != nil {
		t.Fatal(err)
	}
	if got := unspent(); got != 0 {
		t.Fatalf("overcharge: unspent %d, want 0", got)
	}
	st.mu.Lock()
	debt := st.debt
	st.mu.Unlock()
	if debt != 30 {
		t.Fatalf("debt %d, want 30", debt)
	}
	clk.Advance(2 * time.Minute) // the lease and the debt's grace pass
	l.sweepOnce(ctx)
	if got := peek(); got != storeBefore-30 {
		t.Fatalf("store remaining %d after the debt was charged, want %d", got, storeBefore-30)
	}
	// A leased reservation settled again, here or on another replica,
	// refunds nothing more.
	if res, err := l.Debit(ctx, "d", []Item{it}); err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	if err := l.Settle(ctx, "d", []Item{it}, []int64{10}); err != nil {
		t.Fatal(err)
	}
	storeNow, heldNow := peek(), unspent()
	other0 := NewLeased(mem, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
	defer other0.Close(ctx)
	for _, r := range []*Leased{l, other0} {
		if err := r.Settle(ctx, "d", []Item{it}, []int64{0}); err != nil {
			t.Fatal(err)
		}
		if err := r.Cancel(ctx, "d", []Item{it}); err != nil {
			t.Fatal(err)
		}
	}
	if peek() != storeNow || unspent() != heldNow {
		t.Fatalf("a second settle gave back: store %d then %d, lease %d then %d", storeNow, peek(), heldNow, unspent())
	}
	// Another replica settles a reservation it did not make: the store
	// settles it (a strict one here), once.
	other := NewLeased(mem, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
	defer other.Close(ctx)
	strictItem := Item{Limit: Limit{Name: "s", Algorithm: FixedWindow, Rate: 100, Period: time.Hour}, Key: "k", Cost: 50}
	if res, err := l.Debit(ctx, "c", []Item{strictItem}); err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	if l.Local("c", 1) {
		t.Fatal("a strict reservation is Local")
	}
	for range 2 {
		if err := other.Cancel(ctx, "c", []Item{strictItem}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := mem.Peek(ctx, []Item{strictItem})
	if err != nil || res.Items[0].Remaining != 100 {
		t.Fatalf("after a cancel on another replica: %+v %v", res, err)
	}
}

// TestLeasedSpentIsLocal: once a lease is refused, the key's requests are
// refused in process until the store's RetryAfter, with what remains of
// it, and cheaper ones still go to the store.
func TestLeasedSpentIsLocal(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	mem := NewMemory(MemoryConfig{Now: clk.Now})
	lim := Limit{Name: "r", Algorithm: FixedWindow, Rate: 100, Period: 10 * time.Second, Lease: Lease{Max: 20, TTL: time.Minute}}
	l := NewLeased(mem, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
	l.inline = true
	defer l.Close(ctx)
	var seq int
	debit := func(cost int64) Result {
		seq++
		res, err := l.Debit(ctx, fmt.Sprint(seq), []Item{{Limit: lim, Key: "k", Cost: cost}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for debit(2).Allowed {
	}
	calls := l.Stats().Calls
	first := debit(2)
	clk.Advance(3 * time.Second)
	second := debit(5)
	if first.Allowed || second.Allowed || l.Stats().Calls != calls {
		t.Fatalf("known spent: %+v %+v, store calls %d then %d", first, second, calls, l.Stats().Calls)
	}
	if second.RetryAfter != first.RetryAfter-3*time.Second || second.RetryAfter <= 0 {
		t.Fatalf("RetryAfter %s then %s three seconds later", first.RetryAfter, second.RetryAfter)
	}
	// A cost of 1 may fit where 2 did not: it is asked.
	debit(1)
	if l.Stats().Calls == calls {
		t.Fatal("a cheaper request was refused without asking the store")
	}
	clk.Advance(first.RetryAfter)
	if !debit(2).Allowed {
		t.Fatal("refused after the window reset")
	}
}

func TestLeaseValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limit
		want string
	}{
		{"concurrency", Limit{Name: "c", Algorithm: Concurrency, Rate: 10, Period: time.Second, Lease: Lease{Max: 1}}, "cannot be leased"},
		{"over capacity", Limit{Name: "c", Rate: 10, Period: time.Second, Lease: Lease{Max: 11}}, "exceeds the capacity"},
		{"negative", Limit{Name: "c", Rate: 10, Period: time.Second, Lease: Lease{Max: -1}}, "negative"},
		{"ttl", Limit{Name: "c", Rate: 10, Period: time.Second, Lease: Lease{Max: 1, TTL: 2 * time.Hour}}, "exceeds 1h"},
		{"month over capacity", Limit{Name: "c", Algorithm: FixedWindow, Calendar: Month, Rate: 10, Lease: Lease{Max: 11}}, "exceeds the capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if err == nil || !contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	ok := Limit{Name: "c", Rate: 10, Period: time.Second, Burst: 20, Lease: Lease{Max: 20, TTL: time.Second}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	// A store failure while taking a lease is an error, never a decision.
	l := NewLeased(failing{}, LeasedConfig{})
	defer l.Close(context.Background())
	st := l.state(&Item{Limit: ok, Key: "k"})
	st.rate = 1e6
	if _, err := l.Debit(context.Background(), "x", []Item{{Limit: ok, Key: "k", Cost: 1}}); !errors.Is(err, errDown) {
		t.Fatalf("got %v", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

var errDown = errors.New("store down")

// failing is a store whose every call fails.
type failing struct{}

func (failing) Debit(context.Context, string, []Item) (Result, error) { return Result{}, errDown }
func (failing) Settle(context.Context, string, []Item, []int64) error { return errDown }
func (failing) Cancel(context.Context, string, []Item) error          { return errDown }
func (failing) Renew(context.Context, string, []Item) error           { return errDown }
func (failing) Peek(context.Context, []Item) (Result, error)          { return Result{}, errDown }
func (failing) Reset(context.Context, []Item) error                   { return errDown }

// Attacks on a leased key: a cost above the lease's maximum is debited
// strictly and exactly; a huge cost is a *CostError, as strictly; a
// caller that leaves while its request takes the key's lease leaves the
// lease to the others.
func TestLeasedAttacks(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	mem := NewMemory(MemoryConfig{Now: clk.Now})
	lim := Limit{Name: "t", Algorithm: FixedWindow, Rate: 1000, Period: time.Hour, Lease: Lease{Max: 50, TTL: time.Minute}}
	l := NewLeased(mem, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
	l.inline = true
	defer l.Close(ctx)
	st := l.state(&Item{Limit: lim, Key: "k"})
	st.rate = 1e9 // hot
	if res, err := l.Debit(ctx, "big", []Item{{Limit: lim, Key: "k", Cost: 400}}); err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	if res, err := mem.Peek(ctx, []Item{{Limit: lim, Key: "k"}}); err != nil || res.Items[0].Remaining != 600 {
		t.Fatalf("after a cost of 400 above the lease's 50: %+v %v", res, err)
	}
	var ce *CostError
	if _, err := l.Debit(ctx, "huge", []Item{{Limit: lim, Key: "k", Cost: 1 << 62}}); !errors.As(err, &ce) {
		t.Fatalf("a cost of 2^62: %v", err)
	}
	if _, err := l.Debit(ctx, "neg", []Item{{Limit: lim, Key: "k", Cost: -1}}); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("a negative cost: %v", err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Debit(gone, "left", []Item{{Limit: lim, Key: "k", Cost: 1}}); err != nil {
		t.Fatalf("a caller that left: %v", err)
	}
	st.mu.Lock()
	held := st.avail()
	st.mu.Unlock()
	if held != 49 {
		t.Fatalf("the lease taken for a caller that left holds %d unspent, want 49", held)
	}
	if res, err := l.Debit(ctx, "next", []Item{{Limit: lim, Key: "k", Cost: 1}}); err != nil || !res.Allowed || l.Stats().Acquired != 1 {
		t.Fatalf("the next request: %+v %v %+v", res, err, l.Stats())
	}
}

// hotLease returns a Leased store on a private Redis holding a lease on
// one key of a token bucket (three items, as the proxy's three limits,
// all on that key's limits), taken after a warm-up on clk: the lease
// holds far more than a test spends, so no decision asks the store again.
func hotLease(tb testing.TB, clk *clock) (*Leased, []Item) {
	tb.Helper()
	opt, err := redis.ParseURL(redistest.New(tb).URL)
	if err != nil {
		tb.Fatal(err)
	}
	opt.PoolSize = 2 * benchClients
	c := redis.NewClient(opt)
	tb.Cleanup(func() { c.Close() })
	l := inlineOver(tb, newRedisStore(c, nil), clk)
	var items []Item
	for _, name := range []string{"requests", "tokens", "usd"} {
		lim := Limit{Name: name, Algorithm: TokenBucket, Rate: 1_000_000_000, Period: time.Second, Burst: 100_000_000,
			Lease: Lease{Max: 10_000_000, TTL: time.Hour}}
		items = append(items, Item{Limit: lim, Key: "{bench}", Cost: 3})
	}
	ctx := context.Background()
	for i := 0; l.Stats().Acquired < int64(len(items)); i++ {
		if i == 1000 {
			tb.Fatalf("no lease after %d debits: %+v", i, l.Stats())
		}
		clk.Advance(time.Millisecond)
		res, err := l.Debit(ctx, "warm"+strconv.Itoa(i), items)
		if err != nil || !res.Allowed {
			tb.Fatalf("warm-up debit %d: %+v %v", i, res, err)
		}
	}
	return l, items
}

// TestLeasedHitAllocatesNothing decides and settles requests from leases
// held: no store call, and not one allocation, per decision.
func TestLeasedHitAllocatesNothing(t *testing.T) {
	l, items := hotLease(t, newClock())
	ctx := context.Background()
	var states [4]ItemState
	actual := []int64{3, 3, 3}
	ids := make([]string, 128)
	for i := range ids {
		ids[i] = "hit" + strconv.Itoa(i)
	}
	calls, n := l.Stats().Calls, 0
	allocs := testing.AllocsPerRun(1000, func() {
		id := ids[n%len(ids)]
		n++
		res, err := l.DebitInto(ctx, id, items, states[:])
		if err != nil || !res.Allowed || &res.Items[0] != &states[0] {
			t.Fatalf("debit: %+v %v", res, err)
		}
		if err := l.Settle(ctx, id, items, actual); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per leased decision and settlement, want 0", allocs)
	}
	if got := l.Stats().Calls; got != calls {
		t.Errorf("%d store calls during decisions from leases held, want 0", got-calls)
	}
}

// TestLeasedDrainConcurrent drains what is left of a limit that does not
// refill (all of it, or the last 40 units, as replicas that start cold
// find a key another has spent) from four replicas at once, 16 callers
// each, on a real Redis and the real clock, each caller until its replica
// refuses it three times in a row; requests cost 1, or 1 to 30 or 60 at
// random (60: above the lease's most, for share 50). A replica refuses
// only what the store and its own leases together could not admit: after
// a refusal they hold less than its cost; once every caller is done, what
// was admitted, what the replicas hold and what the store has left add up
// to what was left, and with costs of 1 all was admitted (windows and
// long-period buckets over-admit nothing without a replica lost).
func TestLeasedDrainConcurrent(t *testing.T) {
	c := testRedis(t)
	lims := []Limit{
		{Name: "fw", Algorithm: FixedWindow, Rate: 2000, Period: 24 * time.Hour},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 2000, Period: 24 * time.Hour},
		{Name: "tb", Algorithm: TokenBucket, Rate: 2000, Period: 1000 * time.Hour, Burst: 2000},
	}
	for _, lim := range lims {
		for _, tc := range []struct{ share, left, most int64 }{{5, 2000, 1}, {50, 2000, 1}, {5, 40, 1}, {50, 40, 1}, {5, 2000, 30}, {50, 2000, 30}, {50, 200, 30}, {50, 2000, 60}} {
			share, left, most := tc.share, tc.left, tc.most
			t.Run(fmt.Sprintf("%s/share%d/left%d/cost%d", lim.Name, share, left, most), func(t *testing.T) {
				lim.Lease = Lease{Max: lim.Capacity() / share, TTL: time.Minute}
				prefix := fmt.Sprintf("ld%d:", prefixSeq.Add(1))
				var reps []*Leased
				for range 4 {
					l := NewLeased(NewRedis(c, patient(RedisConfig{Prefix: prefix})), LeasedConfig{})
					t.Cleanup(func() { l.Close(context.Background()) })
					reps = append(reps, l)
				}
				it := Item{Limit: lim, Key: "k", Cost: lim.Capacity() - left}
				if it.Cost > 0 {
					if res, err := reps[0].Inner().Debit(context.Background(), "before", []Item{it}); err != nil || !res.Allowed {
						t.Fatalf("spending all but %d: %+v %v", left, res, err)
					}
				}
				var admitted, seq atomic.Int64
				var wg sync.WaitGroup
				for r, l := range reps {
					for k := range 16 {
						wg.Go(func() {
							rng := rand.New(rand.NewPCG(uint64(r), uint64(k)))
							it := it
							for refused := 0; refused < 3; {
								it.Cost = 1 + rng.Int64N(most)
								res, err := l.Debit(context.Background(), fmt.Sprint("d", seq.Add(1)), []Item{it})
								if err != nil {
									t.Error(err)
									return
								}
								if res.Allowed {
									admitted.Add(it.Cost)
									refused = 0
									continue
								}
								refused++
								if most > lim.Lease.Max {
									// A request above Lease.Max has its
									// replica's leases given back first: the
									// store can gain units after a refusal.
									continue
								}
								// Nothing comes back to the store while the
								// callers run (no lease ends within half a
								// minute), and what this replica holds is
								// only spent or added from the store: what
								// the two have now, they had at least at the
								// refusal.
								held := l.Unspent(it)
								now, err := reps[0].Inner().Peek(context.Background(), []Item{it})
								if err != nil {
									t.Error(err)
									return
								}
								if n := now.Items[0].Remaining; n+held >= it.Cost {
									t.Errorf("refused %d with %d left in the store and %d held by its replica", it.Cost, n, held)
									return
								}
							}
						})
					}
				}
				wg.Wait()
				var held int64
				for _, l := range reps {
					held += l.Unspent(it)
				}
				after, err := reps[0].Inner().Peek(context.Background(), []Item{it})
				if err != nil {
					t.Fatal(err)
				}
				rest := after.Items[0].Remaining
				t.Logf("admitted %d of %d; %d held unspent, %d left in the store", admitted.Load(), left, held, rest)
				if admitted.Load()+held+rest != left || most == 1 && (held != 0 || rest != 0) {
					t.Fatalf("admitted %d of %d, with %d held unspent by the replicas and %d left in the store",
						admitted.Load(), left, held, rest)
				}
			})
		}
	}
}
