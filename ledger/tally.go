package ledger

// A tally is a call that costs nothing and counts only on a front door's
// descriptor limits (Entry.KeyDesc): a rate limit service's decision. An
// entry of its own for each such call cost the serving process most of a
// decision's CPU (the store's insert, roll-up and commit), for a column
// that only a restore after a limiter's data loss reads. So Tally appends
// a tally record to the spool (durable as a reservation is) and adds the
// call's counters to an aggregate in memory, one per shape (the entry's
// columns but its id, costs and usage) and bucket of time: the UTC ten
// seconds of its creation (tallyBucket). A tick, just after each bucket
// ends, and at the start of Flush, swaps the aggregates out and appends
// each as one entry (a reservation and its settlement), of no request and
// no cost, created at the latest call it holds, whose KeyDesc holds the
// summed counters; then a tick record, which says that the tallies before
// the spool position noted at the swap are in those entries. The flusher
// writes nothing for tallies and ticks.
//
// A window that starts at time T counts an entry created after T, so an
// entry counts in it the calls of its bucket before T too: up to ten
// seconds of calls beyond the window's start, never fewer than the
// window's. A window that starts on a bucket's start (a fixed window of a
// minute, an hour or a day, every restore window of a limit that moves
// with the clock, which starts on the minute) counts exactly its calls. A
// bucket of a second, as before, wrote ten times the entries for a shape
// called once or twice a second (a tenant's or an address's RLS calls):
// at 2,000 calls a second over 1,000 tenants, the flusher's inserts and
// roll-ups took a sixth of the server's CPU (bench/README.md).
//
// Until the store holds its tick's entries, CountsBy grouping by Desc
// adds a shape's aggregate to its answer as a pending entry of this node,
// so that a restore on this replica counts every call at once: before
// the tick from the aggregates, after it from the ticked ones the
// flusher has not applied yet (tallies.ticked; the store holds a tick's
// entries only once the flusher has committed them, a batch of a slow
// database later). Each bucket's aggregate of a shape
// is a KeyDesc text of its own, so that a tenant's texts in a limit's
// window are many more than MaxGroups: CountsBy grouping by Desc answers
// the sum of each counter over all of them (see GroupBy.Desc), never
// some of the texts.
//
// Memory: the aggregates hold one bucket of the calls' counters, and a
// tick comes early when they take about maxPendingBytes, so that callers
// who vary a descriptor's value on every call (an address, a user, a
// path: a new shape, or a new counter of one shape) cannot make them
// grow with their rate.
//
// Crash recovery: Open reads the spool and aggregates again the tallies
// after the last tick's position, which no entry holds yet, and writes
// them before the ledger serves (a recovery tick). The spool keeps its
// segments until both the store and a tick cover them. A tick's entries
// and its tick record are one append (one write(2)), which the flusher
// reads only once it is whole: a write the death of the process cut
// short leaves entries without their tick record at the spool's end, and
// Open cuts them off (see openSpool), so that the recovery tick counts
// their tallies once.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// tickEntryPrefix starts the request id of each entry a tick writes, and
// no other: Reserve, Settle and Tally refuse it.
const tickEntryPrefix = "tly_"

// tallyBucket is the span of time whose calls of one shape an aggregate
// sums: it divides a minute, so that buckets start on the minute.
const tallyBucket = 10 * time.Second

// tickLag is how long after a bucket ends its tick comes: the calls of
// the bucket's last moments are appended by then, and go in its entry
// rather than in one more of the same bucket at the next tick.
const tickLag = 50 * time.Millisecond

// maxPendingBytes is about the memory the aggregates take past which a
// tally asks for an early tick (see the top of this file), as counted by
// aggBytes and lineBytes.
var maxPendingBytes int64 = 64 << 20

// aggBytes and lineBytes are about what an aggregate takes in memory
// beside its counters' text (its entry, map and slices), and a counter
// beside its text.
const aggBytes, lineBytes = 768, 64

// bucketOf is the start of t's tally bucket, in Unix seconds.
func bucketOf(t time.Time) int64 {
	s := t.Unix()
	const b = int64(tallyBucket / time.Second)
	return s - (s%b+b)%b
}

// tallyShape is what a tally's aggregate is keyed by: the entry's columns
// but its id, costs, usage and KeyDesc, and the bucket of its creation.
type tallyShape struct {
	tenant, user, keyID, plan, route, upstream, model, region       string
	decision, policy, friction, keyModel, keyRoute, keyIP, keyAttrs string
	bucket                                                          int64 // see bucketOf; a fold's own
}

func shapeOf(e *Entry) tallyShape {
	return tallyShape{e.Tenant, e.User, e.KeyID, e.Plan, e.Route, e.Upstream, e.Model, e.Region,
		e.Decision, e.Policy, e.Friction, e.KeyModel, e.KeyRoute, e.KeyIP, e.KeyAttrs, bucketOf(e.CreatedAt)}
}

// tallied is a tally's record, its entry as recorded, and its KeyDesc's
// lines.
type tallied struct {
	r     record
	lines []descSum
}

// descSum is one counter of an aggregate: a KeyDesc line's text before
// its amount, and the amount summed.
type descSum struct {
	prefix string
	n      int64
}

// tallyAgg is one aggregate entry: e holds the shape's columns and the
// latest CreatedAt, sums the counters in the order they first came, and
// size is the length of the KeyDesc they make.
type tallyAgg struct {
	e    Entry
	sums []descSum
	size int
	// applied tells that the store holds a's entry (see
	// tallies.pruneTicked). The tallies' mu guards it.
	applied bool
}

// desc is the KeyDesc of a's sums.
func (a *tallyAgg) desc() string {
	b := make([]byte, 0, a.size)
	for i, s := range a.sums {
		if i > 0 {
			b = append(b, '\n')
		}
		b = strconv.AppendInt(append(append(b, s.prefix...), '\t'), s.n, 10)
	}
	return string(b)
}

func digits(n int64) int { return len(strconv.FormatInt(n, 10)) }

// tallies are a ledger's aggregates not yet ticked. A tally holds rw for
// reading across its spool append and its add, a tick holds it for
// writing across its swap: so the swap sees every tally appended before
// it, and none after, while tallies share the spool's writes (appends
// under way at once go out in one write(2)). mu guards the rest.
type tallies struct {
	rw     sync.RWMutex
	mu     sync.Mutex
	shapes map[tallyShape]*shapeAggs
	order  []*shapeAggs // the shapes' aggregates in the order they came
	// pending tells that the aggregates hold tallies, and first is at
	// most the spool position of the first of them: the spool keeps its
	// segments from there (see spool.keep).
	pending bool
	first   int64
	// bytes is about the memory the aggregates take: aggBytes each and
	// lineBytes and its text per counter.
	bytes int64
	// failing tells that the last tick could not append its entries: a
	// tally asks for no early tick until one has, so that a spool that
	// takes small appends and fails a tick's is not asked again at every
	// tally.
	failing bool

	// ticked are the aggregates ticks swapped out whose entries the store
	// may not hold yet, oldest first: CountsBy adds them to the store's
	// answer until the flusher has applied their tick's append, so that a
	// read between a tick's swap and the store's commit of its entries
	// finds its calls (it found them in neither). At most
	// maxTickedBytes of them, the newest.
	ticked      []*tickedAggs
	tickedBytes int64

	tickMu sync.Mutex // one tick at a time, so their records stay in order
}

// tickedAggs are one tick's aggregates, aggs[applied:] those the store
// may not hold yet, and the spool position where each one's entry is
// reserved (ends, nil until the tick has appended): the flusher's
// batches may end within a tick's append, so that the store holds some
// of its entries and not the rest.
type tickedAggs struct {
	aggs    []*tallyAgg
	ends    []int64
	applied int
	bytes   int64
}

// maxTickedBytes bounds the memory the ticked aggregates take, counted as
// tallies.bytes counts it: a flusher that falls this far behind the ticks
// (a store slow to write) has the oldest of them dropped, which CountsBy
// then finds once the store has them.
var maxTickedBytes = 2 * maxPendingBytes

// shapeAggs are a shape's aggregates (more than one when MaxKeyDesc
// splits it), and where each counter's sum is: the line the counter was
// last given. One lookup finds it however many aggregates the shape has
// (a domain's tally spreads over as many as its thousands of counters
// take).
type shapeAggs struct {
	aggs []*tallyAgg
	at   map[string]sumAt
}

// sumAt is a counter's line: a.sums[i].
type sumAt struct {
	a *tallyAgg
	i int
}

// aggsOf returns k's aggregates, made and put last in the order if k has
// none. One map lookup: the key is 15 strings to hash. t.mu is held.
func (t *tallies) aggsOf(k tallyShape) *shapeAggs {
	if t.shapes == nil {
		t.shapes = make(map[tallyShape]*shapeAggs)
	}
	p := t.shapes[k]
	if p == nil {
		p = &shapeAggs{at: make(map[string]sumAt)}
		t.shapes[k] = p
		t.order = append(t.order, p)
	}
	return p
}

// add adds the counters of e, a tally whose lines parse (see parseTally),
// to its shape's aggregates. t.mu is held.
func (t *tallies) add(e *Entry, lines []descSum) { t.addAs(shapeOf(e), e, lines) }

// addAs is add to the aggregates of shape k (a fold's, whose bucket is
// its own).
func (t *tallies) addAs(k tallyShape, e *Entry, lines []descSum) {
	sh := t.aggsOf(k)
	newAgg := func() *tallyAgg {
		a := &tallyAgg{e: *e}
		a.e.RequestID, a.e.KeyDesc = "", ""
		sh.aggs = append(sh.aggs, a)
		t.bytes += aggBytes
		return a
	}
	if len(sh.aggs) == 0 {
		newAgg()
	}
	for _, a := range sh.aggs {
		if e.CreatedAt.After(a.e.CreatedAt) {
			a.e.CreatedAt = e.CreatedAt
		}
	}
	for _, l := range lines {
		if s, ok := sh.at[l.prefix]; ok {
			a := s.a
			n := addSat(a.sums[s.i].n, l.n)
			if size := a.size + digits(n) - digits(a.sums[s.i].n); size <= MaxKeyDesc {
				a.sums[s.i].n, a.size = n, size
				continue
			}
		}
		// A counter not in the shape's aggregates yet, or whose sum would
		// take its aggregate past MaxKeyDesc: a line of the last one, or
		// of a new one.
		a := sh.aggs[len(sh.aggs)-1]
		line := len(l.prefix) + 1 + digits(l.n)
		if len(a.sums) > 0 {
			line++ // the newline before it
		}
		if a.size+line > MaxKeyDesc {
			a = newAgg()
			a.e.CreatedAt = e.CreatedAt
			line = len(l.prefix) + 1 + digits(l.n)
		}
		// The counter's own copy of its text: a prefix of the call's
		// KeyDesc would keep all of it (up to MaxKeyDesc) for its tick.
		l.prefix = strings.Clone(l.prefix)
		sh.at[l.prefix] = sumAt{a, len(a.sums)}
		a.sums = append(a.sums, l)
		a.size += line
		t.bytes += lineBytes + int64(len(l.prefix))
	}
}

// swap takes the aggregates out, in the order their shapes came. t.mu is
// held.
func (t *tallies) swap() []*tallyAgg {
	var out []*tallyAgg
	for _, p := range t.order {
		out = append(out, p.aggs...)
	}
	t.shapes, t.order, t.bytes = nil, nil, 0
	return out
}

// tickedFrom notes aggs, a tick's swap, as ticked and returns them so.
// t.mu is held.
func (t *tallies) tickedFrom(aggs []*tallyAgg, bytes int64) *tickedAggs {
	tk := &tickedAggs{aggs: aggs, bytes: bytes}
	t.ticked = append(t.ticked, tk)
	t.tickedBytes += bytes
	for t.tickedBytes > maxTickedBytes && len(t.ticked) > 1 {
		t.dropTicked(0)
	}
	return tk
}

// dropTicked removes the i-th ticked aggregates. t.mu is held.
func (t *tallies) dropTicked(i int) {
	t.tickedBytes -= t.ticked[i].bytes
	t.ticked = slices.Delete(t.ticked, i, i+1)
}

// untick removes tk from the ticked aggregates, if still there. t.mu is
// held.
func (t *tallies) untick(tk *tickedAggs) {
	if i := slices.Index(t.ticked, tk); i >= 0 {
		t.dropTicked(i)
	}
}

// pruneTicked drops the ticked aggregates that the store holds: those
// whose reservation record ends at or before applied. t.mu is held.
func (t *tallies) pruneTicked(applied int64) {
	for i := 0; i < len(t.ticked); {
		tk := t.ticked[i]
		for tk.ends != nil && tk.applied < len(tk.aggs) && tk.ends[tk.applied] <= applied {
			tk.aggs[tk.applied].applied = true
			tk.applied++
		}
		if tk.applied == len(tk.aggs) {
			t.dropTicked(i)
			continue
		}
		i++
	}
}

// putBack returns aggregates a tick could not write to the next tick.
// t.mu is held.
func (t *tallies) putBack(aggs []*tallyAgg) {
	for _, a := range aggs {
		p := t.aggsOf(shapeOf(&a.e))
		p.aggs = append([]*tallyAgg{a}, p.aggs...)
		t.bytes += aggBytes
		for i, l := range a.sums {
			t.bytes += lineBytes + int64(len(l.prefix))
			if _, ok := p.at[l.prefix]; !ok {
				p.at[l.prefix] = sumAt{a, i}
			}
		}
	}
}

// parseTally reads the lines of a tally's KeyDesc: each ends with a tab
// and a positive amount.
func parseTally(desc string) ([]descSum, error) {
	if desc == "" {
		return nil, fmt.Errorf("%w tally: no descriptor counters", ErrInvalid)
	}
	var out []descSum
	for line := range strings.SplitSeq(desc, "\n") {
		d, ok := descLineOf(line)
		if !ok {
			if strings.IndexByte(line, '\t') < 0 {
				return nil, fmt.Errorf("%w tally: descriptor line %q has no amount", ErrInvalid, line)
			}
			return nil, fmt.Errorf("%w tally: descriptor line %q: amount is not a positive integer", ErrInvalid, line)
		}
		out = append(out, d)
	}
	return out, nil
}

// descLineOf reads one line of a KeyDesc: its counter, the text before
// its last tab, and the amount after it, a positive integer; false for a
// line without them.
func descLineOf(line string) (descSum, bool) {
	i := strings.LastIndexByte(line, '\t')
	if i < 0 {
		return descSum{}, false
	}
	n, err := strconv.ParseInt(line[i+1:], 10, 64)
	if err != nil || n <= 0 {
		return descSum{}, false
	}
	return descSum{line[:i], n}, true
}

// Tally records a call that costs nothing and counts only on descriptor
// limits: e's KeyDesc counters, added to an aggregate entry of e's shape
// and bucket (ten seconds) that a tick writes once the bucket has ended
// (see the top of this file). It checks e as Reserve does, and its
// KeyDesc as lines that each end with a tab and a positive amount; e's
// request id, costs, usage and requests are not recorded (the aggregate
// entry is of no request and no cost). It is one append to the spool,
// durable as a reservation is (an fsync when Config.SyncEach is set),
// refused with ErrSpoolFull as a reservation is; on any error the call
// is not counted. A zero e.CreatedAt means now. Several entries (a call's counters under
// several tenants) are recorded together, in one append: all of them or,
// on any error, none.
func (l *Ledger) Tally(ctx context.Context, es ...Entry) error {
	// One allocation for the call's records: a tally is on a decision's
	// path.
	calls := make([]tallied, 0, len(es))
	for i := range es {
		e := &es[i]
		if err := e.check(); err != nil {
			return err
		}
		lines, err := parseTally(e.KeyDesc)
		if err != nil {
			return err
		}
		at := e.CreatedAt
		if at.IsZero() {
			at = l.cfg.Now()
		}
		calls = append(calls, tallied{record{kind: kindTally, e: Entry{
			Tenant: e.Tenant, User: e.User, KeyID: e.KeyID, Plan: e.Plan, Route: e.Route, Upstream: e.Upstream,
			Model: e.Model, Region: e.Region, Decision: e.Decision, Policy: e.Policy, Friction: e.Friction,
			KeyModel: e.KeyModel, KeyRoute: e.KeyRoute, KeyIP: e.KeyIP, KeyAttrs: e.KeyAttrs, KeyDesc: e.KeyDesc,
			Requests: 1, CreatedAt: micro(at),
		}}, lines})
	}
	if l.spool == nil {
		return ErrReadOnly
	}
	if len(calls) == 0 {
		return nil
	}
	var buf [2]*record
	rs := buf[:0]
	for i := range calls {
		rs = append(rs, &calls[i].r)
	}
	// The spool keeps its segments from before these tallies' records on,
	// set before the append, so that no segment holding them is dropped
	// before their tick covers them; a failed append keeps a little more
	// until the next tick.
	l.tally.rw.RLock()
	before := l.spool.keepToEnd()
	pos, err := l.spool.appendAll(l.cfg.SpoolLimit, rs...)
	if err == nil {
		l.tally.mu.Lock()
		if !l.tally.pending || before < l.tally.first {
			l.tally.pending, l.tally.first = true, before
		}
		for i := range calls {
			l.tally.add(&calls[i].r.e, calls[i].lines)
		}
		if l.tally.bytes >= maxPendingBytes && !l.tally.failing {
			select {
			case l.tickKick <- struct{}{}:
			default:
			}
		}
		l.tally.mu.Unlock()
	}
	l.tally.rw.RUnlock()
	if err != nil {
		return err
	}
	select {
	case l.wake <- struct{}{}: // the flusher reads past it, so that the spool's pending bytes shrink
	default:
	}
	if l.cfg.SyncEach {
		select {
		case l.syncKick <- struct{}{}:
		default:
		}
		return l.spool.waitSynced(pos)
	}
	return nil
}

// tick writes the aggregates as entries and a tick record after them (see
// the top of this file). Aggregates it could not append go back to the
// next tick, and no tick record is written then: a crash before the next
// one has the recovery count them.
func (l *Ledger) tick() error {
	if l.spool == nil {
		return nil
	}
	l.tally.tickMu.Lock()
	defer l.tally.tickMu.Unlock()
	l.tally.rw.Lock()
	l.tally.mu.Lock()
	bytes := l.tally.bytes
	aggs := l.tally.swap()
	var tk *tickedAggs
	if len(aggs) > 0 {
		tk = l.tally.tickedFrom(aggs, bytes)
	}
	covered, _ := l.spool.positions()
	first := l.tally.first
	l.tally.pending = false
	l.tally.mu.Unlock()
	l.tally.rw.Unlock()
	// covered is where the tallies in aggs end: once the tick record is
	// appended, the spool keeps its segments for the next tick's only.
	// No tally is under way meanwhile (rw), so every tally appended
	// since the swap is pending, and first is at most its position.
	released := func() {
		l.tally.rw.Lock()
		l.tally.mu.Lock()
		keep := int64(maxPosition)
		if l.tally.pending {
			keep = l.tally.first
		}
		l.spool.keepFrom(keep)
		l.tally.failing = false
		l.tally.mu.Unlock()
		l.tally.rw.Unlock()
	}
	if len(aggs) == 0 {
		released()
		return nil
	}
	// The entries and the tick record go in one append, all or none: a
	// crash between them, or a failed append of some, used to leave
	// entries that hold tallies the recovery then aggregated again. (A
	// write the death of the process cuts short leaves some entries
	// without their tick record: Open cuts them off, see openSpool.)
	now := micro(l.cfg.Now())
	recs := make([]record, 0, 2*len(aggs)+1)
	for i, a := range aggs {
		e := a.e
		// Unique to the node, the run (a spool started again from
		// position 0 would repeat the positions) and the tick.
		e.RequestID = tickEntryPrefix + l.node + "_" + l.marker[:8] + "_" + strconv.FormatInt(covered, 36) + "_" + strconv.Itoa(i)
		e.KeyDesc = a.desc()
		e.Status, e.Requests = StatusSettled, 0
		e.SettledAt = now
		if now.Before(e.CreatedAt) {
			e.SettledAt = e.CreatedAt
		}
		// A reservation and its settlement, as a request's: this node's
		// reads of its records while the store fails (pendingEach) count
		// the entries their records reserve.
		reserved := e
		reserved.Status, reserved.SettledAt = StatusReserved, time.Time{}
		recs = append(recs, record{kind: kindReserve, e: reserved}, record{kind: kindSettle, e: e})
	}
	recs = append(recs, record{kind: kindTick, pos: covered})
	rs := make([]*record, len(recs))
	for i := range recs {
		rs[i] = &recs[i]
	}
	ends := make([]int64, len(rs))
	_, err := l.spool.appendEach(0, ends, rs)
	if err != nil {
		l.tally.mu.Lock()
		l.tally.untick(tk)
		l.tally.putBack(aggs)
		l.tally.failing = true
		if !l.tally.pending || first < l.tally.first {
			l.tally.first = first
		}
		l.tally.pending = true
		l.tally.mu.Unlock()
		return fmt.Errorf("ledger: tally entries: %w", err)
	}
	for i := range aggs {
		ends[i] = ends[2*i] // aggs[i]'s reservation record
	}
	l.tally.mu.Lock()
	tk.ends = ends[:len(aggs)]
	l.tally.mu.Unlock()
	released()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// tickLoop ticks tickLag after each bucket ends, by the host's clock,
// and when a tally asks for an early tick, until the ledger closes.
func (l *Ledger) tickLoop() {
	l.every(untilTick, l.tickKick, func() {
		if err := l.tick(); err != nil {
			l.cfg.Logf("%v (kept for the next tick)", err)
		}
	})
}

// untilTick is the wait from now until tickLag after the end of now's
// bucket.
func untilTick(now time.Time) time.Duration {
	return now.Truncate(tallyBucket).Add(tallyBucket + tickLag).Sub(now)
}

// every calls f once wait(now) has passed since it started or since f
// last returned, and whenever kick (nil for none) delivers, until the
// ledger closes; then it marks its goroutine done (l.wg).
func (l *Ledger) every(wait func(now time.Time) time.Duration, kick <-chan struct{}, f func()) {
	defer l.wg.Done()
	t := time.NewTimer(wait(time.Now()))
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		case <-kick:
		}
		f()
		t.Reset(wait(time.Now()))
	}
}

// recoverTallies aggregates the spool's tallies after its last tick
// record's position, which no entry holds, and writes them (a recovery
// tick). Open calls it before anything else appends.
func (l *Ledger) recoverTallies() error {
	type tally struct {
		pos int64
		e   Entry
	}
	var (
		pending []tally
		covered int64
	)
	err := l.spool.scan(func(pos int64, r *record) {
		switch r.kind {
		case kindTally:
			pending = append(pending, tally{pos, r.e})
		case kindTick:
			covered = max(covered, r.pos)
			pending = slices.DeleteFunc(pending, func(t tally) bool { return t.pos < covered })
		}
	})
	if err != nil {
		return err
	}
	l.tally.mu.Lock()
	if len(pending) > 0 {
		l.tally.pending, l.tally.first = true, pending[0].pos
	}
	for i := range pending {
		lines, err := parseTally(pending[i].e.KeyDesc)
		if err != nil {
			continue // written by no version of the ledger: Tally checks them
		}
		l.tally.add(&pending[i].e, lines)
	}
	l.tally.mu.Unlock()
	if len(pending) > 0 {
		l.cfg.Logf("ledger: recovered %d tallies of a previous run", len(pending))
	}
	return l.tick()
}

// dropAppliedTicks lets go of the ticked aggregates the store now holds:
// the flusher calls it after each batch, so that a process that never
// reads CountsBy does not keep them.
func (l *Ledger) dropAppliedTicks() {
	l.tally.mu.Lock()
	defer l.tally.mu.Unlock()
	if len(l.tally.ticked) == 0 {
		return
	}
	l.pruneApplied()
}

// pruneApplied drops the ticked aggregates the store holds, as the
// flusher's applied position says now, and returns the spool's end then.
// l.tally.mu is held.
func (l *Ledger) pruneApplied() (end int64) {
	end, applied := l.spool.positions()
	l.tally.pruneTicked(applied)
	return end
}

// pendingTallies returns the aggregates not yet ticked that match selects
// (as entries, in the order their shapes came) and, with ticked, those
// ticks swapped out whose entries the flusher has not applied yet, oldest
// first; the aggregates themselves, for anyApplied; and the spool's end
// then. Without ticked (a read of the spool up to that end instead, see
// localCountsBy), it waits for a tick's append under way: its aggregates
// are in neither the aggregates nor the spool until it has appended.
// match is given each aggregate's entry with its first counter for its
// KeyDesc: it may test whether there is one, not what the text says.
func (l *Ledger) pendingTallies(match func(*Entry) bool, ticked bool) ([]Entry, []*tallyAgg, int64) {
	l.tally.mu.Lock()
	for !ticked && slices.ContainsFunc(l.tally.ticked, func(tk *tickedAggs) bool { return tk.ends == nil }) {
		l.tally.mu.Unlock()
		l.tally.tickMu.Lock() // held by a tick until it has appended, or given its aggregates back
		l.tally.tickMu.Unlock()
		l.tally.mu.Lock()
	}
	defer l.tally.mu.Unlock()
	end := l.pruneApplied()
	var (
		out  []Entry
		aggs []*tallyAgg
	)
	// match sees an aggregate with its first counter for its KeyDesc
	// (empty without one): the whole text, up to MaxKeyDesc, is built only
	// for the aggregates it selects, since every Tally waits for this lock.
	var e Entry // one for every aggregate: match takes its address
	add := func(a *tallyAgg) {
		e = a.e
		e.Status, e.Requests = StatusSettled, 0
		if len(a.sums) > 0 {
			e.KeyDesc = a.sums[0].prefix
		}
		if match(&e) {
			e.KeyDesc = a.desc()
			out = append(out, e)
			aggs = append(aggs, a)
		}
	}
	if ticked {
		for _, tk := range l.tally.ticked {
			for _, a := range tk.aggs[tk.applied:] {
				add(a)
			}
		}
	}
	for _, p := range l.tally.order {
		for _, a := range p.aggs {
			add(a)
		}
	}
	return out, aggs, end
}

// anyApplied tells whether the flusher has applied the entry of any of
// aggs, which pendingTallies answered: a read of the store that began
// before it did may hold it. A tick's swap alone does not apply one: the
// swapped aggregates stay in pendingTallies' answer, ticked, and the
// store has none of them until the flusher applies them.
func (l *Ledger) anyApplied(aggs []*tallyAgg) bool {
	l.tally.mu.Lock()
	defer l.tally.mu.Unlock()
	l.pruneApplied()
	for _, a := range aggs {
		if a.applied {
			return true
		}
	}
	return false
}
