package weighted

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// countingStore counts the calls of a store's requests.
type countingStore struct {
	Store
	calls atomic.Int64
}

func (s *countingStore) Debit(ctx context.Context, id string, items []Item) (Result, error) {
	s.calls.Add(1)
	return s.Store.Debit(ctx, id, items)
}

// newBatchStore returns a Redis store on c with MaxBatch maxBatch under a
// fresh prefix, whose time is clk's.
func newBatchStore(c Scripter, clk *clock, cfg RedisConfig) *Redis {
	cfg.Prefix = "b" + strconv.FormatInt(prefixSeq.Add(1), 10) + ":"
	r := NewRedis(c, patient(cfg))
	r.now = clk.Now
	return r
}

// hold makes r's queue act as if a script call of it ran, so that the
// calls that come next wait in it.
func hold(r *Redis) {
	r.mu.Lock()
	r.queue.inflight = r.maxInFlight
	r.mu.Unlock()
}

// waitPending waits until n calls wait in r's queue.
func waitPending(t *testing.T, r *Redis, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		r.mu.Lock()
		got := len(r.queue.pending)
		r.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// release ends what hold started: the calls waiting in r's queue go as one
// batch.
func release(r *Redis) {
	r.mu.Lock()
	r.handOn(&r.queue)
	r.mu.Unlock()
}

// TestBatchExactUnderConcurrency races goroutines on the same limits through
// stores that batch, and requires that they admit exactly what one debit
// after another does, in fewer script calls than debits.
func TestBatchExactUnderConcurrency(t *testing.T) {
	c := testRedis(t)
	items := []Item{
		{Limit: Limit{Name: "tb", Rate: 1000, Period: time.Minute}, Key: "{k}"},
		{Limit: Limit{Name: "fw", Algorithm: FixedWindow, Rate: 700, Period: time.Hour}, Key: "{k}"},
		{Limit: Limit{Name: "log", Algorithm: SlidingLog, Rate: 600, Period: time.Minute}, Key: "{k}:x"},
		{Limit: Limit{Name: "conc", Algorithm: Concurrency, Rate: 650, Period: time.Minute}, Key: "{k}:y"},
	}
	sequential := drain(t, newBatchStore(c, newClock(), RedisConfig{MaxBatch: 1}), items)
	if sequential != minCapacity(items) {
		t.Fatalf("one after another: admitted %d, want %d", sequential, minCapacity(items))
	}
	cases := []struct {
		name    string
		cfg     RedisConfig
		batched bool
	}{
		{"default", RedisConfig{}, true},
		{"MaxBatch 4", RedisConfig{MaxBatch: 4}, true},
		{"sharded", RedisConfig{Sharded: true}, true},
		{"MaxBatch 1", RedisConfig{MaxBatch: 1}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newBatchStore(c, newClock(), tc.cfg)
			s := &countingStore{Store: r}
			admitted := raceDebits(t, s, items, 64)
			if admitted != sequential {
				t.Fatalf("admitted %d units racing, %d one after another", admitted, sequential)
			}
			checkRemaining(t, r, items, sequential)
			debits, calls := s.calls.Load(), r.scriptCalls.Load()-1 // the Peek
			t.Logf("%d debits in %d script calls", debits, calls)
			if tc.batched && calls >= debits {
				t.Fatalf("%d script calls for %d debits: no batch formed", calls, debits)
			}
			if !tc.batched && calls != debits {
				t.Fatalf("%d script calls for %d debits, want one each", calls, debits)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.queue.inflight != 0 || len(r.queue.pending) != 0 || len(r.queues) != 0 {
				t.Fatalf("queues left busy: %+v, %d by tag", r.queue, len(r.queues))
			}
		})
	}
}

// TestBatchMixed runs debits that are admitted and denied, settles and a
// cancel in one batch, and requires of each request what it gets alone, in
// the batch's order; then a batch with a request that fails, which fails
// alone.
func TestBatchMixed(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	clk := newClock()
	r := newBatchStore(c, clk, RedisConfig{})
	tb := Limit{Name: "tb", Rate: 10, Period: time.Hour}
	win := Limit{Name: "fw", Algorithm: FixedWindow, Rate: 10, Period: time.Hour}
	broken := Item{Limit: Limit{Name: "log", Algorithm: SlidingLog, Rate: 10, Period: time.Hour}, Key: "{k}", Cost: 1}
	if err := c.Set(ctx, r.key(&broken), "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	req := func(cost int64) []Item {
		return []Item{{Limit: tb, Key: "{k}", Cost: cost}, {Limit: win, Key: "{k}", Cost: cost}}
	}
	type step struct {
		name  string
		run   func() (Result, error)
		allow bool // for debits
	}
	debit := func(id string, items []Item) func() (Result, error) {
		return func() (Result, error) { return r.Debit(ctx, id, items) }
	}
	steps := []step{
		{"a: 4 of 10", debit("a", req(4)), true},
		{"b: 5 of 6", debit("b", req(5)), true},
		{"c: 3 of 1, denied", debit("c", req(3)), false},
		{"e: 1 of 1", debit("e", req(1)), true},
		{"f: settle a at 1 refunds 3", func() (Result, error) { return Result{}, r.Settle(ctx, "a", req(4), []int64{1, 1}) }, false},
		{"g: cancel b refunds 5", func() (Result, error) { return Result{}, r.Cancel(ctx, "b", req(5)) }, false},
		{"h: 8 of 8", debit("h", req(8)), true},
		{"i: 1 of 0, denied", debit("i", req(1)), false},
		{"j: settle a again changes nothing", func() (Result, error) { return Result{}, r.Settle(ctx, "a", req(4), []int64{4, 4}) }, false},
	}
	calls := r.scriptCalls.Load()
	hold(r)
	type outcome struct {
		res Result
		err error
	}
	outs := make([]outcome, len(steps))
	var wg sync.WaitGroup
	for i, st := range steps {
		wg.Go(func() {
			res, err := st.run()
			outs[i] = outcome{res, err}
		})
		waitPending(t, r, i+1) // one at a time, so that the batch is in this order
	}
	release(r)
	wg.Wait()
	if n := r.scriptCalls.Load() - calls; n != 1 {
		t.Fatalf("%d script calls, want one batch", n)
	}
	for i, st := range steps {
		o := outs[i]
		switch {
		case o.err != nil:
			t.Errorf("%s: %v", st.name, o.err)
		case strings.Contains(st.name, "settle") || strings.Contains(st.name, "cancel"):
		case o.res.Allowed != st.allow:
			t.Errorf("%s: allowed %v, want %v (%+v)", st.name, o.res.Allowed, st.allow, o.res)
		}
	}
	checkRemaining(t, r, req(0), 10)

	// A key of the wrong type fails its request alone; the requests
	// before and after it in the batch are debited and told so.
	if err := r.Reset(ctx, req(0)); err != nil {
		t.Fatal(err)
	}
	hold(r)
	failed := make([]chan error, 3)
	for i, items := range [][]Item{req(1), append(req(1), broken), req(1)} {
		failed[i] = make(chan error, 1)
		go func() {
			_, err := r.Debit(ctx, fmt.Sprint("x", i), items)
			failed[i] <- err
		}()
		waitPending(t, r, i+1)
	}
	release(r)
	for i := range 3 {
		err := <-failed[i]
		switch {
		case i == 1 && (err == nil || !strings.Contains(err.Error(), "WRONGTYPE")):
			t.Fatalf("the request on a key of the wrong type: %v, want WRONGTYPE", err)
		case i != 1 && err != nil:
			t.Fatalf("request %d of a batch with a request that failed: %v", i, err)
		}
	}
	checkRemaining(t, r, req(0), 2)
	if res, err := r.Debit(ctx, "after", req(8)); err != nil || !res.Allowed {
		t.Fatalf("after a failed batch: %+v %v", res, err)
	}
}

// TestBatchSettleOnce settles and cancels reservations from many goroutines
// at once, each several times, and requires each to be applied once.
func TestBatchSettleOnce(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	r := newBatchStore(c, newClock(), RedisConfig{})
	items := []Item{
		{Limit: Limit{Name: "tb", Rate: 1000, Period: time.Hour}, Key: "{k}", Cost: 10},
		{Limit: Limit{Name: "sw", Algorithm: SlidingWindow, Rate: 1000, Period: time.Hour}, Key: "{k}", Cost: 10},
	}
	const n = 50
	for i := range n {
		if res, err := r.Debit(ctx, fmt.Sprint("id", i), items); err != nil || !res.Allowed {
			t.Fatalf("debit %d: %+v %v", i, res, err)
		}
	}
	calls := r.scriptCalls.Load()
	// The first half settle at 4 (a refund of 6 each), the second half
	// cancel (10 each), four times each, all at once: 150 + 250 back.
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	for range 4 {
		for i := range n {
			wg.Go(func() {
				id := fmt.Sprint("id", i)
				if i < n/2 {
					errs <- r.Settle(ctx, id, items, []int64{4, 4})
				} else {
					errs <- r.Cancel(ctx, id, items)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	checkRemaining(t, r, items, 10*n-6*n/2-10*n/2)
	if got := r.scriptCalls.Load() - calls - 1; got >= 4*n {
		t.Errorf("%d script calls for %d settles: no batch formed", got, 4*n)
	} else {
		t.Logf("%d settles in %d script calls", 4*n, got)
	}
}

// TestBatchCancelledCaller checks that a caller whose ctx ends while it
// waits in a queue, or just as it is handed a batch to send, returns ctx's
// error at once and that the other requests of its batch run.
func TestBatchCancelledCaller(t *testing.T) {
	c := testRedis(t)
	bg := context.Background()
	items := func(cost int64) []Item {
		return []Item{{Limit: Limit{Name: "tb", Rate: 100, Period: time.Hour}, Key: "{k}", Cost: cost}}
	}

	t.Run("while queued", func(t *testing.T) {
		r := newBatchStore(c, newClock(), RedisConfig{})
		hold(r)
		var wg sync.WaitGroup
		var first, last Result
		wg.Go(func() {
			var err error
			if first, err = r.Debit(bg, "first", items(1)); err != nil {
				t.Error(err)
			}
		})
		waitPending(t, r, 1)
		ctx, cancel := context.WithCancel(bg)
		gone := make(chan error, 1)
		go func() {
			_, err := r.Debit(ctx, "gone", items(50))
			gone <- err
		}()
		waitPending(t, r, 2)
		wg.Go(func() {
			var err error
			if last, err = r.Debit(bg, "last", items(2)); err != nil {
				t.Error(err)
			}
		})
		waitPending(t, r, 3)
		cancel()
		select {
		case err := <-gone:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled caller: %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a cancelled caller still waits for its queue")
		}
		waitPending(t, r, 2)
		release(r)
		wg.Wait()
		if !first.Allowed || !last.Allowed || last.Items[0].Remaining != 97 {
			t.Fatalf("the others: %+v, %+v", first, last)
		}
		checkRemaining(t, r, items(0), 3)
	})

	t.Run("as its batch is sent", func(t *testing.T) {
		// The caller's ctx ends as its batch is sent. Either it gets its
		// reply, or it leaves with ErrUnknownOutcome and the store cancels
		// its debit when the reply comes: the other debit runs either way.
		r := newBatchStore(c, newClock(), RedisConfig{})
		const rounds = 20
		var kept int64
		for i := range rounds {
			hold(r)
			ctx, cancel := context.WithCancel(bg)
			chosen := make(chan error, 1)
			go func() {
				_, err := r.Debit(ctx, fmt.Sprint("chosen", i), items(1))
				chosen <- err
			}()
			waitPending(t, r, 1)
			other := make(chan error, 1)
			go func() {
				dctx, dcancel := context.WithTimeout(bg, time.Minute)
				defer dcancel()
				res, err := r.Debit(dctx, fmt.Sprint("other", i), items(1))
				if err == nil && !res.Allowed {
					err = errors.New("denied")
				}
				other <- err
			}()
			waitPending(t, r, 2)
			r.mu.Lock()
			cancel()
			r.handOn(&r.queue)
			r.mu.Unlock()
			if err := <-other; err != nil {
				t.Fatalf("round %d: the other debit: %v", i, err)
			}
			switch err := <-chosen; {
			case err == nil:
				kept++
			case !errors.Is(err, context.Canceled) || !errors.Is(err, ErrUnknownOutcome) || IsStoreFailure(err):
				t.Fatalf("round %d: the chosen caller: %v", i, err)
			}
			// Wait for the batch, and a cancellation, to end.
			waitIdle(t, r)
		}
		st := r.Stats()
		if st.UnknownOutcomes != rounds-kept || st.LateCancels != rounds-kept {
			t.Fatalf("%d kept of %d: stats %+v", kept, rounds, st)
		}
		checkRemaining(t, r, items(0), rounds+kept)
	})
}

// waitIdle waits until no script call of r's unsharded queue runs or
// waits.
func waitIdle(t *testing.T, r *Redis) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		r.mu.Lock()
		idle := r.queue.inflight == 0 && len(r.queue.pending) == 0
		r.mu.Unlock()
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the queue stays busy")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestMaxBatchValidate(t *testing.T) {
	if err := (RedisConfig{MaxBatch: -1}).Validate(); err == nil {
		t.Fatal("negative MaxBatch accepted")
	}
	if err := (RedisConfig{MaxBatch: 1}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestBatchLeavesStateOfOneByOne runs random debits, peeks, settles and
// cancels, with the clock moving between them, on the limits of each
// algorithm, in batches on one store and one by one (MaxBatch 1) on
// another, and requires the same result of each request and, after each
// batch, the same keys with the same values (GET, or ZRANGE of a sorted
// set) and TTLs (PTTL, within the real time the two runs took): a batch
// reads each meter and window once and writes it once, with the TTL the
// last write one by one would have set.
func TestBatchLeavesStateOfOneByOne(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	limits := func(a Algorithm) []Limit {
		ls := []Limit{
			{Name: "a", Algorithm: a, Rate: 20, Period: 10 * time.Second},
			{Name: "b", Algorithm: a, Rate: 12, Period: 3 * time.Second},
		}
		if a == TokenBucket || a == GCRA {
			ls[0].Burst = 15
		}
		return ls
	}
	cases := []struct {
		name   string
		limits []Limit
	}{
		{"token_bucket", limits(TokenBucket)},
		{"gcra", limits(GCRA)},
		{"sliding_window", limits(SlidingWindow)},
		{"fixed_window", limits(FixedWindow)},
		// Sorted sets are not cached: a batch writes the pending values
		// before each of their commands.
		{"mixed", []Limit{
			{Name: "tb", Rate: 20, Period: 10 * time.Second},
			{Name: "fw", Algorithm: FixedWindow, Rate: 15, Period: 4 * time.Second},
			{Name: "log", Algorithm: SlidingLog, Rate: 15, Period: 5 * time.Second},
			{Name: "conc", Algorithm: Concurrency, Rate: 15, Period: 5 * time.Second},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			oneClock, batchClock := newClock(), newClock()
			one := newBatchStore(c, oneClock, RedisConfig{MaxBatch: 1})
			batched := newBatchStore(c, batchClock, RedisConfig{})
			// A request is a Debit, Peek, Settle or Cancel of some of the
			// limits, some of them under a changed config; the clock moves
			// before it.
			type request struct {
				op      string
				id      string
				items   []Item
				actual  []int64
				advance time.Duration
			}
			var debits []request
			next := func(n int) request {
				rq := request{advance: time.Duration(rng.IntN(1500)) * time.Millisecond}
				if op := rng.IntN(10); op >= 5 && len(debits) > 0 {
					d := debits[rng.IntN(len(debits))]
					rq.id, rq.items, rq.op = d.id, d.items, "cancel"
					if op >= 7 {
						rq.op = "settle"
						for _, it := range d.items {
							rq.actual = append(rq.actual, rng.Int64N(2*it.Cost+1))
						}
					}
					return rq
				}
				rq.op, rq.id = "debit", fmt.Sprint("d", n)
				if rng.IntN(8) == 0 {
					rq.op = "peek"
				}
				for _, l := range tc.limits {
					if rng.IntN(4) == 0 {
						continue
					}
					if rng.IntN(6) == 0 {
						// A changed config: a meter's debt is rescaled, a
						// window's count carried into the new period's.
						l.Rate += 5
						if stringState(l.Algorithm) {
							l.Period *= 2
						}
					}
					rq.items = append(rq.items, Item{Limit: l, Key: "{k}", Cost: rng.Int64N(l.Capacity()/2 + 1)})
				}
				if len(rq.items) == 0 {
					rq.items = append(rq.items, Item{Limit: tc.limits[0], Key: "{k}", Cost: 1})
				}
				if rq.op == "debit" {
					debits = append(debits, rq)
				}
				return rq
			}
			run := func(s *Redis, rq request) string {
				var res Result
				var err error
				switch rq.op {
				case "debit":
					res, err = s.Debit(ctx, rq.id, rq.items)
				case "peek":
					res, err = s.Peek(ctx, rq.items)
				case "settle":
					err = s.Settle(ctx, rq.id, rq.items, rq.actual)
				case "cancel":
					err = s.Cancel(ctx, rq.id, rq.items)
				}
				return fmt.Sprintf("%s %s: %+v %v", rq.op, rq.id, res, err)
			}
			const rounds, perBatch = 4, 40
			began := time.Now() // a key's writes one by one and batched are this far apart, at most
			for round := range rounds {
				reqs := make([]request, perBatch)
				for i := range reqs {
					reqs[i] = next(round*perBatch + i)
				}
				want := make([]string, len(reqs))
				for i, rq := range reqs {
					oneClock.Advance(rq.advance)
					want[i] = run(one, rq)
				}
				calls := batched.scriptCalls.Load()
				got := make([]string, len(reqs))
				hold(batched)
				var wg sync.WaitGroup
				for i, rq := range reqs {
					batchClock.Advance(rq.advance) // read as the request queues
					wg.Go(func() { got[i] = run(batched, rq) })
					waitPending(t, batched, i+1)
				}
				release(batched)
				wg.Wait()
				if n := batched.scriptCalls.Load() - calls; n != 1 {
					t.Fatalf("round %d: %d script calls, want one batch", round, n)
				}
				for i := range reqs {
					if got[i] != want[i] {
						t.Fatalf("round %d, request %d:\nbatched     %s\none by one  %s", round, i, got[i], want[i])
					}
				}
				compareKeys(t, c, one.prefix, batched.prefix, time.Since(began)+2*time.Millisecond)
			}
		})
	}
}

// compareKeys requires the keys under prefixes a and b to be the same but
// for the prefix, with the same values, and TTLs that differ by at most
// tol.
func compareKeys(t *testing.T, c *redis.Client, a, b string, tol time.Duration) {
	t.Helper()
	ctx := context.Background()
	type state struct {
		value string
		ttl   time.Duration
	}
	read := func(prefix string) map[string]state {
		keys, err := c.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]state{}
		for _, k := range keys {
			var s state
			switch typ := c.Type(ctx, k).Val(); typ {
			case "string":
				s.value = c.Get(ctx, k).Val()
			case "zset":
				s.value = fmt.Sprint(c.ZRangeWithScores(ctx, k, 0, -1).Val())
			default:
				t.Fatalf("%s: type %s", k, typ)
			}
			s.ttl = c.PTTL(ctx, k).Val()
			out[strings.TrimPrefix(k, prefix)] = s
		}
		return out
	}
	sa, sb := read(a), read(b)
	if len(sa) != len(sb) {
		t.Fatalf("%d keys one by one, %d batched", len(sa), len(sb))
	}
	for k, x := range sa {
		y, ok := sb[k]
		switch {
		case !ok:
			t.Fatalf("%s: missing after the batch", k)
		case x.value != y.value:
			t.Fatalf("%s: value %q one by one, %q batched", k, x.value, y.value)
		case x.ttl < 0 || y.ttl < 0 || (x.ttl-y.ttl).Abs() > tol:
			t.Fatalf("%s: PTTL %s one by one, %s batched (tolerance %s)", k, x.ttl, y.ttl, tol)
		}
	}
}

// TestBatchFailureKeepsEarlierWrites runs batches whose middle request
// fails on a key it cannot read, and requires that request alone to fail
// and the ones before and after it to have been debited, as when each
// request wrote its keys at once: a batch writes its pending values
// before a command that may fail, and goes on after it.
func TestBatchFailureKeepsEarlierWrites(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	good := []Item{
		{Limit: Limit{Name: "tb", Rate: 10, Period: time.Hour}, Key: "{k}", Cost: 1},
		{Limit: Limit{Name: "fw", Algorithm: FixedWindow, Rate: 10, Period: time.Hour}, Key: "{k}", Cost: 1},
	}
	bad := Item{Limit: Limit{Name: "bad", Rate: 10, Period: time.Hour}, Key: "{k}", Cost: 1}
	cases := []struct {
		name string
		// spoil makes the failing request's key unreadable.
		spoil func(r *Redis) error
		fail  func(r *Redis) error
	}{
		{"meter value too short", func(r *Redis) error {
			return c.Set(ctx, r.key(&bad), "short", 0).Err()
		}, func(r *Redis) error {
			_, err := r.Debit(ctx, "x", append(good[:1:1], bad))
			return err
		}},
		{"settled meter of the wrong type", func(r *Redis) error {
			return c.RPush(ctx, r.key(&bad), "x").Err()
		}, func(r *Redis) error {
			return r.Settle(ctx, "x", append(good[:1:1], bad), []int64{1, 3})
		}},
		{"record of the wrong type", func(r *Redis) error {
			return c.RPush(ctx, r.recordKey("k", "x"), "x").Err()
		}, func(r *Redis) error {
			return r.Cancel(ctx, "x", good)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newBatchStore(c, newClock(), RedisConfig{})
			if err := tc.spoil(r); err != nil {
				t.Fatal(err)
			}
			hold(r)
			errs := make([]chan error, 3)
			calls := []func() error{
				func() error { _, err := r.Debit(ctx, "a", good); return err },
				func() error { return tc.fail(r) },
				func() error { _, err := r.Debit(ctx, "c", good); return err },
			}
			for i, call := range calls {
				errs[i] = make(chan error, 1)
				go func() { errs[i] <- call() }()
				waitPending(t, r, i+1)
			}
			release(r)
			for i := range calls {
				err := <-errs[i]
				switch {
				case i == 1 && (!errors.Is(err, ErrUnreadable) || IsStoreFailure(err)):
					t.Errorf("the request on a spoiled key: %v, want its own failure (ErrUnreadable)", err)
				case i != 1 && err != nil:
					t.Errorf("request %d, in a batch with a request that failed: %v", i, err)
				}
			}
			checkRemaining(t, r, good, 2)
		})
	}
}
