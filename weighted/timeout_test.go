package weighted

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

func (g *gatedScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if g.held.Add(-1) >= 0 {
		g.entered <- struct{}{}
		<-g.gate
		if g.fail != nil {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(g.fail)
			return cmd
		}
	}
	return g.Scripter.EvalSha(ctx, sha, keys, args...)
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
