package weighted

import (
	"maps"
	"math/big"
	"slices"
)

// A model is an algorithm written from its definition, as plainly as
// possible: exact rationals instead of scaled integers, and a search instead
// of a formula for RetryAfter and ResetAfter. Times are µs. The stores must
// agree with the models step by step.
//
// Two rules are part of every definition. A clock behind the state's own
// time (the last write, or the window written) is taken to be at the state's
// time, so going backwards neither refills nor reopens a window; and a state
// back to empty forgets its time. A third is the sliding log's and the
// concurrency limit's: every call that reads the key (a debit, a peek)
// forgets the marks that stopped counting by its time, so that a clock
// going back later does not count them again.
type model interface {
	// read is a call reading the key at t.
	read(t int64)
	// admits reports whether cost fits at t. It does not change the model.
	admits(t, cost int64) bool
	// remaining is how many units fit at t.
	remaining(t int64) int64
	// empty reports whether, at t, nothing counts any more.
	empty(t int64) bool
	debit(t, cost int64, id string)
	// settle applies a reservation's actual cost; rec is when it was
	// debited.
	settle(t int64, id string, reserved, actual, rec int64)
}

// search returns the least d in [0, limit] for which ok(t+d) holds, with ok
// monotone, or -1.
func search(t, limit int64, ok func(int64) bool) int64 {
	if !ok(t + limit) {
		return -1
	}
	lo, hi := int64(-1), limit // ok(t+hi) holds, ok(t+lo) does not (or lo = -1)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok(t + mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// modelState returns what a store should report for cost at t.
func modelState(m model, l Limit, t, cost int64, allowed bool) ItemState {
	horizon := 4 * l.Period.Microseconds()
	is := ItemState{Allowed: allowed, Remaining: m.remaining(t), Capacity: l.Capacity()}
	if !allowed {
		is.RetryAfter = micros(search(t, horizon, func(u int64) bool { return m.admits(u, cost) }))
	}
	is.ResetAfter = micros(search(t, horizon, m.empty))
	return is
}

func newModel(l Limit) model {
	s, err := l.spec()
	if err != nil {
		panic(err)
	}
	if s.timed() && s.tick != 1 {
		panic("models count time in µs: use a limit whose tick is 1µs")
	}
	switch l.Algorithm {
	case TokenBucket:
		return &bucketModel{cap: s.cap, rate: big.NewRat(s.rate, s.period), tokens: big.NewRat(s.cap, 1)}
	case GCRA:
		return &gcraModel{burst: s.cap, t: big.NewRat(s.period, s.rate)}
	case FixedWindow, SlidingWindow:
		return &windowModel{sliding: l.Algorithm == SlidingWindow, cap: s.cap, period: s.period}
	case SlidingLog:
		return &logModel{cap: s.cap, period: s.period}
	default:
		return &holdModel{cap: s.cap, lease: s.period}
	}
}

func rat(n int64) *big.Rat { return big.NewRat(n, 1) }

func floorRat(r *big.Rat) int64 {
	q := new(big.Int).Quo(r.Num(), r.Denom()) // truncates; values here are >= 0
	return q.Int64()
}

// bucketModel: tokens refill at rate per µs up to cap; a debit takes cost
// tokens when there are that many.
type bucketModel struct {
	cap    int64
	rate   *big.Rat // tokens per µs
	tokens *big.Rat // at last
	last   int64
}

func (m *bucketModel) at(t int64) *big.Rat {
	tok := new(big.Rat).Set(m.tokens)
	if t > m.last {
		tok.Add(tok, new(big.Rat).Mul(m.rate, rat(t-m.last)))
	}
	if tok.Cmp(rat(m.cap)) > 0 {
		tok.SetInt64(m.cap)
	}
	return tok
}

func (m *bucketModel) read(int64) {}

func (m *bucketModel) admits(t, cost int64) bool { return m.at(t).Cmp(rat(cost)) >= 0 }
func (m *bucketModel) remaining(t int64) int64   { return max(floorRat(m.at(t)), 0) }
func (m *bucketModel) empty(t int64) bool        { return m.at(t).Cmp(rat(m.cap)) == 0 }

func (m *bucketModel) set(t int64, tok *big.Rat) {
	if tok.Cmp(rat(-m.cap)) < 0 {
		tok.SetInt64(-m.cap) // at most one capacity owed
	}
	if tok.Cmp(rat(m.cap)) > 0 {
		tok.SetInt64(m.cap)
	}
	m.tokens, m.last = tok, max(t, m.last)
	if m.empty(t) {
		m.last = t
	}
}

// take removes n tokens (n < 0: adds) at t.
func (m *bucketModel) take(t, n int64) {
	if m.empty(t) {
		m.tokens, m.last = rat(m.cap), t
	}
	m.set(t, new(big.Rat).Sub(m.at(t), rat(n)))
}

func (m *bucketModel) debit(t, cost int64, _ string) { m.take(t, cost) }
func (m *bucketModel) settle(t int64, _ string, reserved, actual, _ int64) {
	m.take(t, actual-reserved)
}

// gcraModel: the theoretical arrival time tat advances by cost emission
// intervals t per debit; a debit is conforming when tat, so advanced, lies at
// most burst intervals after the arrival.
type gcraModel struct {
	burst int64
	t     *big.Rat // emission interval, µs
	tat   *big.Rat
	last  int64
}

// live reports whether the meter holds anything at t: the clock is taken
// to be at least at the last write.
func (m *gcraModel) live(t int64) bool {
	return m.tat != nil && m.tat.Cmp(rat(max(t, m.last))) > 0
}

// arrival is the time the meter sees at t: never before its last write
// while it holds anything.
func (m *gcraModel) arrival(t int64) *big.Rat {
	if m.live(t) {
		return rat(max(t, m.last))
	}
	return rat(t)
}

func (m *gcraModel) tatAt(t int64) *big.Rat {
	if m.live(t) {
		return new(big.Rat).Set(m.tat)
	}
	return rat(t)
}

func (m *gcraModel) read(int64) {}

func (m *gcraModel) admits(t, cost int64) bool {
	n := m.arrival(t)
	next := new(big.Rat).Add(m.tatAt(t), new(big.Rat).Mul(rat(cost), m.t))
	return next.Sub(next, new(big.Rat).Mul(rat(m.burst), m.t)).Cmp(n) <= 0
}

func (m *gcraModel) remaining(t int64) int64 {
	ahead := new(big.Rat).Sub(m.tatAt(t), m.arrival(t))
	free := new(big.Rat).Sub(new(big.Rat).Mul(rat(m.burst), m.t), ahead)
	return max(floorRat(free.Quo(free, m.t)), 0)
}

func (m *gcraModel) empty(t int64) bool { return !m.live(t) }

func (m *gcraModel) move(t, cost int64) {
	n := m.arrival(t)
	tat := m.tatAt(t)
	tat.Add(tat, new(big.Rat).Mul(rat(cost), m.t))
	// A settlement may charge one burst beyond empty (owed).
	if hi := new(big.Rat).Add(n, new(big.Rat).Mul(rat(2*m.burst), m.t)); tat.Cmp(hi) > 0 {
		tat = hi
	}
	if tat.Cmp(n) <= 0 {
		m.tat = nil // empty: the meter forgets its time
		return
	}
	m.tat, m.last = tat, floorRat(n)
}

func (m *gcraModel) debit(t, cost int64, _ string) { m.move(t, cost) }
func (m *gcraModel) settle(t int64, _ string, reserved, actual, _ int64) {
	m.move(t, actual-reserved)
}

// windowModel: counts per window of length period aligned to the epoch; the
// sliding form adds the previous window's count weighted by its overlap with
// the period ending now.
type windowModel struct {
	sliding bool
	cap     int64
	period  int64
	counts  map[int64]int64
	written int64 // window last written
}

func (m *windowModel) window(t int64) int64 {
	w := t / m.period
	if m.written > w && (m.counts[m.written] > 0 || (m.sliding && m.counts[m.written-1] > 0)) {
		return m.written
	}
	return w
}

// usage is the weighted count at t: curr + prev × (period - elapsed)/period.
func (m *windowModel) usage(t int64) (*big.Rat, int64) {
	w := m.window(t)
	curr := m.counts[w]
	if !m.sliding && w < m.written {
		curr = 0 // a fixed window keeps only the window it wrote
	}
	u := rat(curr)
	if m.sliding {
		el := max(t-w*m.period, 0)
		u.Add(u, big.NewRat(m.counts[w-1]*(m.period-el), m.period))
	}
	return u, curr
}

func (m *windowModel) read(int64) {}

func (m *windowModel) admits(t, cost int64) bool {
	u, curr := m.usage(t)
	return curr+cost <= m.cap && u.Add(u, rat(cost)).Cmp(rat(m.cap)) <= 0
}

func (m *windowModel) remaining(t int64) int64 {
	u, _ := m.usage(t)
	free := new(big.Rat).Sub(rat(m.cap), u)
	if free.Sign() < 0 {
		return 0
	}
	return floorRat(free)
}

func (m *windowModel) empty(t int64) bool {
	u, _ := m.usage(t)
	return u.Sign() == 0
}

func (m *windowModel) touch(t int64) int64 {
	if m.counts == nil {
		m.counts = map[int64]int64{}
	}
	w := m.window(t)
	if w < m.written {
		// The clock went back past a state that counts nothing: it is
		// forgotten.
		clear(m.counts)
	}
	if m.written != w {
		// Windows before the previous one no longer count.
		for k := range m.counts {
			if k < w-1 {
				delete(m.counts, k)
			}
		}
	}
	m.written = w
	return w
}

func (m *windowModel) debit(t, cost int64, _ string) {
	w := m.touch(t)
	m.counts[w] += cost
}

func (m *windowModel) settle(t int64, _ string, reserved, actual, rec int64) {
	w := m.touch(t)
	delta := actual - reserved
	switch {
	case delta > 0 && m.sliding:
		room := new(big.Rat).Sub(rat(m.cap), first(m.usage(t)))
		m.counts[w] += min(delta, max(floorRat(room), 0))
	case delta > 0:
		m.counts[w] = min(m.counts[w]+delta, m.cap)
	case rec/m.period == w:
		m.counts[w] = max(m.counts[w]+delta, 0)
	case rec/m.period == w-1 && m.sliding:
		m.counts[w-1] = max(m.counts[w-1]+delta, 0)
	}
}

// logModel: every admitted debit is an entry; the entries of the last period
// count.
type logModel struct {
	cap, period int64
	entries     []mark
}

func (m *logModel) sum(t int64) int64 {
	var s int64
	for _, e := range m.entries {
		if e.ts > t-m.period {
			s += e.cost
		}
	}
	return s
}

func (m *logModel) read(t int64) {
	m.entries = slices.DeleteFunc(m.entries, func(e mark) bool { return e.ts <= t-m.period })
}

func (m *logModel) admits(t, cost int64) bool { return m.sum(t)+cost <= m.cap }
func (m *logModel) remaining(t int64) int64   { return m.cap - m.sum(t) }
func (m *logModel) empty(t int64) bool        { return m.sum(t) == 0 }

func (m *logModel) debit(t, cost int64, id string) {
	// A write keeps only the entries of the period before it.
	m.entries = slices.DeleteFunc(m.entries, func(e mark) bool { return e.ts <= t-m.period })
	m.entries = append(m.entries, mark{ts: t, cost: cost, id: id})
}

func (m *logModel) settle(t int64, id string, reserved, actual, _ int64) {
	m.entries = slices.DeleteFunc(m.entries, func(e mark) bool { return e.ts <= t-m.period })
	sum := m.sum(t)
	delta := actual - reserved
	for i, e := range m.entries {
		if e.id == id && e.cost == reserved {
			m.entries[i].cost = min(max(e.cost+delta, 0), e.cost+m.cap-sum)
			return
		}
	}
	if c := min(delta, m.cap-sum); c > 0 {
		m.entries = append(m.entries, mark{ts: t, cost: c, id: id})
	}
}

// holdModel: every admitted debit holds its cost until released or until
// its lease ends.
type holdModel struct {
	cap, lease int64
	held       map[string]mark // ts is the lease's end
}

func (m *holdModel) sum(t int64) int64 {
	var s int64
	for _, h := range m.held {
		if h.ts > t {
			s += h.cost
		}
	}
	return s
}

func (m *holdModel) read(t int64) {
	maps.DeleteFunc(m.held, func(_ string, h mark) bool { return h.ts <= t })
}

func (m *holdModel) admits(t, cost int64) bool { return m.sum(t)+cost <= m.cap }
func (m *holdModel) remaining(t int64) int64   { return m.cap - m.sum(t) }
func (m *holdModel) empty(t int64) bool        { return m.sum(t) == 0 }

func (m *holdModel) debit(t, cost int64, id string) {
	if m.held == nil {
		m.held = map[string]mark{}
	}
	// A write drops the leases that have ended.
	maps.DeleteFunc(m.held, func(_ string, h mark) bool { return h.ts <= t })
	m.held[id] = mark{ts: t + m.lease, cost: cost}
}

func (m *holdModel) settle(_ int64, id string, reserved, _, _ int64) {
	if h, ok := m.held[id]; ok && h.cost == reserved {
		delete(m.held, id)
	}
}

func first[A, B any](a A, _ B) A { return a }
