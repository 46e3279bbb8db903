package weighted

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// budget is a month limit of the tests: 10 units per UTC calendar month.
var budget = Limit{Name: "budget", Algorithm: FixedWindow, Rate: 10, Calendar: Month}

func utc(y int, m time.Month, d, h, min, s, us int) time.Time {
	return time.Date(y, m, d, h, min, s, us*1000, time.UTC)
}

func TestCalendarValidate(t *testing.T) {
	cases := map[string]struct {
		change func(*Limit)
		valid  bool
	}{
		"month":                  {func(*Limit) {}, true},
		"burst equal to rate":    {func(l *Limit) { l.Burst = 10 }, true},
		"burst above rate":       {func(l *Limit) { l.Burst = 11 }, false},
		"negative burst":         {func(l *Limit) { l.Burst = -1 }, false},
		"with a period":          {func(l *Limit) { l.Period = 30 * 24 * time.Hour }, false},
		"token bucket":           {func(l *Limit) { l.Algorithm = TokenBucket }, false},
		"sliding window":         {func(l *Limit) { l.Algorithm = SlidingWindow }, false},
		"sliding log":            {func(l *Limit) { l.Algorithm = SlidingLog }, false},
		"concurrency":            {func(l *Limit) { l.Algorithm = Concurrency }, false},
		"unknown calendar":       {func(l *Limit) { l.Calendar = 7 }, false},
		"zero rate":              {func(l *Limit) { l.Rate = 0 }, false},
		"rate above 2^50":        {func(l *Limit) { l.Rate = 1<<50 + 1 }, false},
		"nano-dollars, $500":     {func(l *Limit) { l.Rate = 500_000_000_000 }, true},
		"no calendar, no period": {func(l *Limit) { l.Calendar = NoCalendar }, false},
		"colon in name":          {func(l *Limit) { l.Name = "a:b" }, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := budget
			tc.change(&l)
			if err := l.Validate(); (err == nil) != tc.valid {
				t.Fatalf("Validate(%+v) = %v, want valid %v", l, err, tc.valid)
			}
		})
	}
	l := budget
	l.Rate = 500
	if s := l.String(); s != "budget: fixed_window 500/month" {
		t.Fatalf("String: %q", s)
	}
	if s := (Limit{Name: "w", Algorithm: FixedWindow, Rate: 5, Period: time.Hour}).String(); s != "w: fixed_window 5/1h0m0s" {
		t.Fatalf("String without a calendar: %q", s)
	}
	if s := Calendar(9).String(); s != "Calendar(9)" {
		t.Fatalf("String of an unknown calendar: %q", s)
	}
	if err := (Limit{Name: "b", Algorithm: TokenBucket, Rate: 1, Calendar: Month}).Validate(); err == nil || !strings.Contains(err.Error(), "only to fixed_window") {
		t.Fatalf("month token bucket: %v", err)
	}
}

// TestMonthArithmetic checks monthIndex and monthStart at every month
// boundary from 1970 to 2400, and lib.lua's month_index and month_start
// (through window, with the script's time set) against the time package at those boundaries and at random times. The
// times go to Lua as doubles: beyond 2^53 µs (the year 2255) they are
// rounded to even µs, and checked as rounded.
func TestMonthArithmetic(t *testing.T) {
	var ts []int64
	for y := 1970; y < 2400; y++ {
		for m := time.January; m <= time.December; m++ {
			start := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
			w := int64(y)*12 + int64(m) - 1
			if got := monthStart(w); got != start {
				t.Fatalf("monthStart(%d) = %d, want %d (%d-%02d)", w, got, start, y, m)
			}
			if got := monthIndex(start); got != w {
				t.Fatalf("monthIndex(%d) = %d, want %d", start, got, w)
			}
			if start > 0 {
				if got := monthIndex(start - 1); got != w-1 {
					t.Fatalf("monthIndex(%d) = %d, want %d", start-1, got, w-1)
				}
			}
			ts = append(ts, start, max(start-1, 0), start+1)
		}
	}
	end := utc(2400, 1, 1, 0, 0, 0, 0).UnixMicro()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		ts = append(ts, rng.Int64N(end))
	}

	c := testRedis(t)
	src := libLua + `
local L = lib()
local buf, out = ARGV[1], {}
for i = 1, #buf / 8 do
  now = sunpack('<d', buf, 8 * i - 7)
  local w, _, _, start, _, stop = L.window(false, 0, MONTH_WINDOW)
  out[i] = pack('<ddd', w, start, stop)
end
return table.concat(out)
`
	const chunk = 5000
	for lo := 0; lo < len(ts); lo += chunk {
		part := ts[lo:min(lo+chunk, len(ts))]
		var buf []byte
		for _, v := range part {
			buf = appendNumber(buf, v)
		}
		v, err := c.Eval(context.Background(), src, nil, string(buf)).Result()
		if err != nil {
			t.Fatal(err)
		}
		reply, _ := v.(string)
		if len(reply) != 24*len(part) {
			t.Fatalf("reply of %d bytes for %d times", len(reply), len(part))
		}
		for i, v := range part {
			v = int64(float64(v)) // as Lua reads it
			tm := time.UnixMicro(v).UTC()
			w := int64(tm.Year())*12 + int64(tm.Month()) - 1
			start := time.Date(tm.Year(), tm.Month(), 1, 0, 0, 0, 0, time.UTC)
			want := [3]int64{w, start.UnixMicro(), start.AddDate(0, 1, 0).UnixMicro()}
			var got [3]int64
			for k := range got {
				got[k] = int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[24*i+8*k:]))))
			}
			if got != want {
				t.Fatalf("Lua at %d (%s): index, start, end %v, want %v", v, tm, got, want)
			}
			if g := [3]int64{monthIndex(v), monthStart(w), monthStart(w + 1)}; g != want {
				t.Fatalf("Go at %d (%s): index, start, end %v, want %v", v, tm, g, want)
			}
		}
	}
}

// monthStep is one request of TestMonthStores, at an absolute time.
type monthStep struct {
	at    time.Time
	op    byte // 'd' debit, 'p' peek
	cost  int64
	want  string        // "ok" or "deny"
	retry time.Duration // the RetryAfter wanted, checked when want is "deny"
	reset time.Duration // when not 0, the ResetAfter wanted
}

// TestMonthStores runs month windows across month boundaries, leap and
// common Februaries, a year's end and a clock that steps back, on Memory,
// Redis one request at a time, Redis with MaxBatch 1 and Redis in one
// batch, and requires the wanted results of every store, the same on all.
func TestMonthStores(t *testing.T) {
	c := testRedis(t)
	day := 24 * time.Hour
	cases := []struct {
		name  string
		steps []monthStep
	}{
		{"jan 31 to feb 1", []monthStep{
			{at: utc(2026, 1, 31, 23, 59, 59, 999999), op: 'd', cost: 10, want: "ok", reset: time.Microsecond},
			{at: utc(2026, 1, 31, 23, 59, 59, 999999), op: 'd', cost: 1, want: "deny", retry: time.Microsecond},
			{at: utc(2026, 2, 1, 0, 0, 0, 0), op: 'd', cost: 10, want: "ok", reset: 28 * day},
			{at: utc(2026, 2, 28, 23, 59, 59, 999999), op: 'd', cost: 1, want: "deny", retry: time.Microsecond},
			{at: utc(2026, 3, 1, 0, 0, 0, 0), op: 'd', cost: 1, want: "ok", reset: 31 * day},
		}},
		{"leap 2024", []monthStep{
			{at: utc(2024, 2, 28, 12, 0, 0, 0), op: 'd', cost: 10, want: "ok", reset: 36 * time.Hour},
			{at: utc(2024, 2, 29, 0, 0, 0, 0), op: 'd', cost: 1, want: "deny", retry: day},
			{at: utc(2024, 2, 29, 23, 59, 59, 999999), op: 'd', cost: 1, want: "deny", retry: time.Microsecond},
			{at: utc(2024, 3, 1, 0, 0, 0, 0), op: 'd', cost: 10, want: "ok", reset: 31 * day},
		}},
		{"leap 2028", []monthStep{
			{at: utc(2028, 2, 1, 0, 0, 0, 0), op: 'd', cost: 4, want: "ok", reset: 29 * day},
			{at: utc(2028, 2, 28, 23, 59, 59, 999999), op: 'd', cost: 7, want: "deny", retry: day + time.Microsecond},
			{at: utc(2028, 2, 29, 23, 0, 0, 0), op: 'd', cost: 6, want: "ok", reset: time.Hour},
			{at: utc(2028, 3, 1, 0, 0, 0, 0), op: 'p', cost: 10, want: "ok"},
		}},
		{"2100 is not leap", []monthStep{
			{at: utc(2100, 2, 1, 0, 0, 0, 0), op: 'd', cost: 10, want: "ok", reset: 28 * day},
			{at: utc(2100, 2, 28, 23, 59, 59, 999999), op: 'd', cost: 1, want: "deny", retry: time.Microsecond},
			{at: utc(2100, 3, 1, 0, 0, 0, 0), op: 'd', cost: 10, want: "ok", reset: 31 * day},
		}},
		{"2000 is leap", []monthStep{
			{at: utc(2000, 2, 28, 0, 0, 0, 0), op: 'd', cost: 10, want: "ok", reset: 2 * day},
			{at: utc(2000, 2, 29, 12, 0, 0, 0), op: 'd', cost: 1, want: "deny", retry: 12 * time.Hour},
		}},
		{"dec 31 to jan 1", []monthStep{
			{at: utc(2026, 12, 31, 23, 59, 59, 999999), op: 'd', cost: 10, want: "ok", reset: time.Microsecond},
			{at: utc(2026, 12, 31, 23, 59, 59, 999999), op: 'p', cost: 1, want: "deny", retry: time.Microsecond},
			{at: utc(2027, 1, 1, 0, 0, 0, 0), op: 'd', cost: 10, want: "ok", reset: 31 * day},
		}},
		{"exhausted on the 31st", []monthStep{
			{at: utc(2026, 3, 31, 15, 30, 0, 250000), op: 'd', cost: 7, want: "ok"},
			{at: utc(2026, 3, 31, 15, 30, 0, 250000), op: 'd', cost: 3, want: "ok"},
			{at: utc(2026, 3, 31, 15, 30, 0, 250001), op: 'd', cost: 1, want: "deny", retry: utc(2026, 4, 1, 0, 0, 0, 0).Sub(utc(2026, 3, 31, 15, 30, 0, 250001))},
			{at: utc(2026, 3, 31, 23, 59, 59, 999999), op: 'p', cost: 0, want: "ok", reset: time.Microsecond},
			{at: utc(2026, 4, 1, 0, 0, 0, 0), op: 'd', cost: 10, want: "ok", reset: 30 * day},
		}},
		{"clock back across a boundary", []monthStep{
			{at: utc(2026, 1, 20, 0, 0, 0, 0), op: 'd', cost: 5, want: "ok"},
			{at: utc(2026, 2, 1, 0, 0, 0, 500000), op: 'd', cost: 10, want: "ok"},
			// Back in January: still February's full window.
			{at: utc(2026, 1, 31, 23, 59, 59, 0), op: 'd', cost: 1, want: "deny", retry: 28*day + time.Second},
			{at: utc(2026, 1, 31, 23, 59, 59, 0), op: 'p', cost: 0, want: "ok", reset: 28*day + time.Second},
			{at: utc(2026, 1, 15, 0, 0, 0, 0), op: 'd', cost: 1, want: "deny", retry: 45 * day},
			{at: utc(2026, 3, 1, 0, 0, 0, 0), op: 'd', cost: 10, want: "ok"},
			// Back across a year's end: March's count still counts.
			{at: utc(2025, 12, 31, 0, 0, 0, 0), op: 'd', cost: 1, want: "deny", retry: 91 * day},
		}},
		{"clock back, partly used", []monthStep{
			{at: utc(2026, 5, 1, 0, 0, 0, 0), op: 'd', cost: 6, want: "ok"},
			{at: utc(2026, 4, 30, 23, 0, 0, 0), op: 'd', cost: 5, want: "deny", retry: 31*day + time.Hour},
			{at: utc(2026, 4, 30, 23, 0, 0, 0), op: 'd', cost: 4, want: "ok", reset: 31*day + time.Hour},
			{at: utc(2026, 5, 31, 0, 0, 0, 0), op: 'd', cost: 1, want: "deny"},
		}},
	}
	epoch := time.Unix(0, 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			steps := make([]periodStep, len(tc.steps))
			for i, st := range tc.steps {
				steps[i] = periodStep{at: st.at.Sub(epoch), limit: budget, op: st.op, cost: st.cost, want: st.want, reset: st.reset}
			}
			var want []ItemState
			for _, name := range stepStores {
				clk := newClock()
				s, batch := stepStore(c, clk, name)
				got := runPeriodSteps(t, s, clk, epoch, steps, batch)
				if want == nil {
					want = got
					for i, st := range tc.steps {
						is := got[i]
						where := fmt.Sprintf("step %d (%c %d at %s)", i, st.op, st.cost, st.at.Format(time.RFC3339Nano))
						if is.Allowed != (st.want == "ok") {
							t.Fatalf("%s: %+v, want %s", where, is, st.want)
						}
						if st.want == "deny" && st.retry != 0 && is.RetryAfter != st.retry {
							t.Fatalf("%s: RetryAfter %s, want %s", where, is.RetryAfter, st.retry)
						}
						if st.reset != 0 && is.ResetAfter != st.reset {
							t.Fatalf("%s: ResetAfter %s, want %s", where, is.ResetAfter, st.reset)
						}
					}
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

// TestMonthSettle settles month debits on Memory, Redis and Redis with
// MaxBatch 1: a refund goes only into the month debited, an extra charge
// into the current month up to full.
func TestMonthSettle(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	type op struct {
		at     time.Time
		kind   byte // 'd' debit, 's' settle, 'c' cancel, 'p' peek
		id     string
		cost   int64 // reserved (debit, settle) or peeked
		actual int64
		want   int64 // remaining after, checked by a peek
	}
	jan := utc(2026, 1, 31, 23, 0, 0, 0)
	feb := utc(2026, 2, 1, 0, 0, 0, 0)
	ops := []op{
		{at: jan, kind: 'd', id: "a", cost: 6, want: 4},
		{at: feb, kind: 'd', id: "b", cost: 8, want: 2},
		{at: feb, kind: 's', id: "a", cost: 6, actual: 0, want: 2},  // January's: no refund into February
		{at: feb, kind: 's', id: "b", cost: 8, actual: 3, want: 7},  // February's
		{at: feb, kind: 's', id: "b", cost: 8, actual: 0, want: 7},  // settled already
		{at: feb, kind: 'd', id: "c", cost: 2, want: 5},             //
		{at: feb, kind: 's', id: "c", cost: 2, actual: 20, want: 0}, // charged up to full
		{at: feb, kind: 'd', id: "d", cost: 1, want: 0},             // denied
		{at: jan, kind: 'p', want: 0},                               // the clock back: February's count
		{at: utc(2026, 3, 1, 0, 0, 0, 0), kind: 'p', want: 10},
		{at: utc(2026, 3, 1, 0, 0, 0, 0), kind: 'd', id: "e", cost: 9, want: 1},
		{at: utc(2026, 3, 2, 0, 0, 0, 0), kind: 'c', id: "e", cost: 9, want: 10},
	}
	// do runs op o on s at its time, and then a peek.
	do := func(s Store, clk *clock, o op) (int64, error) {
		clk.Set(o.at)
		items := []Item{{Limit: budget, Key: "{t}", Cost: o.cost}}
		var err error
		switch o.kind {
		case 'd':
			_, err = s.Debit(ctx, o.id, items)
		case 's':
			err = s.Settle(ctx, o.id, items, []int64{o.actual})
		case 'c':
			err = s.Cancel(ctx, o.id, items)
		}
		if err != nil {
			return 0, err
		}
		items[0].Cost = 0
		res, err := s.Peek(ctx, items)
		if err != nil {
			return 0, err
		}
		return res.Items[0].Remaining, nil
	}
	for _, name := range []string{"memory", "redis", "redis MaxBatch 1"} {
		t.Run(name, func(t *testing.T) {
			clk := newClock()
			var s Store
			switch name {
			case "memory":
				s = NewMemory(MemoryConfig{Now: clk.Now})
			case "redis":
				s = newBatchStore(c, clk, RedisConfig{})
			default:
				s = newBatchStore(c, clk, RedisConfig{MaxBatch: 1})
			}
			for i, o := range ops {
				if rem, err := do(s, clk, o); err != nil || rem != o.want {
					t.Fatalf("op %d (%c %s at %s): remaining %d %v, want %d", i, o.kind, o.id, o.at, rem, err, o.want)
				}
			}
		})
	}
	// In one batch: every op and then a peek queued in order, each at the
	// op's time.
	t.Run("redis batch", func(t *testing.T) {
		clk := newClock()
		r := newBatchStore(c, clk, RedisConfig{})
		calls := r.scriptCalls.Load()
		hold(r)
		got := make([]int64, len(ops))
		errs := make([]error, len(ops))
		var wg sync.WaitGroup
		queued := 0
		for i, o := range ops {
			clk.Set(o.at)
			items := []Item{{Limit: budget, Key: "{t}", Cost: o.cost}}
			if o.kind != 'p' {
				wg.Go(func() {
					var err error
					switch o.kind {
					case 'd':
						_, err = r.Debit(ctx, o.id, items)
					case 's':
						err = r.Settle(ctx, o.id, items, []int64{o.actual})
					case 'c':
						err = r.Cancel(ctx, o.id, items)
					}
					if err != nil {
						errs[i] = err
					}
				})
				queued++
				waitPending(t, r, queued)
			}
			wg.Go(func() {
				res, err := r.Peek(ctx, []Item{{Limit: budget, Key: "{t}"}})
				if err != nil {
					errs[i] = err
					return
				}
				got[i] = res.Items[0].Remaining
			})
			queued++
			waitPending(t, r, queued)
		}
		release(r)
		wg.Wait()
		if n := r.scriptCalls.Load() - calls; n != 1 {
			t.Fatalf("%d script calls, want one batch", n)
		}
		for i, o := range ops {
			if errs[i] != nil || got[i] != o.want {
				t.Fatalf("op %d (%c %s at %s): remaining %d %v, want %d", i, o.kind, o.id, o.at, got[i], errs[i], o.want)
			}
		}
	})
}

// TestMonthExactUnderConcurrency races debits of a month window beside a
// period's fixed window and a token bucket, batched and not, and requires
// exactly the capacity admitted.
func TestMonthExactUnderConcurrency(t *testing.T) {
	c := testRedis(t)
	month := budget
	month.Rate = 300
	items := []Item{
		{Limit: month, Key: "{k}"},
		{Limit: Limit{Name: "budget", Algorithm: FixedWindow, Rate: 400, Period: time.Hour}, Key: "{k}"},
		{Limit: Limit{Name: "tb", Rate: 1000, Period: time.Minute}, Key: "{k}"},
	}
	for _, tc := range []struct {
		name    string
		cfg     RedisConfig
		batched bool
	}{{"default", RedisConfig{}, true}, {"MaxBatch 1", RedisConfig{MaxBatch: 1}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			clk.Set(utc(2026, 1, 31, 23, 59, 59, 0))
			r := newBatchStore(c, clk, tc.cfg)
			s := &countingStore{Store: r}
			calls := r.scriptCalls.Load()
			if admitted := raceDebits(t, s, items, 64); admitted != 300 {
				t.Fatalf("admitted %d, want 300", admitted)
			}
			debits, calls := s.calls.Load(), r.scriptCalls.Load()-calls
			if tc.batched == (calls == debits) {
				t.Fatalf("%d script calls for %d debits, batched %v", calls, debits, tc.batched)
			}
			checkRemaining(t, r, items[:1], 300)
			// A new month: room again for the month, not for the hour.
			clk.Set(utc(2026, 2, 1, 0, 0, 0, 0))
			if admitted := raceDebits(t, r, items[:1], 64); admitted != 300 {
				t.Fatalf("admitted %d in February, want 300", admitted)
			}
		})
	}
}

// TestMonthKeys checks that a month window keeps apart from a period's
// window of the same name and key, on both stores, that its Redis key has
// code fwm and expires after its month (plus the documented 60 s), and
// that Memory's entry expires when its month ends.
func TestMonthKeys(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	period := Limit{Name: "budget", Algorithm: FixedWindow, Rate: 10, Period: 30 * 24 * time.Hour}
	clk := newClock()
	for _, s := range bothStores(c, clk) {
		t.Run(s.name, func(t *testing.T) {
			for i, l := range []Limit{period, budget} {
				res, err := s.Debit(ctx, fmt.Sprint("x", i), []Item{{Limit: l, Key: "k", Cost: 10}})
				if err != nil || !res.Allowed {
					t.Fatalf("%s: %+v %v", l, res, err)
				}
			}
			if _, err := s.Debit(ctx, "a", []Item{{Limit: period, Key: "k", Cost: 1}, {Limit: budget, Key: "k", Cost: 1}}); err != nil {
				t.Fatalf("a month and a period of one name in one debit: %v", err)
			}
		})
	}

	r := newRedisStore(c, nil) // the server's clock and real TTLs
	before := time.Now()
	if res, err := r.Debit(ctx, "a", []Item{{Limit: budget, Key: "k", Cost: 3}}); err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	key := r.prefix + "budget:fwm:{k}"
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	y, m, _ := before.UTC().Date()
	end := time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
	if lo, hi := time.Until(end), end.Sub(before)+time.Minute+time.Second; ttl < lo || ttl > hi {
		t.Fatalf("key %s: TTL %s, want within [%s, %s]", key, ttl, lo, hi)
	}
	v := c.Get(ctx, key).Val()
	want := string(appendNumber(appendNumber(appendNumber(nil, int64(y)*12+int64(m)-1), -1), 3))
	if len(v) != 32 || v[:24] != want {
		t.Fatalf("value %x, want w, -1, 3 and the expiry", v)
	}

	clk.Set(utc(2026, 4, 10, 12, 0, 0, 0))
	mem := NewMemory(MemoryConfig{Now: clk.Now})
	if _, err := mem.Debit(ctx, "a", []Item{{Limit: budget, Key: "k", Cost: 3}}); err != nil {
		t.Fatal(err)
	}
	for i := range mem.shards {
		for k, e := range mem.shards[i].m {
			// The window and the reservation's record both last until May.
			if want := utc(2026, 5, 1, 0, 0, 0, 0).UnixMicro(); e.expires != want {
				t.Fatalf("%+v expires at %d, want %d", k, e.expires, want)
			}
		}
	}
}
