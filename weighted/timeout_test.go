package weighted

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// gatedScripter holds its first script calls until the test opens the
// gate; a held call then fails with fail, or runs.
type gatedScripter struct {
	Scripter
	held    atomic.Int64 // calls still to hold
	entered chan struct{}
	gate    chan struct{}
	fail    error
}

func (g *gatedScripter) Process(ctx context.Context, cmd redis.Cmder) error {
	if g.held.Add(-1) >= 0 {
		g.entered <- struct{}{}
		<-g.gate
		if g.fail != nil {
			cmd.SetErr(g.fail)
			return g.fail
		}
	}
	return g.Scripter.Process(ctx, cmd)
}

// testTimers gives a store timers that fire when the test says, in the
// order the store asked for them.
func testTimers(r *Redis) chan chan time.Time {
	timers := make(chan chan time.Time, 16)
	r.afterFunc = func(time.Duration) <-chan time.Time {
		ch := make(chan time.Time, 1)
		timers <- ch
		return ch
	}
	return timers
}

// TestQueueTimeout checks that a request that waits QueueTimeout in its
// queue returns ErrOverloaded, which is no store failure, and that nothing
// of it is applied.
func TestQueueTimeout(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	r := newBatchStore(c, newClock(), RedisConfig{})
	timers := testTimers(r)
	items := []Item{{Limit: Limit{Name: "tb", Rate: 100, Period: time.Hour}, Key: "{k}", Cost: 5}}
	hold(r)
	errc := make(chan error, 1)
	go func() {
		_, err := r.Debit(ctx, "shed", items)
		errc <- err
	}()
	(<-timers) <- time.Time{} // the queue timer
	err := <-errc
	if !errors.Is(err, ErrOverloaded) || IsStoreFailure(err) {
		t.Fatalf("got %v, want ErrOverloaded and no store failure", err)
	}
	r.mu.Lock()
	r.queue.inflight = 0
	pending := len(r.queue.pending)
	r.mu.Unlock()
	if pending != 0 {
		t.Fatalf("%d calls left in the queue", pending)
	}
	if st := r.Stats(); st.Overloaded != 1 {
		t.Fatalf("stats %+v, want one overloaded", st)
	}
	r.afterFunc = nil
	checkRemaining(t, r, items, 0)

	// A caller whose own deadline passes while it queues is shed too.
	hold(r)
	dctx, cancel := context.WithDeadline(ctx, time.Now())
	defer cancel()
	_, err = r.Debit(dctx, "late", items)
	if !errors.Is(err, ErrOverloaded) || !errors.Is(err, context.DeadlineExceeded) || IsStoreFailure(err) {
		t.Fatalf("got %v, want ErrOverloaded for the caller's deadline", err)
	}
	r.mu.Lock()
	r.queue.inflight = 0
	r.mu.Unlock()
	checkRemaining(t, r, items, 0)
}

// TestCallTimeout checks that a request sent whose reply does not come
// within CallTimeout returns ErrUnknownOutcome, a store failure, and that
// the store, when the reply comes, cancels a debit admitted and leaves a
// denied one, and counts a reply that never comes.
func TestCallTimeout(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	items := func(cost int64) []Item {
		return []Item{
			{Limit: Limit{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: time.Hour}, Key: "{k}", Cost: cost},
			{Limit: Limit{Name: "conc", Algorithm: Concurrency, Rate: 100, Period: time.Hour}, Key: "{k}", Cost: cost},
		}
	}
	cases := []struct {
		name    string
		cost    int64
		fail    error
		stats   RedisStats
		sharded bool
	}{
		{name: "admitted", cost: 30, stats: RedisStats{UnknownOutcomes: 1, LateCancels: 1}},
		{name: "admitted, sharded", cost: 30, sharded: true, stats: RedisStats{UnknownOutcomes: 1, LateCancels: 1}},
		{name: "denied", cost: 90, stats: RedisStats{UnknownOutcomes: 1}},
		{name: "no reply", cost: 30, fail: errors.New("i/o timeout"), stats: RedisStats{UnknownOutcomes: 1, LateLost: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := &gatedScripter{Scripter: c, entered: make(chan struct{}, 1), gate: make(chan struct{}), fail: tc.fail}
			r := newBatchStore(g, newClock(), RedisConfig{Sharded: tc.sharded})
			// 20 units used before, so that a debit of 90 is denied.
			if res, err := r.Debit(ctx, "before", items(20)); err != nil || !res.Allowed {
				t.Fatalf("%+v %v", res, err)
			}
			timers := testTimers(r)
			g.held.Store(1)
			errc := make(chan error, 1)
			go func() {
				_, err := r.Debit(ctx, "lost", items(tc.cost))
				errc <- err
			}()
			<-g.entered
			(<-timers) <- time.Time{} // the call timer
			err := <-errc
			if !errors.Is(err, ErrUnknownOutcome) || !IsStoreFailure(err) {
				t.Fatalf("got %v, want ErrUnknownOutcome, a store failure", err)
			}
			close(g.gate)
			waitStats(t, r, tc.stats)
			r.afterFunc = nil
			// Only the debit before holds units: the lost one was cancelled,
			// denied, or never ran.
			checkRemaining(t, r, items(0), 20)
		})
	}
}

// waitStats waits until r's stats are want (the late replies are handled
// by the store's goroutines) and its queues are idle.
func waitStats(t *testing.T, r *Redis, want RedisStats) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		r.mu.Lock()
		idle := r.queue.inflight == 0 && len(r.queues) == 0
		r.mu.Unlock()
		if st := r.Stats(); st == want && idle {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("stats %+v (idle %v), want %+v", st, idle, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHungCallFreesItsQueue: a call that got no reply within CallTimeout
// gives its place in the queue back, so that the calls behind it are sent
// (and fail as the store's failures, which open a breaker) instead of
// waiting for its ReplyTimeout and being shed as overloaded.
func TestHungCallFreesItsQueue(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	items := []Item{{Limit: Limit{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: time.Hour}, Key: "{k}", Cost: 1}}
	for _, sharded := range []bool{false, true} {
		g := &gatedScripter{Scripter: c, entered: make(chan struct{}, 4), gate: make(chan struct{}), fail: errors.New("i/o timeout")}
		r := newBatchStore(g, newClock(), RedisConfig{Sharded: sharded})
		timers := testTimers(r)
		g.held.Store(2)
		errc := make(chan error, 2)
		go func() { _, err := r.Debit(ctx, "first", items); errc <- err }()
		<-g.entered
		(<-timers) <- time.Time{} // the first call's CallTimeout
		if err := <-errc; !errors.Is(err, ErrUnknownOutcome) {
			t.Fatalf("sharded=%v: first: %v, want ErrUnknownOutcome", sharded, err)
		}
		// Redis is still hung: the next call is sent nonetheless.
		go func() { _, err := r.Debit(ctx, "second", items); errc <- err }()
		<-g.entered
		(<-timers) <- time.Time{}
		if err := <-errc; !errors.Is(err, ErrUnknownOutcome) || !IsStoreFailure(err) {
			t.Fatalf("sharded=%v: second: %v, want a store failure, not ErrOverloaded", sharded, err)
		}
		close(g.gate)
		r.afterFunc = nil
		waitStats(t, r, RedisStats{UnknownOutcomes: 2, LateLost: 2})
	}
}

// TestInlineSettle: with ContextDeadlines, a settlement that finds its
// queue idle runs on its caller's goroutine. It settles as on the store's
// goroutine (a refund comes back, a second settle changes nothing), and
// against a Redis that does not answer (CLIENT PAUSE) it keeps the same
// bound: ErrUnknownOutcome, a store failure, after CallTimeout and not
// the client's ReadTimeout (3 s).
func TestInlineSettle(t *testing.T) {
	srv := redistest.New(t)
	opt, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opt.ContextTimeoutEnabled, opt.MaxRetries = true, -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	const callTimeout = 150 * time.Millisecond
	r := NewRedis(c, RedisConfig{Prefix: fmt.Sprintf("in%d:", prefixSeq.Add(1)), ContextDeadlines: true, CallTimeout: callTimeout})
	items := func(cost int64) []Item {
		return []Item{
			{Limit: Limit{Name: "fw", Algorithm: FixedWindow, Rate: 100, Period: time.Hour}, Key: "{k}", Cost: cost},
			{Limit: Limit{Name: "tb", Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: 100}, Key: "{k}", Cost: cost},
		}
	}
	if res, err := r.Debit(ctx, "a", items(30)); err != nil || !res.Allowed {
		t.Fatalf("debit: %+v %v", res, err)
	}
	for range 2 { // the second changes nothing
		if err := r.Settle(ctx, "a", items(30), []int64{10, 10}); err != nil {
			t.Fatalf("settle: %v", err)
		}
		if res, err := r.Peek(ctx, items(1)); err != nil || res.Items[0].Remaining != 90 || res.Items[1].Remaining != 90 {
			t.Fatalf("after settling 30 at 10: %+v %v, want 90 left on each", res, err)
		}
	}
	if res, err := r.Debit(ctx, "b", items(5)); err != nil || !res.Allowed {
		t.Fatalf("debit: %+v %v", res, err)
	}
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", 2000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = r.Settle(ctx, "b", items(5), []int64{1, 1})
	took := time.Since(start)
	if !errors.Is(err, ErrUnknownOutcome) || !IsStoreFailure(err) {
		t.Fatalf("settle against a paused Redis: %v, want ErrUnknownOutcome, a store failure", err)
	}
	if took < callTimeout-10*time.Millisecond || took > callTimeout+time.Second {
		t.Fatalf("the settle returned after %s, want about CallTimeout (%s)", took, callTimeout)
	}
	if st := r.Stats(); st.UnknownOutcomes != 1 {
		t.Fatalf("stats %+v, want one unknown outcome", st)
	}
}
