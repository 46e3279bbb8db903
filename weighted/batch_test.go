package weighted

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	r := NewRedis(c, cfg)
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
// the whole batch.
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

	// A key of the wrong type fails the script, and so every request of
	// its batch; the request before it was debited, as a request whose
	// reply is lost may have been.
	if err := r.Reset(ctx, req(0)); err != nil {
		t.Fatal(err)
	}
	hold(r)
	failed := make(chan error, 3)
	for i, items := range [][]Item{req(1), append(req(1), broken), req(1)} {
		go func() {
			_, err := r.Debit(ctx, fmt.Sprint("x", i), items)
			failed <- err
		}()
		waitPending(t, r, i+1)
	}
	release(r)
	for range 3 {
		if err := <-failed; err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("a request of a failed batch: %v, want WRONGTYPE", err)
		}
	}
	checkRemaining(t, r, req(0), 1)
	if res, err := r.Debit(ctx, "after", req(9)); err != nil || !res.Allowed {
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

	t.Run("as it is handed a batch", func(t *testing.T) {
		// The caller without a deadline is chosen to send the batch; its
		// ctx ends as it is chosen. Either it sends the batch anyway, or it
		// leaves and the batch is sent without it: the other debit runs.
		r := newBatchStore(c, newClock(), RedisConfig{})
		const rounds = 20
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
			if err := <-chosen; err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("round %d: the chosen caller: %v", i, err)
			}
			// Wait for the batch to end, also when sent by a goroutine.
			for {
				r.mu.Lock()
				idle := r.queue.inflight == 0
				r.mu.Unlock()
				if idle {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		checkRemaining(t, r, items(0), 2*rounds)
	})
}

func TestMaxBatchValidate(t *testing.T) {
	if err := (RedisConfig{MaxBatch: -1}).Validate(); err == nil {
		t.Fatal("negative MaxBatch accepted")
	}
	if err := (RedisConfig{MaxBatch: 1}).Validate(); err != nil {
		t.Fatal(err)
	}
}
