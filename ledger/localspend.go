package ledger

// While the store cannot be reached, Spend answers from what this node
// knows: the last value it read from the store for the same query and
// period, plus the charge of the records this node has spooled since that
// read. Each successful Spend remembers its value with the spool position
// that the store was known to hold before the read; the local answer scans
// the spool from that position.

import (
	"fmt"
	"sync"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// LocalSpendError is Spend's error while the store cannot be reached: the
// spend it carries is not the store's but what this node knows, so a caller
// that must not block (a limiter seeding a fallback budget) can use it and
// one that needs the exact figure can refuse it. Spend returns the same
// value as its first result. It unwraps to the store's error.
//
// Spend = Stored + Pending. It leaves out what other nodes recorded since
// the read, so with several nodes it is low by their share; it is high by
// at most one batch when records reached the store while the read ran
// (they count in both parts).
type LocalSpendError struct {
	// Spend is the estimate: Stored plus Pending, in nano-dollars.
	Spend costmodel.NanoUSD
	// Stored is the last value read from the store for the same query and
	// period since Open, and ReadAt when it was read; when there is none
	// and the store may hold records of the period, the read of the same
	// query over the narrowest range read that covers the period (more
	// than the period's spend: an upper bound); both are zero when none
	// was, and Pending is then only what is not yet in the store.
	Stored costmodel.NanoUSD
	ReadAt time.Time
	// Pending is the charge of this node's records spooled after the read
	// (or, without one, not yet in the store) that fall in the query: a
	// reservation counts its estimate until a settlement or failure in the
	// same records replaces it with the actual cost. A settlement whose
	// reservation was in the store at the read leaves it at its estimate.
	Pending costmodel.NanoUSD
	// Partial reports that some of this node's records of after the read
	// reached the store and left the spool before the store failed (more
	// than Config.SegmentSize of records ago); they are not counted.
	Partial bool
	// Unknown reports that the store may hold spend of the query's range
	// that Spend does not count: no read of the query since Open (Stored
	// is 0), and the range begins before the store last answered this
	// node (or it has not answered since Open). A caller that restores a
	// limit from the value must not take it for the spend.
	Unknown bool
	// Counts is Counts' answer, and PendingCounts its part from this
	// node's records spooled after the read, as Pending is of Spend's;
	// both are zero for the dollar reads, whose answers leave them out.
	Counts, PendingCounts Counts
	// Err is the store's error.
	Err error
	// pendingBy is Pending by the ids of KeySpend's or UserSpend's
	// answer (see PendingOf); nil for Spend's. A pointer, so that the
	// error compares as a value.
	pendingBy *map[string]costmodel.NanoUSD
}

// PendingOf is the part of the value of id (a key id, a user) in
// KeySpend's or UserSpend's answer that is this node's records spooled
// after the read, as Pending is of the whole; 0 for Spend's answer.
func (e *LocalSpendError) PendingOf(id string) costmodel.NanoUSD {
	if e.pendingBy == nil {
		return 0
	}
	return (*e.pendingBy)[id]
}

func (e *LocalSpendError) Error() string {
	read := "no earlier read"
	if e.Unknown {
		read = "no earlier read, the store's part unknown"
	} else if !e.ReadAt.IsZero() {
		read = "read at " + e.ReadAt.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("ledger: spend from this node's records (%s, %s stored + %s pending): %v",
		read, e.Stored, e.Pending, e.Err)
}

func (e *LocalSpendError) Unwrap() error { return e.Err }

// spendQueryKey names a query and its period.
type spendQueryKey struct {
	// tenant is the query's tenant; empty for TotalCountsBy's, every
	// tenant's (no other read takes an empty tenant).
	tenant, user, key, region string
	from, to                  int64   // Unix microseconds
	by                        GroupBy // CountsBy's grouping; zero for the other reads
}

// spendRead is a value read from the store, with the spool position the
// store held everything before when the read began.
type spendRead struct {
	value costmodel.NanoUSD
	pos   int64
	at    time.Time
}

// readCache holds the last read of each query, up to maxSpendCache
// queries; past it, it starts over. It is safe for concurrent use.
type readCache[R cachedRead] struct {
	mu sync.Mutex
	m  map[spendQueryKey]R
}

// cachedRead is a read that readCache holds: it says when it was made.
type cachedRead interface{ readAt() time.Time }

func (r spendRead) readAt() time.Time    { return r.at }
func (r groupsRead) readAt() time.Time   { return r.at }
func (r keySpendRead) readAt() time.Time { return r.at }

const maxSpendCache = 4096

func (c *readCache[R]) put(k spendQueryKey, r R) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxSpendCache {
		c.m = make(map[spendQueryKey]R)
	}
	c.m[k] = r
}

// last is the read that a local answer to k starts from: k's own, or,
// when there is none and the store may hold records of k's range
// (wide), the read of the same query over the narrowest range that
// covers k's (see covers); ok is false when there is neither. A wider
// read counts what the store held of k's range and more, so an answer
// from it is an upper bound of the spend, never below it. A limit's
// restore asks for a range that moves with the clock (a sliding window's
// period back, rounded to the minute; an open end a century on): without
// the wider read, the first restore after the minute turned found no read
// of its own, and a fail-closed limit refused every request until the
// database came back, though this node had read its spend a minute
// before.
func (c *readCache[R]) last(k spendQueryKey, wide bool) (r R, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok = c.m[k]; ok || !wide {
		return r, ok
	}
	var best spendQueryKey
	for ck, cr := range c.m {
		if !ck.covers(k, cr.readAt()) {
			continue
		}
		if !ok || ck.from > best.from || ck.from == best.from && cr.readAt().After(r.readAt()) {
			best, r, ok = ck, cr, true
		}
	}
	return r, ok
}

// openEnd is how far past its read a range must end for the read to
// count every record created until then, whatever the range's end: more
// than any clock between nodes is off.
const openEnd = 24 * time.Hour

// covers reports whether a read of range c made at at counted every
// record of k's range the store held then, and no more than a window's
// worth besides: the same query, from no later than k's, to no earlier
// than k's or past every record created by then, read once k's range
// had begun. A read from before k's range began is not taken for it: a
// fixed window that turned since, whose last window's spend is not this
// one's.
func (c spendQueryKey) covers(k spendQueryKey, at time.Time) bool {
	same := c
	same.from, same.to = k.from, k.to
	return same == k && c.from <= k.from && at.UnixMicro() >= k.from &&
		(c.to >= k.to || c.to >= at.Add(openEnd).UnixMicro())
}

// localSpend answers k from its last read and the spool after it.
func (l *Ledger) localSpend(k spendQueryKey, storeErr error) (costmodel.NanoUSD, error) {
	last, ok := l.spendReads.last(k, l.answeredAfter(k.from))
	from, partial := l.pendingFrom(last.pos, ok)
	pending, err := l.pendingSpend(k, from)
	if err != nil {
		return 0, fmt.Errorf("%w (and the spool: %v)", storeErr, err)
	}
	le := &LocalSpendError{
		Spend: addSat(last.value, pending), Stored: last.value, ReadAt: last.at,
		Pending: pending, Partial: partial, Unknown: !ok && l.answeredAfter(k.from), Err: storeErr,
	}
	return le.Spend, le
}

// answered records that the store answered this node (an applied batch, a
// read) at now.
func (l *Ledger) answered(now time.Time) {
	if t := now.UnixMicro(); l.lastAnswer.Load() < t {
		l.lastAnswer.Store(t)
	}
}

// answeredAfter reports whether the store may hold this node's records
// created at from (Unix microseconds) or later: it answered at from or
// later, or not since Open.
func (l *Ledger) answeredAfter(from int64) bool {
	t := l.lastAnswer.Load()
	return t == 0 || t >= from
}

// pendingFrom is where the spool's records a read at pos does not hold
// start: pos, or the spool's end when there was no read (known false);
// or the spool's first record, when the spool no longer holds some of
// them (partial).
func (l *Ledger) pendingFrom(pos int64, known bool) (from int64, partial bool) {
	if !known {
		_, pos = l.spool.positions()
	}
	if first := l.spool.first(); first > pos {
		return first, known
	}
	return pos, false
}

// pendingSpend sums the charge of the spool's records from pos onwards that
// fall in k.
func (l *Ledger) pendingSpend(k spendQueryKey, pos int64) (costmodel.NanoUSD, error) {
	var sum costmodel.NanoUSD
	err := l.pendingEach(pos, maxPosition, k.match, func(_ cols, d charge) { sum = addSat(sum, d.cost) })
	return sum, err
}

// charge is a change of what spooled records count: in dollars, and on a
// limiter in other units (see Entry.Counts). Either may be negative (a
// settlement below its reservation's estimate).
type charge struct {
	cost    costmodel.NanoUSD
	counts  Counts
	entries int64 // the change in the entries counted (see Group.Entries)
}

// pendingEach calls add with the columns (user, key, route, upstream,
// model) and the charge of each of the spool's records from pos onwards
// that match selects, up to those that end at to (maxPosition for the
// spool's end): a reservation's estimate, and a settlement's difference
// from the estimate of a reservation in the same records.
func (l *Ledger) pendingEach(pos, to int64, match func(*Entry) bool, add func(c cols, d charge)) error {
	type held struct {
		estimate costmodel.NanoUSD
		counts   Counts // the reservation's, at its estimate
		decision string
		requests int64 // the reservation's Requests, which its settlement keeps
		cols
	}
	hold := func(e *Entry) held {
		return held{e.EstimatedCost, e.Counts(), e.Decision, e.Requests, colsOf(e)}
	}
	end, _ := l.spool.positions()
	end = min(end, to)
	var (
		open = map[string]held{} // reserved in these records, by request id
		done = map[string]bool{} // finalized in these records
		recs []record
		buf  []byte
		err  error
	)
	// The estimates, as of pos, of the reservations still open then whose
	// records the spool still holds: an extension after pos of one of
	// them (a stream reserved before the read and extended since) counts
	// its increment over that estimate, which the read counted.
	before := map[string]held{}
	for at := l.spool.first(); at < pos; {
		var next int64
		recs, next, err = l.spool.readUntil(at, pos, 4096, recs, &buf, nil)
		if err != nil {
			return err
		}
		if next == at {
			break
		}
		at = next
		for i := range recs {
			e := &recs[i].e
			switch recs[i].kind {
			case kindReserve, kindExtend:
				h, ok := before[e.RequestID]
				if recs[i].kind == kindReserve && !ok || ok && e.EstimatedCost > h.estimate {
					n := hold(e)
					if ok {
						n.cols, n.decision, n.requests = h.cols, h.decision, h.requests
						n.counts = extended(h.decision, h.requests, e)
					}
					before[e.RequestID] = n
				}
			case kindSettle:
				delete(before, e.RequestID)
			case kindRecover:
				clear(before)
			}
		}
	}
	for pos < end {
		var next int64
		recs, next, err = l.spool.readUntil(pos, end, 4096, recs, &buf, nil)
		if err != nil {
			return err
		}
		if next == pos {
			break
		}
		pos = next
		for i := range recs {
			e := &recs[i].e
			switch recs[i].kind {
			case kindReserve:
				if _, seen := open[e.RequestID]; seen || done[e.RequestID] || !match(e) {
					continue
				}
				h := hold(e)
				open[e.RequestID] = h
				add(h.cols, charge{e.EstimatedCost, h.counts, countedEntry(h.decision, StatusReserved, 0)})
			case kindExtend:
				h, reserved := open[e.RequestID]
				if !reserved {
					// Reserved before pos: the read counted it at its
					// estimate then; count the increment over it.
					if h, ok := before[e.RequestID]; ok && !done[e.RequestID] && match(e) && e.EstimatedCost > h.estimate {
						c := extended(h.decision, h.requests, e)
						add(h.cols, charge{e.EstimatedCost - h.estimate, c.sub(h.counts), 0})
						h.estimate, h.counts = e.EstimatedCost, c
						before[e.RequestID] = h
					}
					continue
				}
				if e.EstimatedCost > h.estimate {
					c := extended(h.decision, h.requests, e)
					add(h.cols, charge{e.EstimatedCost - h.estimate, c.sub(h.counts), 0})
					h.estimate, h.counts = e.EstimatedCost, c
					open[e.RequestID] = h
				}
			case kindSettle:
				h, reserved := open[e.RequestID]
				if !reserved {
					delete(before, e.RequestID) // stays at the estimate the read and the extensions since counted
					continue                    // reserved before pos (in the store at its estimate) or not matched
				}
				delete(open, e.RequestID)
				done[e.RequestID] = true
				final := Entry{Decision: h.decision, Requests: h.requests, Status: e.Status, HTTPStatus: e.HTTPStatus, Actual: e.Actual}
				add(h.cols, charge{e.ActualCost - h.estimate, final.Counts().sub(h.counts),
					countedEntry(h.decision, e.Status, e.HTTPStatus) - countedEntry(h.decision, StatusReserved, 0)})
			}
		}
	}
	return nil
}

// extended is what an extension record e counts on a limiter (see
// Entry.Counts) for a reservation of decision and requests: its new
// estimate.
func extended(decision string, requests int64, e *Entry) Counts {
	r := Entry{Decision: decision, Requests: requests, Status: StatusReserved, Estimated: e.Estimated}
	return r.Counts()
}

// matchBy is k.match, and for a grouped read by the descriptor counters
// (GroupBy.Desc) only the entries that record some (see descOnly).
func (k spendQueryKey) matchBy() func(*Entry) bool {
	if !k.by.Desc {
		return k.match
	}
	return func(e *Entry) bool { return e.KeyDesc != "" && k.match(e) }
}

func (k spendQueryKey) match(e *Entry) bool {
	at := e.CreatedAt.UnixMicro()
	return (k.tenant == "" || e.Tenant == k.tenant) && (k.user == "" || e.User == k.user) && (k.key == "" || e.KeyID == k.key) &&
		(k.region == "" || e.Region == k.region) && at >= k.from && at < k.to
}
