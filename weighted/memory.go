package weighted

import (
	"context"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"time"
)

// MemoryConfig configures a Memory store. The zero value is ready to use.
type MemoryConfig struct {
	// Now returns the current time. nil means the system clock, read as
	// the wall time at NewMemory plus the monotonic time elapsed since: it
	// never steps back, and costs one clock read instead of time.Now's two.
	Now func() time.Time
	// SettleTTL is how long a settled or cancelled reservation id is
	// remembered, so that a retried Settle changes nothing. 0 means
	// DefaultSettleTTL.
	SettleTTL time.Duration
	// Generations keeps a generation marker per hash tag, as
	// RedisConfig.Generations does in Redis: a fresh Memory has none, so
	// every Debit and Peek of an item whose key has a hash tag returns a
	// *StaleError until Restore has seeded the tag's counters (for
	// example from a ledger's spend) and written its marker. Memory loses
	// no state while it lives, so its markers only start missing. Off by
	// default.
	Generations bool
}

// Memory is a Store that keeps state in process, for a single node. It is
// sharded by key: a debit locks only the shards of its own keys, in a fixed
// order, so there is no global lock. Every key expires once its limit would
// be full again; a small sweep every few hundred writes to a shard drops the
// keys expired for a minute, and a shard that has doubled since its last
// whole sweep is swept whole, so that keys made faster than the small
// sweeps find them (a reservation's record per request, a counter per new
// value) hold at most about twice what is alive or expired within the
// minute, at an amortized constant cost per key.
//
// Memory is safe for concurrent use. Use NewMemory to make one.
type Memory struct {
	now       func() int64 // µs since the Unix epoch
	settleTTL int64        // µs
	gens      bool         // MemoryConfig.Generations
	seed      maphash.Seed
	shards    [numShards]shard
}

const (
	numShards  = 64
	sweepEvery = 256 // writes to a shard between sweeps
	sweepScan  = 32  // entries a sweep looks at
	sweepGrace = int64(time.Minute / time.Microsecond)
	// sweepFloor is the least size a shard doubles from before a whole
	// sweep.
	sweepFloor = 64
)

type shard struct {
	mu     sync.Mutex
	m      map[memKey]*entry
	writes uint32
	swept  int      // entries left by the last whole sweep
	_      [32]byte // keeps neighbouring shards' locks off one cache line
}

// memKey names one key of one limit, or (algo == recordAlgo) a reservation.
type memKey struct {
	name string
	algo Algorithm
	cal  Calendar // a window on calendar months keeps apart from a period's
	key  string
}

const (
	recordAlgo Algorithm = 255
	markerAlgo Algorithm = 254 // a hash tag's generation marker, in entry.rec
)

type entry struct {
	state
	expires int64 // µs; the entry is empty from then on
	rec     int64 // reservations: when debited (µs), -1 if unknown
	done    bool  // reservations: settled or cancelled
	// leases is a lease index (leaseAlgo): its leases by id.
	leases map[string]leaseRec
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory store.
func NewMemory(cfg MemoryConfig) *Memory {
	m := &Memory{settleTTL: int64(DefaultSettleTTL / time.Microsecond), seed: maphash.MakeSeed(), gens: cfg.Generations}
	if now := cfg.Now; now != nil {
		m.now = func() int64 { return now().UnixMicro() }
	} else {
		base := time.Now()
		baseUS := base.UnixMicro()
		m.now = func() int64 { return baseUS + time.Since(base).Microseconds() }
	}
	if cfg.SettleTTL > 0 {
		m.settleTTL = cfg.SettleTTL.Microseconds()
	}
	for i := range m.shards {
		m.shards[i].m = make(map[memKey]*entry)
	}
	return m
}

// held is the set of keys, and their shards, that one call holds locked.
type held struct {
	now   int64
	keys  []memKey
	idx   []int // shard of each key
	order []int // the shards, sorted, each once: the locking order
}

// heldBufs backs a held for calls of up to four items and a record, on the
// caller's stack.
type heldBufs struct {
	keys       [5]memKey
	idx, order [5]int
}

func (b *heldBufs) held() held {
	return held{keys: b.keys[:], idx: b.idx[:], order: b.order[:]}
}

// lock locks the shards of the items' keys, when withRecord is set of
// reservation id's record, which comes after them in h.keys, then, when
// leased is set, of the lease indexes of the items with a lease policy,
// and of the generation markers of tags, which come last.
func (m *Memory) lock(h *held, items []Item, id string, withRecord, leased bool, tags []string) {
	h.now = m.now()
	n := len(items) + len(tags)
	if withRecord {
		n++
	}
	nl := 0
	if leased {
		for i := range items {
			if items[i].Limit.Lease.On() {
				nl++
			}
		}
	}
	n += nl
	if n <= len(h.keys) {
		h.keys, h.idx, h.order = h.keys[:n], h.idx[:n], h.order[:n]
	} else {
		h.keys, h.idx, h.order = make([]memKey, n), make([]int, n), make([]int, n)
	}
	for i := range items {
		it := &items[i]
		h.keys[i] = memKey{name: it.Limit.Name, algo: it.Limit.Algorithm, cal: it.Limit.Calendar, key: it.Key}
	}
	if withRecord {
		h.keys[len(items)] = memKey{algo: recordAlgo, key: id}
	}
	if nl > 0 {
		j := n - len(tags) - nl
		for i := range items {
			if items[i].Limit.Lease.On() {
				h.keys[j] = leaseKeyOf(&items[i])
				j++
			}
		}
	}
	for j, t := range tags {
		h.keys[n-len(tags)+j] = memKey{algo: markerAlgo, key: t}
	}
	for i := range h.keys {
		s := int(maphash.Comparable(m.seed, h.keys[i]) % numShards)
		h.idx[i], h.order[i] = s, s
	}
	slices.Sort(h.order)
	k := 0
	for _, s := range h.order {
		if k == 0 || h.order[k-1] != s {
			h.order[k] = s
			k++
		}
	}
	h.order = h.order[:k]
	for _, s := range h.order {
		m.shards[s].mu.Lock()
	}
}

func (m *Memory) unlock(h *held) {
	for _, s := range h.order {
		m.shards[s].mu.Unlock()
	}
}

// get returns key i's entry, or nil when it has none. A limit's entry is
// returned even after it expired: its state then reads as empty, as its
// algorithm computes. A reservation's entry is nil once expired.
func (m *Memory) get(h *held, i int) *entry {
	sh := &m.shards[h.idx[i]]
	e := sh.m[h.keys[i]]
	if e != nil && h.keys[i].algo == recordAlgo && e.expires <= h.now {
		delete(sh.m, h.keys[i])
		return nil
	}
	return e
}

// put stores key i's entry e, never nil (callers make a new one), to expire ttl
// µs from now: ttl 0 deletes it and ttl -1 keeps its expiry.
func (m *Memory) put(h *held, i int, e *entry, ttl int64) {
	sh := &m.shards[h.idx[i]]
	k := h.keys[i]
	switch {
	case ttl == 0 || (ttl < 0 && e != nil && e.algoEmpty(k.algo)):
		delete(sh.m, k)
		return
	case ttl > 0:
		e.expires = h.now + ttl
	}
	sh.m[k] = e
	if n := len(sh.m); n > 2*max(sh.swept, sweepFloor) {
		sh.sweepAll(h.now)
	} else if sh.writes++; sh.writes%sweepEvery == 0 {
		sh.sweep(h.now)
	}
}

// sweepAll drops every entry expired for sweepGrace.
func (sh *shard) sweepAll(now int64) {
	for k, e := range sh.m {
		if e.expires+sweepGrace <= now {
			delete(sh.m, k)
		}
	}
	sh.swept = len(sh.m)
}

// sweep looks at up to sweepScan entries, starting where map iteration
// happens to start, and drops those expired for sweepGrace, so that keys
// nobody touches again go. The grace keeps a clock that steps back a little
// from seeing a state that Redis, whose TTLs follow its own clock, would
// still have.
func (sh *shard) sweep(now int64) {
	n := 0
	for k, e := range sh.m {
		if e.expires+sweepGrace <= now {
			delete(sh.m, k)
		}
		if n++; n == sweepScan {
			return
		}
	}
}

// algoEmpty reports whether a concurrency or sliding log entry holds no
// marks.
func (e *entry) algoEmpty(a Algorithm) bool {
	return (a == SlidingLog || a == Concurrency) && e.marks.len() == 0
}

var emptyState state

func stateOf(e *entry) *state {
	if e == nil {
		return &emptyState
	}
	return &e.state
}

// Debit implements Store.
func (m *Memory) Debit(ctx context.Context, id string, items []Item) (Result, error) {
	if id == "" {
		return Result{}, errNoID
	}
	if len(items) == 0 {
		return Result{Allowed: true, Decider: -1}, nil
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return Result{}, err
	}
	return m.debit(id, items, ss, nil)
}

// debit debits items, after applying the lease reports of c and giving
// back the expired leases of the leased items' keys; with c (a Lease), it
// records the lease its one item takes.
func (m *Memory) debit(id string, items []Item, ss []spec, c *LeaseCall) (Result, error) {
	var trims int
	shareTrims(ss, &trims)
	record := false
	for i := range ss {
		record = record || (ss[i].hasRecord() && items[i].Cost > 0)
	}
	var hb heldBufs
	h := hb.held()
	var tags []string
	if m.gens {
		var tbuf [2]string
		tags = itemTags(items, nil, tbuf[:0])
	}
	m.lock(&h, items, id, record, true, tags)
	defer m.unlock(&h)
	if err := m.checkMarkers(&h, items, tags); err != nil {
		return Result{}, err
	}
	first := len(items)
	if record {
		first++
	}
	var prefix string
	if c != nil {
		prefix = c.Prefix
	}
	m.leases(&h, items, ss, first, c, prefix)
	res := Result{Items: make([]ItemState, len(items))}
	allowed := true
	for i := range items {
		res.Items[i] = ss[i].evaluate(stateOf(m.get(&h, i)), h.now, items[i].Cost, true)
		allowed = allowed && res.Items[i].Allowed
	}
	if !allowed {
		// A denied debit debits nothing: the items that fit report their
		// state before the cost.
		for i := range items {
			if res.Items[i].Allowed {
				res.Items[i] = ss[i].evaluate(stateOf(m.get(&h, i)), h.now, items[i].Cost, false)
			}
		}
	}
	if allowed {
		var recTTL int64
		wrote := false
		for i := range items {
			cost := items[i].Cost
			if cost == 0 {
				continue
			}
			wrote = true
			e := m.get(&h, i)
			if e == nil {
				e = new(entry)
			}
			m.put(&h, i, e, ss[i].debit(&e.state, h.now, cost, id))
			if ss[i].hasRecord() {
				recTTL = max(recTTL, ss[i].recordTTL(h.now))
			}
		}
		if record {
			e := m.get(&h, len(items))
			if e == nil {
				e = new(entry)
			}
			e.rec, e.done = h.now, false
			if final(items) {
				recTTL = min(recTTL, FinalRecordTTL.Microseconds())
			}
			m.put(&h, len(items), e, recTTL)
		}
		if wrote {
			for j := range tags {
				m.get(&h, len(h.keys)-len(tags)+j).rec++
			}
		}
		if c != nil && items[0].Cost > 0 {
			m.addLease(&h, first, id, items[0].Cost, c.TTL.Microseconds(), ss[0].period)
		}
	}
	res.decide()
	return res, nil
}

// Settle implements Store.
func (m *Memory) Settle(ctx context.Context, id string, items []Item, actual []int64) error {
	if err := checkSettle(id, items, actual); err != nil {
		return err
	}
	return m.settle(id, items, actual)
}

// Cancel implements Store.
func (m *Memory) Cancel(ctx context.Context, id string, items []Item) error {
	if id == "" {
		return errNoID
	}
	return m.settle(id, items, nil)
}

// settle settles reservation id; nil actual means all zero.
func (m *Memory) settle(id string, items []Item, actual []int64) error {
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return err
	}
	var trims int
	shareTrims(ss, &trims)
	var hb heldBufs
	h := hb.held()
	m.lock(&h, items, id, true, false, nil)
	defer m.unlock(&h)
	r := len(items)
	rec := m.get(&h, r)
	if rec != nil && rec.done {
		return nil
	}
	debited := int64(-1)
	if rec != nil {
		debited = rec.rec
	}
	for i := range items {
		a := actualCost(items, ss, actual, i)
		if a == items[i].Cost && ss[i].algo != Concurrency {
			continue
		}
		e := m.get(&h, i)
		if e == nil {
			if ss[i].algo == Concurrency || a < items[i].Cost {
				continue // nothing held, nothing to refund
			}
			e = new(entry)
		}
		m.put(&h, i, e, ss[i].settle(&e.state, h.now, items[i].Cost, a, debited, id))
	}
	if rec == nil {
		rec = new(entry)
	}
	rec.done = true
	m.put(&h, r, rec, m.settleTTL)
	return nil
}

// Renew implements Store.
func (m *Memory) Renew(ctx context.Context, id string, items []Item) error {
	if id == "" {
		return errNoID
	}
	var ibuf [4]Item
	items = leases(items, ibuf[:0])
	if len(items) == 0 {
		return nil
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return err
	}
	var trims int
	shareTrims(ss, &trims)
	var hb heldBufs
	h := hb.held()
	m.lock(&h, items, id, true, false, nil)
	defer m.unlock(&h)
	rec := m.get(&h, len(items))
	ended := rec != nil && rec.done
	for i := range items {
		e := m.get(&h, i)
		if e == nil {
			if ended {
				continue
			}
			e = new(entry)
		}
		if ss[i].renew(&e.state, h.now, items[i].Cost, id, ended) {
			m.put(&h, i, e, max(e.expires, h.now+ss[i].period)-h.now)
		}
	}
	return nil
}

// Peek implements Store.
func (m *Memory) Peek(ctx context.Context, items []Item) (Result, error) {
	if len(items) == 0 {
		return Result{Allowed: true, Decider: -1}, nil
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return Result{}, err
	}
	var trims int
	shareTrims(ss, &trims)
	var hb heldBufs
	h := hb.held()
	var tags []string
	if m.gens {
		tags = itemTags(items, nil, nil)
	}
	m.lock(&h, items, "", false, true, tags)
	defer m.unlock(&h)
	if err := m.checkMarkers(&h, items, tags); err != nil {
		return Result{}, err
	}
	m.leases(&h, items, ss, len(items), nil, "")
	res := Result{Items: make([]ItemState, len(items))}
	for i := range items {
		res.Items[i] = ss[i].evaluate(stateOf(m.get(&h, i)), h.now, items[i].Cost, false)
	}
	res.decide()
	return res, nil
}

// Reset implements Store.
func (m *Memory) Reset(ctx context.Context, items []Item) error {
	var sbuf [4]spec
	if _, err := specs(items, sbuf[:0], false); err != nil {
		return err
	}
	var hb heldBufs
	h := hb.held()
	m.lock(&h, items, "", false, true, nil)
	defer m.unlock(&h)
	for i := range h.keys {
		delete(m.shards[h.idx[i]].m, h.keys[i])
	}
	return nil
}

// checkMarkers returns the *StaleError of the tags, locked last in h, that
// have no marker, or nil.
func (m *Memory) checkMarkers(h *held, items []Item, tags []string) error {
	var stale []string
	for j, t := range tags {
		if m.get(h, len(h.keys)-len(tags)+j) == nil {
			stale = append(stale, t)
		}
	}
	if stale != nil {
		return staleError(items, stale)
	}
	return nil
}

// Restore implements Restorer, atomically for all the items: it raises
// the counters and, with Generations, sets the tags' markers to the
// largest of the clock's time in µs and one more than they held.
func (m *Memory) Restore(ctx context.Context, items []Item, counted []int64) error {
	return m.restore(items, counted, m.gens)
}

// RestoreCounters implements Restorer: Restore without the markers.
func (m *Memory) RestoreCounters(ctx context.Context, items []Item, counted []int64) error {
	return m.restore(items, counted, false)
}

// restore is Restore, the markers set when mark is.
func (m *Memory) restore(items []Item, counted []int64, mark bool) error {
	var sbuf [4]spec
	ss, err := checkRestore(items, counted, sbuf[:0])
	if err != nil || len(items) == 0 {
		return err
	}
	var trims int
	shareTrims(ss, &trims)
	var tags []string
	if mark {
		tags = itemTags(items, nil, nil)
	}
	var hb heldBufs
	h := hb.held()
	m.lock(&h, items, "", false, false, tags)
	defer m.unlock(&h)
	for i := range items {
		if counted[i] == 0 {
			continue
		}
		e := m.get(&h, i)
		if ss[i].algo == SlidingLog {
			// A sliding log's sum to counted, its capacity at most, by one
			// mark at now (see spec.restoreLog).
			st := new(entry)
			if e != nil {
				st = e
			}
			if ttl, ok := ss[i].restoreLog(&st.state, h.now, min(counted[i], ss[i].cap)); ok {
				m.put(&h, i, st, ttl)
			}
			continue
		}
		used := ss[i].cap - ss[i].evaluate(stateOf(e), h.now, 0, false).Remaining
		// As restore.lua: a window's count rises to counted, its capacity
		// at most; a meter's debt by counted less what it holds, up to
		// one capacity owed beyond empty (settle's bound).
		delta := min(counted[i], ss[i].cap) - used
		if ss[i].algo == TokenBucket || ss[i].algo == GCRA {
			// What the meter holds, owed beyond empty too: used stops
			// at the capacity.
			_, d := ss[i].meterAt(stateOf(e), h.now)
			delta = counted[i] - ceilDiv(d, ss[i].p)
		}
		if delta <= 0 {
			continue
		}
		if e == nil {
			e = new(entry)
		}
		m.put(&h, i, e, ss[i].settle(&e.state, h.now, 0, delta, -1, ""))
	}
	for j := range tags {
		k := len(h.keys) - len(tags) + j
		e := m.get(&h, k)
		if e == nil {
			e = new(entry)
		}
		e.rec = max(h.now, e.rec+1)
		// A marker never expires: sweep drops entries expired for a while.
		e.expires = math.MaxInt64 - sweepGrace
		m.shards[h.idx[k]].m[h.keys[k]] = e
	}
	return nil
}

// shareTrims gives the items of one call, ss, one budget of marks that
// stopped counting to drop, maxTrim, in trims, as one request of a Redis
// store that is not sharded has (see maxTrim).
func shareTrims(ss []spec, trims *int) {
	*trims = maxTrim
	for i := range ss {
		ss[i].trims = trims
	}
}
