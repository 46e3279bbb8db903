package weighted

import (
	"cmp"
	"math"
	"slices"
	"strconv"
)

// state is what a store keeps for one key. The zero value is an empty key:
// a full limit with nothing debited. Each algorithm uses its own fields:
//
//   - TokenBucket and GCRA: ts, d and p. d is the debt in units × ticks: the
//     limit holds cap - d/p units at time ts (µs). p is the ticks per period
//     d was scaled with, so that a changed Period rescales the debt instead
//     of misreading it.
//   - FixedWindow and SlidingWindow: w, the index of the window counted in
//     (Unix time / wp), the counts of the windows w - 1 and w, and wp, the
//     Period (µs) w was counted with. A window written under another period
//     is carried over (see carry) instead of misread.
//   - FixedWindow on calendar months: w, the month's index (see month.go),
//     curr, and wp = -1.
//   - SlidingLog: marks, one per admitted debit (ts = when, µs).
//   - Concurrency: marks, one per holder (ts = lease expiry, µs).
//
// The Redis scripts keep the same numbers as little-endian doubles in one
// string value: a meter as ts, d, p, a fixed window as w, wp, curr (its
// previous count is always 0), a sliding window as w, prev, curr, each
// then the key's expiry, and a sliding window then wp (see lib.lua, which
// also reads the windows written before wp was kept); marks as a sorted
// set scored by ts whose members are "cost:id".
type state struct {
	ts, d, p          int64
	w, prev, curr, wp int64
	marks             marks
}

type mark struct {
	ts, cost int64
	id       string
}

// markKey is a mark's member, "cost:id" to Redis.
type markKey struct {
	cost int64
	id   string
}

// marks is a sliding log's or a concurrency limit's sorted set: its marks
// sorted by ts, then by member as Redis sorts them, with the sum of their
// costs and the ts of each member, as Redis keeps the set's "" member and
// finds a member by its hash. A call then costs what it changes, not the
// log's length, where reading every mark for the sum, and every mark
// again to find a member, a debit of one tenant's log of 100,000 marks
// held its shard's lock, which other tenants' keys share, 0.7 ms, and
// building such a log took time quadratic in its length
// (TestMarksAtkLongLogMemoryCost).
type marks struct {
	s   []mark
	sum int64
	at  map[markKey]int64 // each member's ts
}

func (ms *marks) len() int { return len(ms.s) }

// newest is the ts of the newest mark, 0 when there is none.
func (ms *marks) newest() int64 {
	if len(ms.s) == 0 {
		return 0
	}
	return ms.s[len(ms.s)-1].ts
}

// byTS compares a mark's ts with ts, for a binary search.
func byTS(m mark, ts int64) int { return cmp.Compare(m.ts, ts) }

// index returns the position of the mark with member k, or -1.
func (ms *marks) index(k markKey) int {
	ts, ok := ms.at[k]
	if !ok {
		return -1
	}
	i, _ := slices.BinarySearchFunc(ms.s, ts, byTS)
	for ; i < len(ms.s) && ms.s[i].ts == ts; i++ {
		if ms.s[i].cost == k.cost && ms.s[i].id == k.id {
			return i
		}
	}
	return -1 // not reached: at and s hold the same members
}

// find returns the mark with member "cost:id".
func (ms *marks) find(cost int64, id string) (mark, bool) {
	if i := ms.index(markKey{cost, id}); i >= 0 {
		return ms.s[i], true
	}
	return mark{}, false
}

// add adds a mark as Redis's ZADD adds member "cost:id" with score ts: an
// existing member moves to the new score.
func (ms *marks) add(m mark) {
	ms.remove(m.cost, m.id)
	i := len(ms.s) // most marks are the newest
	if i > 0 && markLess(m, ms.s[i-1]) {
		i, _ = slices.BinarySearchFunc(ms.s, m, func(a, b mark) int {
			if markLess(a, b) {
				return -1
			}
			return 1
		})
	}
	ms.s = slices.Insert(ms.s, i, m)
	ms.sum += m.cost
	if ms.at == nil {
		ms.at = make(map[markKey]int64)
	}
	ms.at[markKey{m.cost, m.id}] = m.ts
}

// remove drops the mark with member "cost:id" and reports whether there was
// one.
func (ms *marks) remove(cost int64, id string) (mark, bool) {
	i := ms.index(markKey{cost, id})
	if i < 0 {
		return mark{}, false
	}
	m := ms.s[i]
	ms.s = slices.Delete(ms.s, i, i+1)
	ms.sum -= m.cost
	delete(ms.at, markKey{cost, id})
	return m, true
}

// upTo is how many of the oldest marks have ts <= lo.
func (ms *marks) upTo(lo int64) int {
	i, _ := slices.BinarySearchFunc(ms.s, lo+1, byTS)
	return i
}

// dropOldest drops the k oldest marks.
func (ms *marks) dropOldest(k int) {
	for _, m := range ms.s[:k] {
		ms.sum -= m.cost
		delete(ms.at, markKey{m.cost, m.id})
	}
	// Sliced past, not copied down: an append reuses the space, or moves
	// the marks down when it needs more.
	clear(ms.s[:k])
	ms.s = ms.s[k:]
	if len(ms.s) == 0 {
		ms.s, ms.at = nil, nil
	}
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// The algorithms, as methods of a spec on a state. Each evaluate method
// leaves the state alone (but for the marks of a sliding log or a
// concurrency limit that stopped counting, which it drops) and returns the item's state for
// cost at now; when after is set and the cost fits, Remaining and ResetAfter
// describe the state after the debit. Each debit and settle method changes
// the state and returns how long, in µs from now, until the state is empty
// again (0: it is empty now, and the key can go).

// evaluate dispatches on the algorithm.
func (s *spec) evaluate(st *state, now, cost int64, after bool) ItemState {
	switch s.algo {
	case TokenBucket, GCRA:
		return s.evaluateMeter(st, now, cost, after)
	case FixedWindow:
		return s.evaluateFixed(st, now, cost, after)
	case SlidingWindow:
		return s.evaluateSliding(st, now, cost, after)
	case SlidingLog:
		return s.evaluateMarks(st, now-s.period, now, now, cost, after)
	default: // Concurrency
		return s.evaluateMarks(st, now, now+s.period, now, cost, after)
	}
}

// debit applies an admitted cost.
func (s *spec) debit(st *state, now, cost int64, id string) int64 {
	switch s.algo {
	case TokenBucket, GCRA:
		return s.debitMeter(st, now, cost)
	case FixedWindow, SlidingWindow:
		if s.cal != NoCalendar {
			return s.debitMonth(st, now, cost)
		}
		return s.debitWindow(st, now, cost)
	case SlidingLog:
		return s.debitMarks(st, now-s.period, now, now, cost, id)
	default:
		return s.debitMarks(st, now, now+s.period, now, cost, id)
	}
}

// settle replaces a reservation's reserved cost by its actual cost, clamped
// so that the state stays between full and empty, or for a meter one
// capacity of debt beyond empty (see maxDebt). rec is when the
// reservation was debited (µs), or -1 when that is not known; window
// algorithms refund only into the window that was debited.
func (s *spec) settle(st *state, now, reserved, actual, rec int64, id string) int64 {
	delta := min(max(actual-reserved, -s.cap), s.cap)
	switch s.algo {
	case TokenBucket, GCRA:
		return s.settleMeter(st, now, min(max(actual-reserved, -2*s.cap), 2*s.cap))
	case FixedWindow, SlidingWindow:
		if s.cal != NoCalendar {
			return s.settleMonth(st, now, delta, rec)
		}
		return s.settleWindow(st, now, delta, rec)
	case SlidingLog:
		return s.settleLog(st, now, reserved, delta, id)
	default:
		return s.release(st, reserved, id)
	}
}

// hasRecord reports whether a debit of the algorithm records its time for a
// later settlement.
func (s *spec) hasRecord() bool { return s.algo == FixedWindow || s.algo == SlidingWindow }

// recordTTL is how long, in µs from now, a debit's time matters to a
// settlement of a window algorithm: until the debited window stops counting.
func (s *spec) recordTTL(now int64) int64 {
	if s.cal != NoCalendar {
		return monthStart(monthIndex(now)+1) - now
	}
	start := now / s.period * s.period
	if s.algo == SlidingWindow {
		return start + 2*s.period - now
	}
	return start + s.period - now
}

// meterAt returns the meter's time and debt at now, after refill. The
// debt is at most maxDebt: a charge beyond empty is owed (see settleMeter).
func (s *spec) meterAt(st *state, now int64) (ts, d int64) {
	if st.d == 0 {
		return now, 0
	}
	ts, d = st.ts, st.d
	most := s.maxDebt()
	if st.p != s.p {
		if f := math.Ceil(float64(d) * float64(s.p) / float64(st.p)); f >= float64(most) {
			d = most
		} else {
			d = int64(f)
		}
	}
	d = min(d, most)
	if now > ts {
		if e := (now - ts) / s.tick; e > 0 {
			if e >= ceilDiv(d, s.rate) {
				return now, 0
			}
			d -= e * s.rate
			ts += e * s.tick
		}
	}
	return ts, d
}

// meterReset is how long until debt d, held at ts, has refilled.
func (s *spec) meterReset(ts, d, now int64) int64 {
	if d == 0 {
		return 0
	}
	return ts + ceilDiv(d, s.rate)*s.tick - now
}

func (s *spec) evaluateMeter(st *state, now, cost int64, after bool) ItemState {
	ts, d := s.meterAt(st, now)
	full := s.cap * s.p
	is := ItemState{Capacity: s.cap}
	if d+cost*s.p <= full {
		is.Allowed = true
		if after {
			d += cost * s.p
		}
	} else {
		is.RetryAfter = micros(ts + ceilDiv(d-(s.cap-cost)*s.p, s.rate)*s.tick - now)
	}
	is.Remaining = max(full-d, 0) / s.p
	is.ResetAfter = micros(s.meterReset(ts, d, now))
	return is
}

func (s *spec) debitMeter(st *state, now, cost int64) int64 {
	ts, d := s.meterAt(st, now)
	st.ts, st.d, st.p = ts, d+cost*s.p, s.p
	return s.meterReset(st.ts, st.d, now)
}

// maxDebt is the most a meter's debt can be: two capacities. A debit fits
// while the debt stays at most one capacity; a settlement may charge
// beyond it, up to one more, which later debits wait out, so that a cost
// reserved low and settled high (a stream's output, Envoy's second phase)
// is paid for at the limit's rate, not forgiven once the meter is empty.
func (s *spec) maxDebt() int64 { return 2 * s.cap * s.p }

func (s *spec) settleMeter(st *state, now, delta int64) int64 {
	ts, d := s.meterAt(st, now)
	d = min(max(d+delta*s.p, 0), s.maxDebt())
	st.ts, st.d, st.p = ts, d, s.p
	return s.meterReset(ts, d, now)
}

// windowAt returns the current window's index, the previous and current
// counts, and the window's start (µs). A clock behind the state's window
// keeps counting in the state's window.
func (s *spec) windowAt(st *state, now int64) (w, prev, curr, start int64) {
	sw, sprev, scurr := st.w, st.prev, st.curr
	if st.wp != s.period && sprev+scurr > 0 {
		sw, sprev, scurr = s.carry(st)
	}
	w = now / s.period
	if sw > w && scurr+sprev > 0 {
		w = sw
	}
	switch sw {
	case w:
		prev, curr = sprev, scurr
	case w - 1:
		prev = scurr
	}
	return w, prev, curr, w * s.period
}

// carry returns the window index and counts of a window state written
// with another period, st.wp, in windows of the current one. Window w of
// st.wp, which starts at S = w × st.wp, is read as the latest window of
// the current period that ends no later than S + L, L being the longer of
// the two periods: the window of the current period that holds S when the
// period grew, the last one that ends within window w when it shrank.
// Its count therefore counts for no longer than L after S (a sliding
// window's count then weighs as the previous window's for one period
// more), and while it counts the debits go into the same window, so that
// the window never holds more than the capacity. The count of window
// w - 1 is read the same way: added to the count when it falls in the same
// window, kept as the previous window's when it falls just before,
// forgotten when earlier. An unchanged period maps every window to itself.
func (s *spec) carry(st *state) (w, prev, curr int64) {
	longer := max(s.period, st.wp)
	start := st.w * st.wp
	w = (start+longer)/s.period - 1
	switch (start-st.wp+longer)/s.period - 1 {
	case w:
		return w, 0, st.prev + st.curr
	case w - 1:
		return w, st.prev, st.curr
	}
	return w, 0, st.curr
}

// windowReset is how long until the counts stop counting.
func (s *spec) windowReset(prev, curr, start, now int64) int64 {
	switch {
	case s.algo == FixedWindow && curr > 0:
		return start + s.period - now
	case s.algo == FixedWindow:
		return 0
	case curr > 0:
		return start + 2*s.period - now
	case prev > 0:
		return start + s.period - now
	}
	return 0
}

// evaluateFixed evaluates a fixed window, of a period or of calendar months:
// its count stops counting at the end of the window counted in.
func (s *spec) evaluateFixed(st *state, now, cost int64, after bool) ItemState {
	var curr, end int64
	if s.cal != NoCalendar {
		_, curr, _, end = monthAt(st, now)
	} else {
		var start int64
		_, _, curr, start = s.windowAt(st, now)
		end = start + s.period
	}
	is := ItemState{Capacity: s.cap}
	if curr+cost <= s.cap {
		is.Allowed = true
		if after {
			curr += cost
		}
	} else {
		is.RetryAfter = micros(end - now)
	}
	is.Remaining = s.cap - curr
	if curr > 0 {
		is.ResetAfter = micros(end - now)
	}
	return is
}

// slidingUsed is the weighted count, in units × ticks, at elapsed ticks e
// (0 ≤ e < p). A count carried from a larger capacity (a reload that
// lowered the rate) can exceed this one's by far: when either term would
// pass maxScaled, which is at least the limit's full cap × p, it returns
// 2 × maxScaled, beyond full, instead of a product that wraps int64. The
// scripts compute the same terms in doubles, which may round but stay
// beyond full too.
func (s *spec) slidingUsed(prev, curr, e int64) int64 {
	w := s.p - e
	if curr > maxScaled/s.p || (prev > 0 && w > 0 && prev > maxScaled/w) {
		return 2 * maxScaled
	}
	return curr*s.p + prev*w
}

func (s *spec) evaluateSliding(st *state, now, cost int64, after bool) ItemState {
	_, prev, curr, start := s.windowAt(st, now)
	e := max(now-start, 0) / s.tick
	full := s.cap * s.p
	used := s.slidingUsed(prev, curr, e)
	is := ItemState{Capacity: s.cap}
	if curr+cost <= s.cap && used+cost*s.p <= full {
		is.Allowed = true
		if after {
			curr += cost
			used += cost * s.p
		}
	} else {
		var target int64
		if curr+cost <= s.cap {
			// The previous window's weight must decay: at elapsed ticks e',
			// prev × (p - e') ≤ (cap - curr - cost) × p.
			target = start + (s.p-(s.cap-curr-cost)*s.p/prev)*s.tick
		} else {
			// Wait for the next window, where curr becomes the previous.
			target = start + s.period + (s.p-(s.cap-cost)*s.p/curr)*s.tick
		}
		is.RetryAfter = micros(target - now)
	}
	is.Remaining = max(full-used, 0) / s.p
	is.ResetAfter = micros(s.windowReset(prev, curr, start, now))
	return is
}

func (s *spec) debitWindow(st *state, now, cost int64) int64 {
	w, prev, curr, start := s.windowAt(st, now)
	if s.algo == FixedWindow {
		prev = 0
	}
	st.w, st.prev, st.curr, st.wp = w, prev, curr+cost, s.period
	return s.windowReset(prev, st.curr, start, now)
}

func (s *spec) settleWindow(st *state, now, delta, rec int64) int64 {
	w, prev, curr, start := s.windowAt(st, now)
	if s.algo == FixedWindow {
		prev = 0
	}
	switch {
	case delta > 0 && s.algo == SlidingWindow:
		// Up to full: the weighted count stays at most the capacity.
		e := max(now-start, 0) / s.tick
		room := max(s.cap*s.p-s.slidingUsed(prev, curr, e), 0) / s.p
		curr += min(delta, room)
	case delta > 0:
		curr = min(curr+delta, s.cap)
	case delta < 0 && rec >= 0 && rec/s.period == w:
		curr = max(curr+delta, 0)
	case delta < 0 && rec >= 0 && rec/s.period == w-1 && s.algo == SlidingWindow:
		prev = max(prev+delta, 0)
	}
	st.w, st.prev, st.curr, st.wp = w, prev, curr, s.period
	return s.windowReset(prev, curr, start, now)
}

// Marks: a sliding log counts the marks with ts > lo (lo = now - period),
// and a debit adds a mark at now; a concurrency limit counts the marks with
// ts > now (unexpired leases), and a debit adds a mark expiring at
// now + period. hi is the new mark's ts.

func (s *spec) evaluateMarks(st *state, lo, hi, now, cost int64, after bool) ItemState {
	// Marks that stopped counting are dropped by every call that reads
	// them, maxTrim at most, as lib.lua's marks_sum drops them: Redis then
	// reads each once, not again on every denial after. Those left over
	// (behind) still count until a later call drops them.
	behind := s.trim(st, lo)
	sum, newest := st.marks.sum, st.marks.newest()
	is := ItemState{Capacity: s.cap}
	switch {
	case sum+cost <= s.cap:
		is.Allowed = true
		if after && cost > 0 {
			sum += cost
			newest = max(newest, hi)
		}
	case behind:
		// The next calls drop what stopped counting: come again at once.
		is.RetryAfter = micros(1)
	default:
		// Until the oldest marks whose costs add up to need stop counting,
		// among the oldest maxRetryWalk; past them, until the last of
		// those does, as lib.lua's marks tells it.
		need, acc, walked := sum+cost-s.cap, int64(0), 0
		for _, m := range st.marks.s {
			acc += m.cost
			if walked++; acc >= need || walked == maxRetryWalk {
				is.RetryAfter = micros(m.ts + s.marksLag() - now)
				break
			}
		}
	}
	is.Remaining = s.cap - sum
	if sum > 0 {
		// At least 1 µs: behind, every mark left may have stopped counting.
		is.ResetAfter = micros(max(newest+s.marksLag()-now, 1))
	}
	return is
}

// marksLag is how long after its ts a mark stops counting.
func (s *spec) marksLag() int64 {
	if s.algo == SlidingLog {
		return s.period
	}
	return 0
}

// trim drops st's oldest marks with ts <= lo, as many as s.trims has
// left (maxTrim at most), and reports whether it left some (behind).
func (s *spec) trim(st *state, lo int64) (behind bool) {
	n := st.marks.upTo(lo)
	if n == 0 {
		return false
	}
	left := maxTrim
	if s.trims != nil {
		left = *s.trims
	}
	k := min(n, left)
	if s.trims != nil {
		*s.trims -= k
	}
	st.marks.dropOldest(k)
	return n > k
}

// markLess orders marks as a Redis sorted set orders their members: by score,
// then by member bytes.
func markLess(a, b mark) bool {
	if a.ts != b.ts {
		return a.ts < b.ts
	}
	return member(a.cost, a.id) < member(b.cost, b.id)
}

func member(cost int64, id string) string {
	return strconv.FormatInt(cost, 10) + ":" + id
}

// marksTTL is how long until the last mark stops counting.
func (s *spec) marksTTL(st *state, lo, now int64) int64 {
	newest := st.marks.newest()
	if newest <= lo {
		return 0 // no mark counts
	}
	return newest + s.marksLag() - now
}

// debitMarks follows evaluateMarks, which trimmed st, in the same call.
func (s *spec) debitMarks(st *state, lo, hi, now, cost int64, id string) int64 {
	if cost > 0 {
		st.marks.add(mark{ts: hi, cost: cost, id: id})
	}
	return s.marksTTL(st, lo, now)
}

func (s *spec) settleLog(st *state, now, reserved, delta int64, id string) int64 {
	lo := now - s.period
	behind := s.trim(st, lo)
	sum := st.marks.sum
	// Behind, sum holds marks that stopped counting: the charge is not
	// bounded by it, as lib.lua's adjust charges it.
	m, ok := st.marks.remove(reserved, id)
	if ok && m.ts <= lo {
		sum, ok = sum-m.cost, false // stopped counting, not dropped yet
	}
	if ok {
		c := max(m.cost+delta, 0)
		if !behind {
			c = min(c, m.cost+s.cap-sum)
		}
		if c > 0 {
			st.marks.add(mark{ts: m.ts, cost: c, id: id})
		}
	} else {
		c := delta
		if !behind {
			c = min(c, s.cap-sum)
		}
		if c > 0 {
			st.marks.add(mark{ts: now, cost: c, id: id})
		}
	}
	return s.marksTTL(st, lo, now)
}

// restoreLog raises a sliding log's sum to counted by the mark of a
// restore: what it lacks, at now, which stops counting a Period later, as
// restore.lua does; behind (see trim), the whole of counted, which may
// refuse early, never late. It reports the state's TTL and whether it
// wrote a mark. A restore knows only how much was spent in the window
// (now - period, now], not when: marks written at now stop counting no
// sooner than the spend they stand for, so the log may refuse early after
// a restore, never late. It writes one mark, under id "restore-<now>"
// (with ".2", ".3" ... when a mark of that member is there already, as
// restore.lua does), so a restore adds at most one mark per counter.
func (s *spec) restoreLog(st *state, now, counted int64) (int64, bool) {
	lo := now - s.period
	behind := s.trim(st, lo)
	delta := counted
	if !behind {
		delta -= st.marks.sum
	}
	if delta <= 0 {
		return 0, false
	}
	id := restoreMarkID(now, func(id string) bool {
		_, ok := st.marks.find(delta, id)
		return ok
	})
	st.marks.add(mark{ts: now, cost: delta, id: id})
	return s.marksTTL(st, lo, now), true
}

// restoreMarkID is the id of a restore's mark at now (µs): "restore-<now>",
// or the first of "restore-<now>.2", ".3" ... that taken reports free.
func restoreMarkID(now int64, taken func(string) bool) string {
	base := "restore-" + strconv.FormatInt(now, 10)
	id := base
	for n := 2; taken(id); n++ {
		id = base + "." + strconv.Itoa(n)
	}
	return id
}

// release ends a concurrency reservation. The key's expiry stays as it was,
// as Redis's ZREM leaves a key's TTL.
func (s *spec) release(st *state, reserved int64, id string) int64 {
	st.marks.remove(reserved, id)
	return -1
}

// renew makes the lease of reservation id's concurrency mark of cost
// reserved expire at now + period when it would expire sooner, and
// reports whether it wrote the mark. A mark still held moves. A mark
// expired or gone (its lease lapsed, or the store lost its state) is held
// again, past the capacity if need be: its holder, which renews, still
// runs. It is not when the reservation ended (settled or cancelled): a
// renewal never resurrects an ended reservation.
func (s *spec) renew(st *state, now, reserved int64, id string, ended bool) bool {
	hi := now + s.period
	if m, ok := st.marks.find(reserved, id); ok {
		if m.ts >= hi {
			return false
		}
		if m.ts > now {
			m.ts = hi
			st.marks.add(m)
			return true
		}
	}
	if ended {
		return false
	}
	// As renew.lua, which reads the sum through lib's marks_sum.
	s.trim(st, now)
	st.marks.add(mark{ts: hi, cost: reserved, id: id})
	return true
}

// maxRetryWalk is how many of a sliding log's or a concurrency limit's
// oldest counting marks a denial reads to tell its Retry-After: when
// those free less than it needs, its Retry-After is when the last of them
// frees, sooner than the exact answer (the request is told again then).
// Redis runs one script at a time for every tenant, and a log holds up to
// its capacity in marks: reading the whole of it, a denial of one tenant
// held Redis for every other (145 ms for 20,000 marks;
// TestMarksAtkLongLogDenial).
const maxRetryWalk = 256

// maxTrim is how many sliding log and concurrency limit marks that
// stopped counting one call drops, all its items' keys together (on a
// sharded Redis, each hash tag's): those left over still count until
// later calls drop them, so a log that was behind refuses early, never
// late (a denial then has a RetryAfter of 1 µs). Redis runs one script at
// a time for every tenant: a tenant's log of 300,000 marks that had all
// expired held Redis about a second in the call that dropped them, past
// every other tenant's CallTimeout, so that their requests failed as the
// store's and opened the breaker (TestMarksAtkExpiredLogTrimIsBounded);
// and with a bound per key, one request of 64 such logs (a rate limit
// service request's descriptors) still dropped 64 times as many
// (TestMarksAtkManyLogsOneRequest).
const maxTrim = 1024
