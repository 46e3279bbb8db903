package weighted

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// diffRun runs the same operations on a Memory and on Redis stores that
// share one clock, and fails on the first answer in which they differ.
type diffRun struct {
	t      *testing.T
	ctx    context.Context
	clk    *clock
	stores []namedStore
	log    []string // the operations so far, for the failure message
}

func newDiffRun(t *testing.T, stores []namedStore, clk *clock) *diffRun {
	return &diffRun{t: t, ctx: context.Background(), clk: clk, stores: stores}
}

// note records an operation.
func (d *diffRun) note(format string, args ...any) {
	d.log = append(d.log, d.clk.Now().UTC().Format("2006-01-02T15:04:05.000000")+" "+fmt.Sprintf(format, args...))
}

// fail reports a difference with the last operations.
func (d *diffRun) fail(format string, args ...any) {
	d.t.Helper()
	from := max(len(d.log)-40, 0)
	if testing.Verbose() {
		from = 0
	}
	d.t.Fatalf("%s\nlast operations:\n  %s", fmt.Sprintf(format, args...), strings.Join(d.log[from:], "\n  "))
}

// errText describes an error as the stores must agree on it.
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// debit debits on every store and returns the first store's answer.
func (d *diffRun) debit(id string, items []Item) (Result, error) {
	d.t.Helper()
	d.note("debit %s %s", id, itemsText(items))
	var first Result
	var firstErr error
	var want string
	for k, s := range d.stores {
		res, err := s.Debit(d.ctx, id, items)
		got := fmt.Sprintf("%+v %s", res, errText(err))
		if k == 0 {
			first, firstErr, want = res, err, got
		} else if got != want {
			d.fail("debit %s: %s says\n  %s\n%s says\n  %s", id, d.stores[0].name, want, s.name, got)
		}
	}
	return first, firstErr
}

func (d *diffRun) peek(items []Item) (Result, error) {
	d.t.Helper()
	var first Result
	var firstErr error
	var want string
	for k, s := range d.stores {
		res, err := s.Peek(d.ctx, items)
		got := fmt.Sprintf("%+v %s", res, errText(err))
		if k == 0 {
			first, firstErr, want = res, err, got
		} else if got != want {
			var diff []string
			for i := range min(len(res.Items), len(first.Items)) {
				if res.Items[i] != first.Items[i] {
					diff = append(diff, fmt.Sprintf("%s key %q: %s %+v, %s %+v", items[i].Limit, items[i].Key, d.stores[0].name, first.Items[i], s.name, res.Items[i]))
				}
			}
			d.fail("peek: the stores differ:\n  %s\n%s\n%s", strings.Join(diff, "\n  "), want, got)
		}
	}
	return first, firstErr
}

// end settles (actual not nil) or cancels (actual nil) on every store.
func (d *diffRun) end(id string, items []Item, actual []int64) error {
	d.t.Helper()
	if actual == nil {
		d.note("cancel %s %s", id, itemsText(items))
	} else {
		d.note("settle %s %s actual %v", id, itemsText(items), actual)
	}
	var firstErr error
	for k, s := range d.stores {
		var err error
		if actual == nil {
			err = s.Cancel(d.ctx, id, items)
		} else {
			err = s.Settle(d.ctx, id, items, actual)
		}
		if k == 0 {
			firstErr = err
		} else if errText(err) != errText(firstErr) {
			d.fail("settle %s: %s says %v, %s says %v", id, d.stores[0].name, firstErr, s.name, err)
		}
	}
	return firstErr
}

func (d *diffRun) renew(id string, items []Item) {
	d.t.Helper()
	d.note("renew %s %s", id, itemsText(items))
	var first string
	for k, s := range d.stores {
		got := errText(s.Renew(d.ctx, id, items))
		if k == 0 {
			first = got
		} else if got != first {
			d.fail("renew %s: %s says %s, %s says %s", id, d.stores[0].name, first, s.name, got)
		}
	}
}

func (d *diffRun) reset(items []Item) {
	d.t.Helper()
	d.note("reset %s", itemsText(items))
	var first string
	for k, s := range d.stores {
		got := errText(s.Reset(d.ctx, items))
		if k == 0 {
			first = got
		} else if got != first {
			d.fail("reset: %s says %s, %s says %s", d.stores[0].name, first, s.name, got)
		}
	}
}

func itemsText(items []Item) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = fmt.Sprintf("[%s key %q cost %d]", it.Limit, it.Key, it.Cost)
	}
	return strings.Join(parts, " ")
}

// diffHeld is a reservation the random run made: its id and items as
// debited.
type diffHeld struct {
	id    string
	items []Item
	ended time.Time // zero while not settled nor cancelled
}

// diffLimits are the slots of the random run: each keeps its name, its
// algorithm and its calendar across reloads, which change its rate, burst
// and period.
func diffLimits() []Limit {
	return []Limit{
		{Name: "tb", Algorithm: TokenBucket, Rate: 10, Period: time.Second, Burst: 15},
		{Name: "tb1", Algorithm: TokenBucket, Rate: 1, Period: time.Second},
		{Name: "gcra", Algorithm: GCRA, Rate: 7, Period: 700 * time.Millisecond, Burst: 3},
		{Name: "usd", Algorithm: TokenBucket, Rate: 100_000_000_000, Period: 24 * time.Hour},
		{Name: "huge", Algorithm: GCRA, Rate: 1 << 50, Period: time.Microsecond},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 5, Period: time.Second},
		{Name: "swbig", Algorithm: SlidingWindow, Rate: 100_000_000_000, Period: time.Minute},
		{Name: "fw", Algorithm: FixedWindow, Rate: 4, Period: 1500 * time.Millisecond},
		{Name: "fw1", Algorithm: FixedWindow, Rate: 1, Period: time.Second},
		{Name: "month", Algorithm: FixedWindow, Rate: 9, Calendar: Month},
		{Name: "log", Algorithm: SlidingLog, Rate: 4, Period: 2 * time.Second},
		{Name: "conc", Algorithm: Concurrency, Rate: 3, Period: 2 * time.Second},
		{Name: "conc1", Algorithm: Concurrency, Rate: 1, Period: time.Second},
	}
}

// reload returns l with another rate, burst or period, as a config reload
// may give it.
func reload(rng *rand.Rand, l Limit) Limit {
	for {
		n := l
		switch rng.IntN(4) {
		case 0:
			n.Rate = []int64{1, 2, 3, 5, 8, 13, 100, 100_000_000_000, 1 << 50}[rng.IntN(9)]
		case 1:
			n.Rate = max(1, l.Rate/2)
		case 2:
			n.Rate = l.Rate * 2
		case 3:
			if l.Calendar == NoCalendar {
				n.Period = []time.Duration{time.Microsecond, 300 * time.Millisecond, time.Second, 1700 * time.Millisecond, time.Minute, time.Hour}[rng.IntN(6)]
			}
		}
		n.Burst = 0
		if (n.Algorithm == TokenBucket || n.Algorithm == GCRA) && rng.IntN(2) == 0 {
			n.Burst = []int64{1, 2, n.Rate, n.Rate * 3, 1 << 50}[rng.IntN(5)]
		}
		if n.Validate() == nil {
			return n
		}
	}
}

// edgeCost returns a debit's cost for l: mostly within its capacity, at its
// edges, and sometimes beyond it or negative.
func edgeCost(rng *rand.Rand, l Limit) int64 {
	c := l.Capacity()
	switch rng.IntN(16) {
	case 0:
		return 0
	case 1:
		return 1
	case 2:
		return c
	case 3:
		return max(c-1, 0)
	case 4:
		return c + 1
	case 5:
		return math.MaxInt64
	case 6:
		return 1 << 53
	case 7:
		return -1
	default:
		return rng.Int64N(min(c, 8)) + 1
	}
}

// edgeActual returns a settlement's actual cost for a reserved cost on l.
func edgeActual(rng *rand.Rand, l Limit, reserved int64) int64 {
	c := l.Capacity()
	switch rng.IntN(12) {
	case 0:
		return 0
	case 1:
		return reserved
	case 2:
		return reserved + 1
	case 3:
		return reserved + c
	case 4:
		return 2*c + reserved + 7
	case 5:
		return math.MaxInt64
	case 6:
		return 1 << 53
	case 7:
		return 1<<53 + 1
	case 8:
		return math.MaxInt64 - reserved + 1 // reserved + this wraps
	default:
		return rng.Int64N(min(c, 8) + 1)
	}
}

// TestDifferentialAttackRandom runs random operation sequences on Memory
// and Redis side by side and checks that every answer (allowed, remaining,
// retry after, reset after, decider, error) is the same on both, and that
// no state reports more than its capacity or less than nothing.
//
// The operations: all-or-nothing debits of up to four limits, the same key
// under several limits, edge costs (0, 1, the capacity, above it, 2^53,
// max int64, negative), settlements with edge actual costs (0, above the
// reservation, above the capacity, 2^53 + 1, max int64) and of ids never
// debited, repeated settlements and cancellations, renewals, reused
// reservation ids, resets, losses of the whole state, reloads of rates,
// bursts and periods, and a clock that moves by microseconds, to window
// edges, across month ends and by days.
func TestDifferentialAttackRandom(t *testing.T) {
	c := testRedis(t)
	starts := []time.Time{
		start,
		time.Date(2027, 1, 31, 23, 59, 58, 0, time.UTC),
		time.Date(2028, 2, 28, 23, 59, 59, 500_000_000, time.UTC), // a leap year
		time.Date(2026, 12, 31, 23, 59, 59, 999_000_000, time.UTC),
	}
	keys := []string{"{acme}", "{acme}:model=x", "{globex}", "plain"}
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			clk := newClock()
			clk.Set(starts[seed%uint64(len(starts))])
			d := newDiffRun(t, bothStores(c, clk), clk)
			rng := rand.New(rand.NewPCG(seed, 0xd1ff))
			limits := diffLimits()
			var held []diffHeld
			var admitted, denied int
			randomItems := func() []Item {
				n := 1 + rng.IntN(4)
				items := make([]Item, 0, n)
				for _, li := range rng.Perm(len(limits))[:n] {
					l := limits[li]
					items = append(items, Item{Limit: l, Key: keys[rng.IntN(len(keys))], Cost: edgeCost(rng, l)})
				}
				if rng.IntN(30) == 0 {
					// The same limit and key twice: ErrDuplicateItem.
					items = append(items, items[0])
				}
				return items
			}
			// peekAll peeks every limit on every key, and checks the
			// bounds of what the stores report.
			peekAll := func() {
				t.Helper()
				for _, k := range keys {
					items := make([]Item, len(limits))
					for i, l := range limits {
						items[i] = Item{Limit: l, Key: k}
					}
					res, err := d.peek(items)
					if err != nil {
						d.fail("peek: %v", err)
					}
					for i, is := range res.Items {
						if is.Remaining > is.Capacity {
							d.fail("%s on %s: remaining %d above capacity %d", limits[i], k, is.Remaining, is.Capacity)
						}
					}
				}
			}
			for step := range 500 {
				switch r := rng.IntN(24); {
				case r < 9 || len(held) == 0:
					id := "req-" + strconv.Itoa(step)
					items := randomItems()
					retry := false
					// A debit retried under its id, as after an unknown
					// outcome.
					if len(held) > 0 && rng.IntN(8) == 0 {
						if h := held[rng.IntN(len(held))]; h.ended.IsZero() {
							id, items, retry = h.id, h.items, true
						}
					}
					res, err := d.debit(id, items)
					switch {
					case err != nil:
					case res.Allowed:
						admitted++
						if !retry {
							held = append(held, diffHeld{id: id, items: items})
						}
					default:
						denied++
					}
				case r < 13:
					h := &held[rng.IntN(len(held))]
					if !h.ended.IsZero() && clk.Now().Sub(h.ended) > DefaultSettleTTL/2 {
						// Memory forgets a settled id on its clock, Redis on
						// its own: a settlement retried this late is not
						// compared.
						continue
					}
					actual := make([]int64, len(h.items))
					for j, it := range h.items {
						actual[j] = edgeActual(rng, it.Limit, it.Cost)
					}
					if d.end(h.id, h.items, actual) == nil && h.ended.IsZero() {
						h.ended = clk.Now()
					}
				case r < 15:
					h := &held[rng.IntN(len(held))]
					if !h.ended.IsZero() && clk.Now().Sub(h.ended) > DefaultSettleTTL/2 {
						continue
					}
					if d.end(h.id, h.items, nil) == nil && h.ended.IsZero() {
						h.ended = clk.Now()
					}
				case r < 16:
					// A settlement of an id never debited.
					items := randomItems()
					actual := make([]int64, len(items))
					for j, it := range items {
						actual[j] = edgeActual(rng, it.Limit, max(it.Cost, 0))
					}
					d.end("ghost-"+strconv.Itoa(step), items, actual)
				case r < 17:
					h := held[rng.IntN(len(held))]
					if !h.ended.IsZero() && clk.Now().Sub(h.ended) > DefaultSettleTTL/2 {
						// A renewal holds again a reservation whose end is
						// forgotten, which each store forgets on its own
						// clock (see above).
						continue
					}
					d.renew(h.id, h.items)
				case r < 18:
					i := rng.IntN(len(limits))
					was := limits[i]
					limits[i] = reload(rng, was)
					d.note("reload %s -> %s", was, limits[i])
				case r < 19 && rng.IntN(4) == 0:
					items := randomItems()
					for j := range items {
						items[j].Cost = 0
					}
					d.reset(items)
				case r < 19 && rng.IntN(6) == 0:
					// Every store loses its state (a restart, FLUSHALL):
					// the reservations held still settle, cancel and
					// renew, which holds their concurrency items again.
					d.note("lose")
					d.stores[0].Store = NewMemory(MemoryConfig{Now: clk.Now})
					if err := c.FlushAll(d.ctx).Err(); err != nil {
						t.Fatal(err)
					}
				default:
					advance(rng, clk, d)
				}
				peekAll()
			}
			if admitted < 30 || denied < 3 {
				t.Fatalf("%d debits admitted and %d denied: the sequence does not exercise both", admitted, denied)
			}
		})
	}
}

// advance moves the clock: by a microsecond, a few milliseconds, to just
// before or at the next whole second or minute, to the next month, by days,
// or (rarely) back a little.
func advance(rng *rand.Rand, clk *clock, d *diffRun) {
	now := clk.Now()
	var to time.Time
	switch rng.IntN(10) {
	case 0:
		to = now.Add(time.Microsecond)
	case 1:
		to = now.Truncate(time.Second).Add(time.Second)
	case 2:
		to = now.Truncate(time.Second).Add(time.Second - time.Microsecond)
	case 3:
		to = now.Truncate(time.Minute).Add(time.Minute)
	case 4:
		y, m, _ := now.UTC().Date()
		to = time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
		if rng.IntN(2) == 0 {
			to = to.Add(-time.Microsecond)
		}
	case 5:
		to = now.Add(time.Duration(rng.Int64N(int64(3 * 24 * time.Hour))))
	case 6:
		to = now.Add(-time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
		clk.Set(to)
		d.note("clock back -> %s", to.UTC().Format("2006-01-02T15:04:05.000000"))
		return
	default:
		to = now.Add(time.Duration(rng.Int64N(int64(700 * time.Millisecond))))
	}
	if !to.After(now) {
		to = now.Add(time.Microsecond)
	}
	clk.Set(to)
	d.note("clock -> %s", to.UTC().Format("2006-01-02T15:04:05.000000"))
}

// TestDifferentialAttackShrunkSlidingWindow checks a sliding window whose
// limit is lowered far below what it counts, as an operator blocking a
// tenant does (a daily token limit of 10^9 cut to 1): the tokens already
// counted fill the limit, in their window and, weighted, through the next
// one, on both stores. The weighted count, counts × ticks, must not wrap
// around int64 and read as room.
func TestDifferentialAttackShrunkSlidingWindow(t *testing.T) {
	c := testRedis(t)
	clk := newClock()
	d := newDiffRun(t, bothStores(c, clk), clk)
	was := Limit{Name: "tokens", Algorithm: SlidingWindow, Rate: 1_000_000_000, Period: 24 * time.Hour}
	now := Limit{Name: "tokens", Algorithm: SlidingWindow, Rate: 1, Period: 24 * time.Hour}
	clk.Set(start.Add(time.Hour))
	if res, err := d.debit("spent", []Item{{Limit: was, Key: "{acme}", Cost: 500_000_000}}); err != nil || !res.Allowed {
		t.Fatalf("debit: %+v %v", res, err)
	}
	// Through the next day the previous day's 5×10^8 tokens weigh more
	// than the limit's one token, but in its last 173 µs.
	for h := range 24 {
		clk.Set(start.Add(24*time.Hour + time.Duration(h)*time.Hour + 17*time.Minute))
		for _, s := range d.stores {
			res, err := s.Peek(d.ctx, []Item{{Limit: now, Key: "{acme}", Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if is := res.Items[0]; is.Allowed || is.Remaining != 0 {
				t.Errorf("%s at day 1 %02d:17, after 5×10^8 tokens the day before: %+v, want denied with nothing remaining", s.name, h, is)
			}
		}
	}
}

// TestDifferentialAttackReloadKeepsState checks what the package documents
// of a limit whose period grows on a reload (10 in 100ms to 10 an hour):
// the state counted before the reload counts under the new period at
// least until the old limit would have refilled it or ended its window
// (a tenant who spent the limit just before the reload is denied then),
// and once the store may have dropped the key on the old period's expiry
// (Redis's TTL, Memory's sweep) the limit still admits at most its
// capacity.
func TestDifferentialAttackReloadKeepsState(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, a := range []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindow} {
		t.Run(a.String(), func(t *testing.T) {
			was := Limit{Name: "l", Algorithm: a, Rate: 10, Period: 100 * time.Millisecond}
			now := was
			now.Period = time.Hour
			spent := []Item{{Limit: was, Key: "{acme}", Cost: 10}}
			again := []Item{{Limit: now, Key: "{acme}", Cost: 10}}
			more := []Item{{Limit: now, Key: "{acme}", Cost: 1}}
			// atMostCapacity checks that, whatever s kept, it admits no
			// more than the capacity: 10, then not one more.
			atMostCapacity := func(s Store, name string) {
				t.Helper()
				res, err := s.Debit(ctx, "again-late", again)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !res.Allowed {
					return
				}
				if res, err := s.Debit(ctx, "more", more); err != nil || res.Allowed {
					t.Errorf("%s: 1 more after 10 admitted on 10 an hour: %+v %v, want denied", name, res, err)
				}
			}

			// Redis, on its own clock, whose TTLs no test clock moves: the
			// key is written with the old period's TTL, and expires.
			r := newRedisStore(c, nil)
			t0 := time.Now()
			res, err := r.Debit(ctx, "spent", spent)
			if err != nil || !res.Allowed {
				t.Fatalf("redis debit: %+v %v", res, err)
			}
			life := res.Items[0].ResetAfter // until the old limit is full again
			res, err = r.Debit(ctx, "again", again)
			if err != nil {
				t.Fatalf("redis: %v", err)
			}
			if time.Since(t0) < life && res.Allowed {
				t.Errorf("redis: 10 more within %s of spending 10, on 10 an hour: %+v, want denied", life, res)
			}
			time.Sleep(500 * time.Millisecond)
			atMostCapacity(r, "redis")

			// Memory: a microsecond before the old limit is full again,
			// after a sweep of the key's shard, then 90s later, after
			// another.
			clk := newClock()
			m := NewMemory(MemoryConfig{Now: clk.Now})
			res, err = m.Debit(ctx, "spent", spent)
			if err != nil || !res.Allowed {
				t.Fatalf("memory debit: %+v %v", res, err)
			}
			life = res.Items[0].ResetAfter
			clk.Advance(life - time.Microsecond)
			sweepShardOf(t, m, memKey{name: was.Name, algo: a, key: "{acme}"})
			if res, err := m.Debit(ctx, "again", again); err != nil || res.Allowed {
				t.Errorf("memory: 10 more %s after spending 10, on 10 an hour: %+v %v, want denied", life-time.Microsecond, res, err)
			}
			clk.Advance(90 * time.Second)
			sweepShardOf(t, m, memKey{name: was.Name, algo: a, key: "{acme}"})
			atMostCapacity(m, "memory")
		})
	}
}

// sweepShardOf writes to another key of k's shard until the shard sweeps.
func sweepShardOf(t *testing.T, m *Memory, k memKey) {
	t.Helper()
	shard := maphash.Comparable(m.seed, k) % numShards
	other := Limit{Name: "other", Rate: 1 << 40, Period: time.Second}
	for i := 0; ; i++ {
		key := "other-" + strconv.Itoa(i)
		if maphash.Comparable(m.seed, memKey{name: other.Name, algo: other.Algorithm, key: key})%numShards != shard {
			continue
		}
		for range sweepEvery {
			if _, err := m.Debit(context.Background(), "w", []Item{{Limit: other, Key: key, Cost: 1}}); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
}

// TestDifferentialAttackMeterRefillOverflow checks a token bucket or GCRA
// that refills far slower than it can be spent: a prepaid credit of
// 10^11 units (say $100 in nano-dollars) that gives back one unit every
// 400 days. Either Validate refuses it, or spending part of it is an
// ordinary decision on both stores: admitted, with a positive ResetAfter,
// the rest remaining and kept (not dropped by the key's expiry), and no
// store error, which a caller counts against the store (and, failing
// open, admits anything).
func TestDifferentialAttackMeterRefillOverflow(t *testing.T) {
	c := testRedis(t)
	for _, a := range []Algorithm{TokenBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			credit := Limit{Name: "credit", Algorithm: a, Rate: 1, Period: MaxPeriod, Burst: 100_000_000_000}
			if err := credit.Validate(); err != nil {
				return // refused up front: no store has to meet it
			}
			clk := newClock()
			d := newDiffRun(t, bothStores(c, clk), clk)
			for _, s := range d.stores {
				for i, cost := range []int64{1000, 1_000_000, 1_000_000_000} {
					res, err := s.Debit(d.ctx, "spend-"+strconv.Itoa(i), []Item{{Limit: credit, Key: "{acme}", Cost: cost}})
					if err != nil || !res.Allowed {
						t.Errorf("%s: spending %d of the credit: %+v %v, want admitted", s.name, cost, res, err)
						continue
					}
					if is := res.Items[0]; is.ResetAfter <= 0 {
						t.Errorf("%s: spending %d of the credit: ResetAfter %s, want positive", s.name, cost, is.ResetAfter)
					}
				}
			}
			m := d.stores[0].Store.(*Memory)
			clk.Advance(90 * time.Second)
			sweepShardOf(t, m, memKey{name: credit.Name, algo: a, key: "{acme}"})
			res, err := m.Peek(d.ctx, []Item{{Limit: credit, Key: "{acme}"}})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := res.Items[0].Remaining, int64(100_000_000_000-1_001_001_000); got != want {
				t.Errorf("memory: 90s after spending 1001001000 of the credit, %d remain, want %d", got, want)
			}
		})
	}
}

// TestDifferentialAttackMeterRefillSlowest checks the slowest token bucket
// and GCRA that Validate accepts, one unit per MaxPeriod with a burst of
// 32 (64 periods, 70 years, to repay two capacities of debt), and that
// one slower is refused: spending it and charging a settlement two
// capacities beyond empty are ordinary decisions on both stores, which
// agree on every time, the longest a positive ResetAfter of 64 periods.
func TestDifferentialAttackMeterRefillSlowest(t *testing.T) {
	c := testRedis(t)
	for _, a := range []Algorithm{TokenBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			slow := Limit{Name: "slow", Algorithm: a, Rate: 1, Period: MaxPeriod, Burst: 32}
			if err := slow.Validate(); err != nil {
				t.Fatalf("burst 32 of 1 per %s: %v, want valid", MaxPeriod, err)
			}
			slower := slow
			slower.Burst = 33
			if err := slower.Validate(); err == nil {
				t.Fatalf("burst 33 of 1 per %s: valid, want refused", MaxPeriod)
			}
			clk := newClock()
			d := newDiffRun(t, bothStores(c, clk), clk)
			item := []Item{{Limit: slow, Key: "{acme}", Cost: 32}}
			if res, err := d.debit("all", item); err != nil || !res.Allowed || res.ResetAfter != 32*MaxPeriod {
				t.Fatalf("spending the burst: %+v %v, want admitted, full again in 32 periods", res, err)
			}
			if err := d.end("all", item, []int64{math.MaxInt64}); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			res, err := d.peek([]Item{{Limit: slow, Key: "{acme}", Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if is := res.Items[0]; is.Allowed || is.ResetAfter != 64*MaxPeriod-time.Second || is.RetryAfter != 33*MaxPeriod-time.Second {
				t.Errorf("a second after two capacities of debt: %+v, want denied, retry after 33 periods, reset after 64", is)
			}
		})
	}
}

// TestDifferentialAttackDeniedRemaining checks what Store documents of a
// denied Debit: it changes nothing, and each item's Remaining is the
// state before it, on every store, the items that fit as well as the one
// that does not.
func TestDifferentialAttackDeniedRemaining(t *testing.T) {
	c := testRedis(t)
	clk := newClock()
	stores := bothStores(c, clk)
	sh := NewRedis(c, patient(RedisConfig{Prefix: "t" + strconv.FormatInt(prefixSeq.Add(1), 10) + ":", Sharded: true}))
	sh.now = clk.Now
	stores = append(stores, namedStore{"redis-sharded", sh})
	ten := Limit{Name: "ten", Algorithm: TokenBucket, Rate: 10, Period: time.Second}
	one := Limit{Name: "one", Algorithm: FixedWindow, Rate: 1, Period: time.Second}
	for _, s := range stores {
		// Before the denied debit: 6 of ten remain, full again in 400ms;
		// one is full.
		for _, it := range []Item{{Limit: ten, Key: "{acme}", Cost: 4}, {Limit: one, Key: "{zeta}", Cost: 1}} {
			if res, err := s.Debit(context.Background(), "before-"+it.Limit.Name, []Item{it}); err != nil || !res.Allowed {
				t.Fatalf("%s: %+v %v", s.name, res, err)
			}
		}
	}
	for _, s := range stores {
		res, err := s.Debit(context.Background(), "denied", []Item{
			{Limit: ten, Key: "{acme}", Cost: 4},
			{Limit: one, Key: "{zeta}", Cost: 1},
		})
		if err != nil || res.Allowed {
			t.Fatalf("%s: %+v %v, want denied", s.name, res, err)
		}
		if got := res.Items[0]; got.Remaining != 6 || got.ResetAfter != 400*time.Millisecond {
			t.Errorf("%s: the item that fits a denied debit reports remaining %d, reset after %s; before the debit it is 6, 400ms", s.name, got.Remaining, got.ResetAfter)
		}
	}
}

// TestDifferentialAttackEdges runs, on both stores side by side, the
// attacks on a limit's arithmetic that must hold on every algorithm:
//   - a cost beyond the capacity (capacity + 1, 2^53, max int64) is a
//     *CostError and changes nothing;
//   - the capacity is admitted once, and not again a microsecond before
//     the limit can hold it again (for a fixed window, the next window);
//   - a settlement's actual cost, however large (2^53 + 1, max int64, or
//     one that wraps reserved + actual), charges at most what the limit
//     holds: the limit reads empty after it, never credited;
//   - a refund gives back at most what was debited: settling or
//     cancelling an id again gives nothing more.
func TestDifferentialAttackEdges(t *testing.T) {
	c := testRedis(t)
	limits := []Limit{
		{Name: "tb", Algorithm: TokenBucket, Rate: 10, Period: time.Second},
		{Name: "gcra", Algorithm: GCRA, Rate: 10, Period: time.Second, Burst: 4},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 10, Period: time.Second},
		{Name: "fw", Algorithm: FixedWindow, Rate: 10, Period: time.Second},
		{Name: "month", Algorithm: FixedWindow, Rate: 10, Calendar: Month},
		{Name: "log", Algorithm: SlidingLog, Rate: 10, Period: time.Second},
		{Name: "conc", Algorithm: Concurrency, Rate: 10, Period: time.Second},
		{Name: "one", Algorithm: TokenBucket, Rate: 1, Period: time.Second},
		{Name: "huge", Algorithm: GCRA, Rate: 1 << 50, Period: time.Microsecond},
	}
	// A microsecond before a whole second, and before a month's end.
	edge := time.Date(2027, 1, 31, 23, 59, 59, 999_999_000, time.UTC)
	for _, l := range limits {
		t.Run(l.Name, func(t *testing.T) {
			clk := newClock()
			clk.Set(edge.Add(-time.Second))
			d := newDiffRun(t, bothStores(c, clk), clk)
			cap := l.Capacity()
			item := func(cost int64) []Item { return []Item{{Limit: l, Key: "{acme}", Cost: cost}} }
			remaining := func() int64 {
				t.Helper()
				res, err := d.peek(item(0))
				if err != nil {
					t.Fatal(err)
				}
				return res.Items[0].Remaining
			}

			for _, cost := range []int64{cap + 1, 1 << 53, math.MaxInt64} {
				if _, err := d.debit("big", item(cost)); !errors.Is(err, ErrCostExceedsCapacity) {
					t.Fatalf("cost %d: %v, want a *CostError", cost, err)
				}
			}
			if got := remaining(); got != cap {
				t.Fatalf("after refused costs %d remain, want %d", got, cap)
			}

			// The capacity once, then nothing more until the limit can
			// hold it again.
			if res, err := d.debit("all", item(cap)); err != nil || !res.Allowed {
				t.Fatalf("the capacity: %+v %v", res, err)
			}
			if res, err := d.debit("again", item(cap)); err != nil || res.Allowed {
				t.Fatalf("the capacity twice: %+v %v", res, err)
			}
			if l.Algorithm != FixedWindow {
				refill := l.Period // until the entry leaves the window, or the lease ends
				if l.Algorithm == GCRA || l.Algorithm == TokenBucket {
					refill = time.Duration(cap) * l.Period / time.Duration(l.Rate)
				}
				clk.Advance(refill - time.Microsecond)
				if res, err := d.debit("again", item(cap)); err != nil || res.Allowed {
					t.Fatalf("the capacity again a microsecond early: %+v %v", res, err)
				}
			}
			if err := d.end("all", item(cap), nil); err != nil {
				t.Fatal(err)
			}

			// A settlement charges at most what the limit holds.
			for i, actual := range []int64{1<<53 + 1, math.MaxInt64 - 1, math.MaxInt64} {
				id := "charge-" + strconv.Itoa(i)
				clk.Set(edge.AddDate(0, i+1, 1)) // a fresh limit
				if res, err := d.debit(id, item(1)); err != nil || !res.Allowed {
					t.Fatalf("%s: %+v %v", id, res, err)
				}
				if err := d.end(id, item(1), []int64{actual}); err != nil {
					t.Fatal(err)
				}
				if l.Algorithm == Concurrency {
					continue // released whatever the actual cost
				}
				if got := remaining(); got != 0 {
					t.Fatalf("%s settled at %d: %d remain, want 0", id, actual, got)
				}
				if res, err := d.debit(id+"-next", item(1)); err != nil || res.Allowed {
					t.Fatalf("a unit after %s settled at %d: %+v %v, want denied", id, actual, res, err)
				}
				if err := d.end(id, item(1), []int64{0}); err != nil {
					t.Fatal(err)
				}
				if got := remaining(); got != 0 {
					t.Fatalf("%s settled again at 0: %d remain, want 0 (a settled id refunds nothing)", id, got)
				}
			}

			// A refund gives back at most what was debited.
			clk.Set(edge.AddDate(0, 5, 1))
			if cap < 3 {
				return
			}
			part := cap / 3
			for _, id := range []string{"a", "b"} {
				if res, err := d.debit(id, item(part)); err != nil || !res.Allowed {
					t.Fatalf("%s: %+v %v", id, res, err)
				}
			}
			want := cap - part
			for _, actual := range [][]int64{{0}, {0}, nil, {0}} {
				if err := d.end("a", item(part), actual); err != nil {
					t.Fatal(err)
				}
				if got := remaining(); got != want {
					t.Fatalf("a refunded (again): %d remain, want %d", got, want)
				}
			}
		})
	}
}
