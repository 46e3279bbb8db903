package ledger

// Both stores apply a batch of spool records the same way: within one
// transaction, for each run of records between recovery markers, they load
// the rows the run touches, merge the records into them here in Go, and
// write back the rows that changed together with the change of each spend
// bucket. The merge rules make replay harmless:
//
//   - a reservation creates its entry only if none exists;
//   - a settlement finalizes an entry that is reserved or recovered (a
//     recorded settlement beats a recovery at the estimate), creates it if
//     none exists, and does nothing to an entry already settled or failed;
//   - an extension raises the estimate of an entry that is reserved or
//     recovered (charged at its estimate, which it raises too), and does
//     nothing to one that is not there or already settled, failed or
//     expired;
//   - the running process's recovery marker finalizes at their estimate the
//     node's entries still reserved when it is applied, which is after
//     every record the dead runs wrote, since records are applied in spool
//     order; the marker of an earlier run, met again when the spool is
//     replayed from before it (the applied hint lost), changes nothing: the
//     store has applied it, and a later run's reservations, recovered at it
//     now, would lose the records of theirs that follow it.

import (
	"context"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// The spend roll-up sums the charges and counts the entries per tenant and
// scope (the whole tenant, one user, one key, one user's key) at two grains:
// 15-minute buckets and UTC days. Every time zone in use today is offset
// from UTC by a multiple of 15 minutes, so a day or month in any of them is
// exactly the UTC days wholly inside it plus the 15-minute buckets of the
// partial days at its two ends: a month is at most 31 + 2×96 rows to add,
// however many entries it holds, and the time zone can change without
// rebuilding anything.
const bucketSize = 15 * time.Minute

const (
	grainQuarter = 0 // 15-minute buckets
	grainDay     = 1 // UTC days
)

type spendKey struct {
	tenant, scope string
	grain         int16
	bucket        int64 // Unix microseconds of the bucket's start
}

// spendDelta is a change of one roll-up row.
type spendDelta struct {
	cost, entries int64
}

// scopeOf names the roll-up scope of a user and a key, either of which may
// be absent.
func scopeOf(user, key string, hasUser, hasKey bool) string {
	switch {
	case hasUser && hasKey:
		return "uk:" + strconv.Itoa(len(user)) + ":" + user + key
	case hasUser:
		return "u:" + user
	case hasKey:
		return keyScope + key
	}
	return ""
}

// addSpend adds d, for an entry of tenant, user and key created at at, to
// every scope and grain of deltas that a read asks for: the tenant's, the
// user's (UserSpend reads the entries of no user under ""), the key's
// and the user's key's where the entry names a key, and a user for the
// last. A read of no key or no user asks for the scope without it
// (scopeOf with hasUser user != "", hasKey key != ""), and KeySpend
// leaves out entries of no key, so the other two scopes of such an entry
// were never read: writing them made an entry of no key (every RLS call)
// cost twice the roll-up rows.
func addSpend(deltas map[spendKey]spendDelta, tenant, user, key string, at time.Time, d spendDelta) {
	quarter := at.Truncate(bucketSize).UnixMicro()
	day := time.Date(at.Year(), at.Month(), at.Day(), 0, 0, 0, 0, time.UTC).UnixMicro()
	scopes := [...]string{scopeOf(user, key, false, false), scopeOf(user, key, true, false), "", ""}
	n := 2
	if key != "" {
		scopes[n] = scopeOf(user, key, false, true)
		n++
		if user != "" {
			scopes[n] = scopeOf(user, key, true, true)
			n++
		}
	}
	for _, scope := range scopes[:n] {
		for _, k := range [...]spendKey{{tenant, scope, grainQuarter, quarter}, {tenant, scope, grainDay, day}} {
			v := deltas[k]
			v.cost = addSat(v.cost, d.cost)
			v.entries += d.entries
			deltas[k] = v
		}
	}
}

// addSat returns a+b, saturating at the bounds of int64. The roll-up
// saturates instead of wrapping, and the stores' upserts likewise, since a
// sum the store refused would stop the flusher for good; every read that
// adds costs (the stores' sums, and Spend's and KeySpend's in Go)
// saturates likewise rather than failing or wrapping. One entry costs at
// most MaxCost, so a bucket saturates only past 1,024 such entries.
func addSat[T ~int64](a, b T) T {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// joinHalves returns hi<<32 + lo, saturating at the bounds of int64: the
// sum of int64 values from the sums of their high halves (v >> 32) and of
// their low halves (v & 0xFFFFFFFF), which SQLite adds exactly where the
// SUM of the values themselves would overflow.
func joinHalves(hi, lo int64) int64 {
	v := new(big.Int).Lsh(big.NewInt(hi), 32)
	v.Add(v, big.NewInt(lo))
	switch {
	case v.IsInt64():
		return v.Int64()
	case v.Sign() > 0:
		return math.MaxInt64
	}
	return math.MinInt64
}

// spendRanges splits [from, to) into the UTC days wholly inside it, [d0,
// d1), and the rest, [from, q1) and [q2, to), to be read at the 15-minute
// grain. Empty ranges have equal bounds.
func spendRanges(from, to time.Time) (d0, d1, q1, q2 time.Time) {
	from, to = from.UTC(), to.UTC()
	d0 = time.Date(from.Year(), from.Month(), from.Day(), 0, 0, 0, 0, time.UTC)
	if d0.Before(from) {
		d0 = d0.AddDate(0, 0, 1)
	}
	d1 = time.Date(to.Year(), to.Month(), to.Day(), 0, 0, 0, 0, time.UTC)
	if !d0.Before(d1) {
		return to, to, to, to // no whole day: all of [from, to) at 15 minutes
	}
	return d0, d1, d0, d1
}

// storeTx is one transaction on a store.
type storeTx interface {
	// load returns the stored entries among ids.
	load(ctx context.Context, ids []string) (map[string]*Entry, error)
	// write inserts the rows that load did not find, updates those it found
	// (every column but the key and those a settlement never changes), and
	// adds deltas to the spend roll-up.
	write(ctx context.Context, node string, inserts, updates []*Entry, deltas map[spendKey]spendDelta) error
	// remove deletes the entries of ids, and returns those it found: their
	// tenant, user, key, creation and charge.
	remove(ctx context.Context, ids []string) ([]Entry, error)
	// recover finalizes at their estimate the node's entries that are
	// reserved and created at or after the node's open-since mark, unless
	// the marker is the last one the node applied (a batch retried after a
	// commit whose acknowledgement was lost: the reservations open now are
	// the running process's).
	recover(ctx context.Context, node, marker string, at time.Time) (int64, error)
	// recoverNode finalizes at their estimate, as recover does, the node's
	// entries that are reserved, created at or after the node's open-since
	// mark and before before, with settled_at at; then it sets the mark to
	// the oldest of the node's reservations left open (none when there are
	// none), so that it stays a lower bound of them, and an exact one.
	recoverNode(ctx context.Context, node string, before, at time.Time) (int64, error)
	// mark sets the node's open-since mark to since (none when zero), or
	// only lowers it to since when lower is set.
	mark(ctx context.Context, node string, since time.Time, lower bool) error
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// openSet tracks the reservations of this run that are open in the store,
// so that the store can keep an open-since mark per node: the earliest
// CreatedAt of the node's open reservations. Recovery then looks only at
// entries created since the mark, through the created_at index, and the
// entries table needs no index on status (which would rule out heap-only
// updates in PostgreSQL, and cost an index write per settlement).
//
// Until this run's recovery marker is applied, the records applied are the
// previous run's and the set is not complete, so a batch may only lower the
// mark; from the marker on, the set is exact and each batch sets the mark.
type openSet struct {
	marker bool             // this run's recovery marker is in the store
	open   map[string]int64 // open reservations since the marker: id → CreatedAt µs
	// low is at most the earliest CreatedAt in open, exact as of exactAt.
	// With many reservations open, the mark is recomputed exactly only
	// every exactEvery, and lowered in between: an early mark only makes
	// a recovery read more rows.
	low     int64
	exactAt time.Time
}

const (
	exactLimit = 4096
	exactEvery = time.Second
)

// batchResult is what a batch changes in an openSet, applied once the batch
// has committed.
type batchResult struct {
	recovered int64
	marker    bool             // the batch holds a recovery marker
	opened    map[string]int64 // reservations opened after the last marker
	closed    map[string]bool  // reservations closed after the last marker
	low       int64            // the mark since computed
	exact     bool             // low is exact
}

func (st *openSet) apply(r *batchResult) {
	if r.marker || st.open == nil {
		st.marker = st.marker || r.marker
		st.open = make(map[string]int64)
	}
	for id, at := range r.opened {
		st.open[id] = at
	}
	for id := range r.closed {
		delete(st.open, id)
	}
	st.low = r.low
	if r.exact {
		st.exactAt = time.Now()
	}
}

// since returns a lower bound (exact when the set is small) of the earliest
// CreatedAt of the set as changed by r, zero when the set is empty; with
// r.marker it ignores what the set held before.
func (st *openSet) since(r *batchResult) time.Time {
	low := int64(0)
	consider := func(at int64) {
		if low == 0 || at < low {
			low = at
		}
	}
	for id, at := range r.opened {
		if !r.closed[id] {
			consider(at)
		}
	}
	r.exact = true
	if !r.marker {
		if len(st.open) > exactLimit && time.Since(st.exactAt) < exactEvery {
			r.exact = false
			if st.low != 0 {
				consider(st.low)
			}
		} else {
			for id, at := range st.open {
				if !r.closed[id] {
					consider(at)
				}
			}
		}
	}
	r.low = low
	return fromMicro(low)
}

// applyRecords applies recs, in order, within tx, and keeps the node's
// open-since mark. marker is the id of the running process's recovery
// marker, the only one that recovers (see the merge rules).
func applyRecords(ctx context.Context, tx storeTx, node, marker string, recs []record, st *openSet) (*batchResult, error) {
	r := &batchResult{opened: make(map[string]int64), closed: make(map[string]bool)}
	for len(recs) > 0 {
		i := 0
		for i < len(recs) && (recs[i].kind != kindRecover || recs[i].e.RequestID != marker) {
			i++
		}
		if i > 0 {
			if err := mergeRun(ctx, tx, node, recs[:i], r); err != nil {
				return nil, err
			}
		}
		if i < len(recs) {
			// The reservations opened so far in this batch belong to the
			// dead run: the mark must cover them before recovery.
			if low := (&openSet{}).since(r); !low.IsZero() {
				if err := tx.mark(ctx, node, low, true); err != nil {
					return nil, err
				}
			}
			n, err := tx.recover(ctx, node, recs[i].e.RequestID, micro(recs[i].e.CreatedAt))
			if err != nil {
				return nil, err
			}
			r.recovered += n
			r.marker = true
			r.opened, r.closed = make(map[string]int64), make(map[string]bool)
			i++
		}
		recs = recs[i:]
	}
	if st.marker || r.marker {
		return r, tx.mark(ctx, node, st.since(r), false)
	}
	if low := st.since(r); !low.IsZero() {
		return r, tx.mark(ctx, node, low, true)
	}
	return r, nil
}

func mergeRun(ctx context.Context, tx storeTx, node string, recs []record, res *batchResult) error {
	ids := make([]string, 0, len(recs))
	seen := make(map[string]struct{}, len(recs))
	need := func(id string) {
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			ids = append(ids, id)
		}
	}
	for i := range recs {
		switch recs[i].kind {
		case kindRecover, kindTally, kindTick:
			continue // an earlier run's marker, or a tally's record: nothing to load
		case kindFold:
			// Its drops are not loaded: remove returns what it deletes.
			for j := range recs[i].fold.put {
				need(recs[i].fold.put[j].RequestID)
			}
			continue
		}
		need(recs[i].e.RequestID)
	}
	rows, err := tx.load(ctx, ids)
	if err != nil {
		return err
	}
	var dirty []string
	stored := make(map[string]bool) // of the dirty ids: whether the store holds the row
	// Changes per tenant, user, key and 15-minute bucket first; spread over
	// scopes and grains once per distinct one at the end.
	type origin struct {
		tenant, user, key string
		quarter           int64
	}
	byOrigin := make(map[origin]spendDelta)
	count := func(e *Entry, cost, created int64) {
		o := origin{e.Tenant, e.User, e.KeyID, e.CreatedAt.Truncate(bucketSize).UnixMicro()}
		d := byOrigin[o]
		d.cost = addSat(d.cost, cost)
		d.entries += created
		byOrigin[o] = d
	}
	// touch notes the first change of id in this batch: cur is still the
	// row load found.
	touch := func(id string, cur *Entry) {
		if _, ok := stored[id]; !ok {
			stored[id] = cur != nil
			dirty = append(dirty, id)
		}
	}
	// unseen are the ids a fold deletes that no record of the batch
	// names: deleted as they are in the store, counted by what remove
	// returns.
	var unseen []string
	var apply func(r *record)
	apply = func(r *record) {
		switch r.kind {
		case kindTally, kindTick:
			return // a tick writes the tallies' entries (see tally.go)
		case kindFold:
			// The entries it names go, those it puts come, as
			// settlements (a replay of the spool inserts the named ones
			// again first, from their records before it, and deletes
			// them again here).
			for _, id := range r.fold.drop {
				cur, seen := rows[id]
				if !seen {
					unseen = append(unseen, id)
					continue
				}
				if cur != nil {
					touch(id, cur)
					rows[id] = nil
					count(cur, -int64(cur.Charge()), -1)
				}
			}
			for j := range r.fold.put {
				apply(&record{kind: kindSettle, e: r.fold.put[j]})
			}
			return
		}
		cur := rows[r.e.RequestID]
		next, delta := merge(cur, r)
		if next == nil {
			if r.kind == kindReserve && cur != nil && cur.Status == StatusReserved {
				// Already in the store (a retry of a batch whose commit
				// was not acknowledged): still open.
				res.opened[cur.RequestID] = cur.CreatedAt.UnixMicro()
			}
			return
		}
		rows[r.e.RequestID] = next
		switch {
		case cur == nil && next.Status == StatusReserved:
			res.opened[next.RequestID] = next.CreatedAt.UnixMicro()
		case cur != nil && (cur.Status == StatusReserved || cur.Status == StatusRecovered) && next.Status.Final():
			// A settlement of an entry another process recovered
			// (RecoverNode) closes it in this run's set too.
			if _, ok := res.opened[next.RequestID]; ok {
				delete(res.opened, next.RequestID)
			} else {
				res.closed[next.RequestID] = true
			}
		}
		touch(next.RequestID, cur)
		var created int64
		if cur == nil {
			created = 1
		}
		if delta != 0 || created != 0 {
			count(next, delta, created)
		}
	}
	for i := range recs {
		apply(&recs[i])
	}
	if len(unseen) > 0 {
		gone, err := tx.remove(ctx, unseen)
		if err != nil {
			return err
		}
		for i := range gone {
			count(&gone[i], -int64(gone[i].Charge()), -1)
		}
	}
	if len(dirty) == 0 && len(byOrigin) == 0 {
		return nil
	}
	var inserts, updates []*Entry
	var deletes []string
	for _, id := range dirty {
		switch {
		case rows[id] == nil && stored[id]:
			deletes = append(deletes, id)
		case rows[id] == nil: // inserted and deleted in this batch
		case stored[id]:
			updates = append(updates, rows[id])
		default:
			inserts = append(inserts, rows[id])
		}
	}
	deltas := make(map[spendKey]spendDelta)
	for o, d := range byOrigin {
		addSpend(deltas, o.tenant, o.user, o.key, time.UnixMicro(o.quarter).UTC(), d)
	}
	for k, v := range deltas {
		if v == (spendDelta{}) {
			delete(deltas, k)
		}
	}
	if len(deletes) > 0 {
		if _, err := tx.remove(ctx, deletes); err != nil {
			return err
		}
	}
	return tx.write(ctx, node, inserts, updates, deltas)
}

// merge applies r to the current row cur (nil when there is none). It returns
// the new row, or nil when r changes nothing, and the change of its charge.
// It bounds r's costs by MaxCost, as Reserve and Settle do, whatever wrote
// the spool.
func merge(cur *Entry, r *record) (*Entry, int64) {
	switch r.kind {
	case kindReserve:
		if cur != nil {
			return nil, 0
		}
		e := r.e
		e.Status = StatusReserved
		e.Actual, e.ActualCost, e.SettledAt = costmodel.Usage{}, 0, time.Time{}
		e.EstimatedCost = boundCost(e.EstimatedCost)
		return &e, int64(e.Charge())
	case kindSettle:
		if cur == nil {
			e := r.e
			e.EstimatedCost, e.ActualCost = boundCost(e.EstimatedCost), boundCost(e.ActualCost)
			return &e, int64(e.Charge())
		}
		if cur.Status != StatusReserved && cur.Status != StatusRecovered {
			return nil, 0
		}
		old := cur.Charge()
		e := *cur
		e.Status, e.HTTPStatus = r.e.Status, r.e.HTTPStatus
		e.Actual, e.ActualCost, e.SettledAt = r.e.Actual, boundCost(r.e.ActualCost), r.e.SettledAt
		// A settlement that names a model or a route names what the
		// limiter keyed it by with it (see Entry.KeyModel).
		if r.e.Model != "" {
			e.KeyModel = r.e.KeyModel
		}
		if r.e.Route != "" {
			e.KeyRoute = r.e.KeyRoute
		}
		for _, f := range [...]struct {
			dst *string
			src string
		}{
			{&e.Route, r.e.Route}, {&e.Upstream, r.e.Upstream}, {&e.Model, r.e.Model},
			{&e.Region, r.e.Region}, {&e.Decision, r.e.Decision}, {&e.Policy, r.e.Policy},
			{&e.Friction, r.e.Friction},
		} {
			if f.src != "" {
				*f.dst = f.src
			}
		}
		return &e, int64(e.Charge() - old)
	case kindExtend:
		if cur == nil || (cur.Status != StatusReserved && cur.Status != StatusRecovered) ||
			boundCost(r.e.EstimatedCost) <= cur.EstimatedCost {
			return nil, 0
		}
		old := cur.Charge()
		e := *cur
		e.Estimated, e.EstimatedCost = r.e.Estimated, boundCost(r.e.EstimatedCost)
		if e.Status == StatusRecovered {
			// Recovered while its process still ran (RecoverNode): it is
			// charged at its estimate, which this raises.
			e.Actual, e.ActualCost = e.Estimated, e.EstimatedCost
		}
		return &e, int64(e.Charge() - old)
	}
	return nil, 0
}
