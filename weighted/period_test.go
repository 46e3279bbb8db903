package weighted

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// periodStep is one request of TestWindowPeriodChange.
type periodStep struct {
	at    time.Duration // since the test's t0
	limit Limit
	op    byte // 'd' debit, 'p' peek
	cost  int64
	want  string        // "ok" or "deny"
	reset time.Duration // when not 0, the ResetAfter wanted
}

// runPeriodSteps runs steps on s, setting clk before each, and returns each
// one's item state. When batch is set (s is then batch), the steps go in
// one script call, in their order, each at its own time.
// stepStores are the stores a test of steps runs on, to agree: Memory,
// Redis with one call at a time (batching on), Redis with batching off,
// and Redis with all the steps in one batch (runPeriodSteps's batch).
var stepStores = []string{"memory", "redis", "redis MaxBatch 1", "redis batch"}

// stepStore makes the store named, on clock clk; batch is the store to run
// all steps in one batch on, for "redis batch".
func stepStore(c Scripter, clk *clock, name string) (s Store, batch *Redis) {
	switch name {
	case "memory":
		return NewMemory(MemoryConfig{Now: clk.Now}), nil
	case "redis":
		return newBatchStore(c, clk, RedisConfig{}), nil
	case "redis MaxBatch 1":
		return newBatchStore(c, clk, RedisConfig{MaxBatch: 1}), nil
	}
	batch = newBatchStore(c, clk, RedisConfig{})
	return batch, batch
}

func runPeriodSteps(t *testing.T, s Store, clk *clock, t0 time.Time, steps []periodStep, batch *Redis) []ItemState {
	t.Helper()
	ctx := context.Background()
	out := make([]ItemState, len(steps))
	errs := make([]error, len(steps))
	run := func(i int) {
		st := steps[i]
		items := []Item{{Limit: st.limit, Key: "{k}", Cost: st.cost}}
		var res Result
		var err error
		if st.op == 'd' {
			res, err = s.Debit(ctx, fmt.Sprint("r", i), items)
		} else {
			res, err = s.Peek(ctx, items)
		}
		if err == nil {
			out[i] = res.Items[0]
		}
		errs[i] = err
	}
	defer func() {
		for i, err := range errs {
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
	}()
	driveSteps(t, clk, t0, len(steps), func(i int) time.Duration { return steps[i].at }, batch, run)
	return out
}

// TestWindowPeriodChange exhausts a fixed or sliding window, changes its
// period up and down, and requires of every store (Memory, and Redis one
// request at a time, with batching off, and in one batch) the same results,
// which deny while the carried count counts, never for more than one longer
// period (a sliding window's count then weighs one new period more), and
// admit once it is over; then a clock that steps back under the new period
// still gives no room.
func TestWindowPeriodChange(t *testing.T) {
	c := testRedis(t)
	// t0 is 2h 4.3s into a day: in the second [7204s, 7205s), the 2s window
	// [7204s, 7206s) and the hour [7200s, 10800s).
	t0 := start.Add(2*time.Hour + 4300*time.Millisecond)
	cases := []struct {
		name     string
		old, new time.Duration
		// until is when the carried count stops counting in full, since t0:
		// the end of the window of the new period it is carried into.
		until time.Duration
	}{
		// The second [7204, 7205) is carried into the 2s window that holds
		// it, [7204, 7206): no more than 10 in that window.
		{"1s to 2s", time.Second, 2 * time.Second, 1700 * time.Millisecond},
		// ... and into the hour that holds it.
		{"1s to 1h", time.Second, time.Hour, 3595700 * time.Millisecond},
		// The hour [7200, 10800) counts until it ends, in its last second.
		{"1h to 1s", time.Hour, time.Second, 3595700 * time.Millisecond},
		// The 2s window [7204, 7206) counts until it ends.
		{"2s to 1s", 2 * time.Second, time.Second, 1700 * time.Millisecond},
	}
	for _, algo := range []Algorithm{FixedWindow, SlidingWindow} {
		for _, tc := range cases {
			t.Run(algo.String()+"/"+tc.name, func(t *testing.T) {
				before := Limit{Name: "w", Algorithm: algo, Rate: 10, Period: tc.old}
				after := before
				after.Period = tc.new
				longer := max(tc.old, tc.new)
				u := tc.until
				steps := []periodStep{
					{at: 0, limit: before, op: 'd', cost: 10, want: "ok"},
					{at: 0, limit: before, op: 'd', cost: 1, want: "deny"},
					{at: 100 * time.Millisecond, limit: after, op: 'd', cost: 1, want: "deny"},
					{at: 100 * time.Millisecond, limit: after, op: 'p', cost: 0, want: "ok"},
					{at: 700 * time.Millisecond, limit: after, op: 'd', cost: 1, want: "deny"}, // the old second is over
					{at: u - time.Millisecond, limit: after, op: 'd', cost: 1, want: "deny"},
				}
				if algo == FixedWindow {
					steps[2].reset = u - 100*time.Millisecond
					steps = append(steps,
						periodStep{at: u, limit: after, op: 'd', cost: 10, want: "ok", reset: tc.new},
						// A clock that steps back still counts in that window.
						periodStep{at: u - 500*time.Millisecond, limit: after, op: 'd', cost: 1, want: "deny"},
						periodStep{at: u + tc.new, limit: after, op: 'd', cost: 10, want: "ok"},
					)
				} else {
					steps[2].reset = u + tc.new - 100*time.Millisecond
					steps = append(steps,
						// The carried count weighs as the previous window's.
						periodStep{at: u, limit: after, op: 'p', cost: 1, want: "deny"},
						periodStep{at: u + tc.new/2, limit: after, op: 'p', cost: 6, want: "deny"},
						periodStep{at: u + tc.new/2, limit: after, op: 'p', cost: 5, want: "ok"},
						periodStep{at: u + tc.new, limit: after, op: 'd', cost: 10, want: "ok", reset: 2 * tc.new},
						// A clock that steps back still counts in that window.
						periodStep{at: u + tc.new - 500*time.Millisecond, limit: after, op: 'd', cost: 1, want: "deny"},
					)
				}
				var want []ItemState
				for _, name := range stepStores {
					clk := newClock()
					s, batch := stepStore(c, clk, name)
					got := runPeriodSteps(t, s, clk, t0, steps, batch)
					if want == nil {
						want = got
						checkPeriodSteps(t, algo, steps, got, longer)
						continue
					}
					for i := range steps {
						if got[i] != want[i] {
							t.Fatalf("%s, step %d:\n got %+v\nwant %+v (memory)", name, i, got[i], want[i])
						}
					}
				}
			})
		}
	}
}

// checkPeriodSteps checks the results of steps against their wants and the
// bounds of a period change whose longer period is longer, counted from the
// latest time so far (a clock that steps back waits for it).
func checkPeriodSteps(t *testing.T, algo Algorithm, steps []periodStep, got []ItemState, longer time.Duration) {
	t.Helper()
	var latest time.Duration
	for i, st := range steps {
		latest = max(latest, st.at)
		is := got[i]
		where := fmt.Sprintf("step %d (%c %d at %s, period %s)", i, st.op, st.cost, st.at, st.limit.Period)
		if is.Allowed != (st.want == "ok") {
			t.Fatalf("%s: allowed %v, want %s: %+v", where, is.Allowed, st.want, is)
		}
		if st.reset != 0 && is.ResetAfter != st.reset {
			t.Fatalf("%s: ResetAfter %s, want %s: %+v", where, is.ResetAfter, st.reset, is)
		}
		bound := longer + latest - st.at
		if algo == SlidingWindow {
			bound += st.limit.Period
		}
		if is.ResetAfter > bound || is.RetryAfter > bound {
			t.Fatalf("%s: RetryAfter %s, ResetAfter %s, beyond %s", where, is.RetryAfter, is.ResetAfter, bound)
		}
	}
}

// TestWindowOldLayout writes windows as the version before periods were
// kept wrote them (four doubles: w, prev, curr, expiry in ms) and requires
// the same decisions as Memory holding the same state, when the period is
// unchanged, the clock behind the state's window included; and, when the
// period changed with the upgrade, what the Redis documentation says: a
// grown period carries the count into the current window, a shrunk one
// forgets it.
func TestWindowOldLayout(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	// t0 is 10.3s into a day: in the second [10s, 11s) and the 2s window
	// [10s, 12s).
	t0 := start.Add(10300 * time.Millisecond)
	sec := time.Second.Microseconds()
	type debit struct {
		at   time.Duration // since t0
		cost int64
	}
	cases := []struct {
		name   string
		setup  []debit // on Memory
		w      int64   // the old value's window, seconds since t0's
		prev   int64   // the old value's counts
		curr   int64
		period time.Duration // the limit read with
	}{
		{"same period", []debit{{-time.Second, 4}, {0, 3}}, 0, 4, 3, time.Second},
		{"clock behind", []debit{{time.Second, 6}}, 1, 0, 6, time.Second},
	}
	steps := []debit{{200 * time.Millisecond, 0}, {300 * time.Millisecond, 2}, {900 * time.Millisecond, 10}, {900 * time.Millisecond, 1},
		{1200 * time.Millisecond, 1}, {500 * time.Millisecond, 0}, {500 * time.Millisecond, 5}, {2500 * time.Millisecond, 10}, {3100 * time.Millisecond, 10}}
	// oldValue is a window value of the old layout for window w (in µs
	// periods of p), with the expiry its writer would have set: the end of
	// the window the counts stop counting in, plus a second.
	oldValue := func(w, prev, curr, p int64) string {
		end := (w + 2) * p
		var buf []byte
		for _, v := range []int64{w, prev, curr, end/1000 + 1000} {
			buf = appendNumber(buf, v)
		}
		return string(buf)
	}
	w0 := t0.UnixMicro() / sec
	for _, algo := range []Algorithm{FixedWindow, SlidingWindow} {
		for _, tc := range cases {
			t.Run(algo.String()+"/"+tc.name, func(t *testing.T) {
				l := Limit{Name: "w", Algorithm: algo, Rate: 10, Period: tc.period}
				clk := newClock()
				m := NewMemory(MemoryConfig{Now: clk.Now})
				for i, d := range tc.setup {
					clk.Set(t0.Add(d.at))
					if res, err := m.Debit(ctx, fmt.Sprint("s", i), []Item{{Limit: l, Key: "{k}", Cost: d.cost}}); err != nil || !res.Allowed {
						t.Fatalf("setup %d: %+v %v", i, res, err)
					}
				}
				r := newRedisStore(c, clk)
				it := Item{Limit: l, Key: "{k}"}
				prev := tc.prev
				if algo == FixedWindow {
					prev = 0
				}
				if err := c.Set(ctx, r.key(&it), oldValue(w0+tc.w, prev, tc.curr, sec), time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				for i, d := range steps {
					clk.Set(t0.Add(d.at))
					items := []Item{{Limit: l, Key: "{k}", Cost: d.cost}}
					want, werr := m.Debit(ctx, fmt.Sprint("r", i), items)
					got, gerr := r.Debit(ctx, fmt.Sprint("r", i), items)
					if fmt.Sprint(got, gerr) != fmt.Sprint(want, werr) {
						t.Fatalf("step %d (%d at %s):\n got %+v %v\nwant %+v %v (memory)", i, d.cost, d.at, got, gerr, want, werr)
					}
				}
				// Rewritten with its period: a fixed window's in place of the
				// previous count, a sliding window's as a fifth double.
				v := c.Get(ctx, r.key(&it)).Val()
				want := string(appendNumber(nil, sec))
				switch {
				case algo == FixedWindow && (len(v) != 32 || v[8:16] != want):
					t.Fatalf("fixed window rewritten as %x, want 32 bytes with the period second", v)
				case algo == SlidingWindow && (len(v) != 40 || v[32:] != want):
					t.Fatalf("sliding window rewritten as %x, want 40 bytes with the period last", v)
				}
			})
		}
		t.Run(algo.String()+"/period changed with the upgrade", func(t *testing.T) {
			for _, tc := range []struct {
				name       string
				old, new   time.Duration
				allowed    bool
				resetAfter time.Duration
			}{
				// Read as window 2 × w0 of 2s, far ahead: carried into the
				// current one, [10s, 12s), instead.
				{"grown", time.Second, 2 * time.Second, false, 1700 * time.Millisecond},
				// Read as window w0 / 2 of 1s, long past: forgotten.
				{"shrunk", 2 * time.Second, time.Second, true, 700 * time.Millisecond},
			} {
				clk := newClock()
				clk.Set(t0)
				r := newRedisStore(c, clk)
				l := Limit{Name: "w", Algorithm: algo, Rate: 10, Period: tc.new}
				it := Item{Limit: l, Key: "{k}", Cost: 1}
				p := tc.old.Microseconds()
				if err := c.Set(ctx, r.key(&it), oldValue(t0.UnixMicro()/p, 0, 10, p), time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				res, err := r.Debit(ctx, "a", []Item{it})
				if err != nil {
					t.Fatal(err)
				}
				reset := tc.resetAfter
				if algo == SlidingWindow {
					reset += tc.new // the count weighs one more period
				}
				if res.Allowed != tc.allowed || res.Items[0].ResetAfter != reset {
					t.Fatalf("%s: %+v, want allowed %v, ResetAfter %s", tc.name, res.Items[0], tc.allowed, reset)
				}
			}
		})
	}
}

// TestCarryBounds checks spec.carry on many periods and windows: an
// unchanged period maps a window to itself, and a carried window ends after
// the old window starts and no later than one longer period after it.
func TestCarryBounds(t *testing.T) {
	periods := []int64{1, 7, 1000, 1500, 2000, 3000, 999_983, 1_000_000, 2_000_000, 3_600_000_000, 86_400_000_000}
	for _, op := range periods {
		for _, np := range periods {
			s := spec{period: np}
			for _, at := range []int64{0, 1, 1_800_000_000_000_000, 1_800_000_000_123_457, 1_800_003_600_999_999} {
				st := state{w: at / op, wp: op, prev: 1, curr: 2}
				w, prev, curr := s.carry(&st)
				start, longer := st.w*op, max(op, np)
				if end := (w + 1) * np; end <= start || end > start+longer {
					t.Fatalf("period %d to %d, window %d: carried into [%d, %d), not ending in (%d, %d]", op, np, st.w, w*np, end, start, start+longer)
				}
				if prev+curr > 3 || curr < 2 {
					t.Fatalf("period %d to %d, window %d: counts %d, %d from 1, 2", op, np, st.w, prev, curr)
				}
				if op == np && (w != st.w || prev != 1 || curr != 2) {
					t.Fatalf("period %d unchanged, window %d: carried to %d (%d, %d)", op, st.w, w, prev, curr)
				}
			}
		}
	}
}

// driveSteps runs run(i) for each of n steps, the clock at t0 + at(i): one
// after another, or, with batch, all together in one batch of batch's (and
// fails unless they made one script call).
func driveSteps(t *testing.T, clk *clock, t0 time.Time, n int, at func(int) time.Duration, batch *Redis, run func(int)) {
	t.Helper()
	if batch == nil {
		for i := range n {
			clk.Set(t0.Add(at(i)))
			run(i)
		}
		return
	}
	calls := batch.scriptCalls.Load()
	hold(batch)
	var wg sync.WaitGroup
	for i := range n {
		clk.Set(t0.Add(at(i)))
		wg.Go(func() { run(i) })
		waitPending(t, batch, i+1)
	}
	release(batch)
	wg.Wait()
	if got := batch.scriptCalls.Load() - calls; got != 1 {
		t.Fatalf("%d script calls, want one batch", got)
	}
}
