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
//   - a recovery marker finalizes at their estimate the node's entries still
//     reserved when it is applied, which is after every record the dead run
//     wrote, since records are applied in spool order.

import (
	"context"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// bucketSize is the granularity of the spend roll-up. Every time zone in use
// today is offset from UTC by a multiple of 15 minutes, so day and month
// boundaries in any of them fall on bucket boundaries.
const bucketSize = 15 * time.Minute

func bucketOf(t time.Time) time.Time {
	return t.Truncate(bucketSize).UTC()
}

type spendKey struct {
	tenant, user, key string
	bucket            int64 // Unix microseconds of the bucket start
}

// storeTx is one transaction on a store.
type storeTx interface {
	// load returns the stored entries among ids.
	load(ctx context.Context, ids []string) (map[string]*Entry, error)
	// write inserts the rows that load did not find, updates those it found
	// (every column but the key and those a settlement never changes), and
	// adds deltas to the spend roll-up.
	write(ctx context.Context, node string, inserts, updates []*Entry, deltas map[spendKey]int64) error
	// recover finalizes at their estimate the node's entries that are
	// reserved and created at or after the node's open-since mark.
	recover(ctx context.Context, node string, at time.Time) (int64, error)
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
}

// batchResult is what a batch changes in an openSet, applied once the batch
// has committed.
type batchResult struct {
	recovered int64
	marker    bool             // the batch holds a recovery marker
	opened    map[string]int64 // reservations opened after the last marker
	closed    map[string]bool  // reservations closed after the last marker
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
}

// since returns the earliest CreatedAt of the set as changed by r (zero when
// none); with r.marker it ignores what the set held before.
func (st *openSet) since(r *batchResult) time.Time {
	low := int64(0)
	consider := func(id string, at int64) {
		if !r.closed[id] && (low == 0 || at < low) {
			low = at
		}
	}
	if !r.marker {
		for id, at := range st.open {
			consider(id, at)
		}
	}
	for id, at := range r.opened {
		consider(id, at)
	}
	return fromMicro(low)
}

// applyRecords applies recs, in order, within tx, and keeps the node's
// open-since mark.
func applyRecords(ctx context.Context, tx storeTx, node string, recs []record, st *openSet) (*batchResult, error) {
	r := &batchResult{opened: make(map[string]int64), closed: make(map[string]bool)}
	for len(recs) > 0 {
		i := 0
		for i < len(recs) && recs[i].kind != kindRecover {
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
			n, err := tx.recover(ctx, node, micro(recs[i].e.CreatedAt))
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
	for i := range recs {
		id := recs[i].e.RequestID
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			ids = append(ids, id)
		}
	}
	rows, err := tx.load(ctx, ids)
	if err != nil {
		return err
	}
	stored := make(map[string]bool, len(rows))
	for id := range rows {
		stored[id] = true
	}
	var dirty []string
	isDirty := make(map[string]bool)
	deltas := make(map[spendKey]int64)
	for i := range recs {
		r := &recs[i]
		cur := rows[r.e.RequestID]
		next, delta := merge(cur, r)
		if next == nil {
			if r.kind == kindReserve && cur != nil && cur.Status == StatusReserved {
				// Already in the store (a retry of a batch whose commit
				// was not acknowledged): still open.
				res.opened[cur.RequestID] = cur.CreatedAt.UnixMicro()
			}
			continue
		}
		rows[r.e.RequestID] = next
		switch {
		case cur == nil && next.Status == StatusReserved:
			res.opened[next.RequestID] = next.CreatedAt.UnixMicro()
		case cur != nil && cur.Status == StatusReserved && next.Status.Final():
			if _, ok := res.opened[next.RequestID]; ok {
				delete(res.opened, next.RequestID)
			} else {
				res.closed[next.RequestID] = true
			}
		}
		if !isDirty[next.RequestID] {
			isDirty[next.RequestID] = true
			dirty = append(dirty, next.RequestID)
		}
		if delta != 0 {
			deltas[spendKey{next.Tenant, next.User, next.KeyID, bucketOf(next.CreatedAt).UnixMicro()}] += delta
		}
	}
	if len(dirty) == 0 {
		return nil
	}
	var inserts, updates []*Entry
	for _, id := range dirty {
		if stored[id] {
			updates = append(updates, rows[id])
		} else {
			inserts = append(inserts, rows[id])
		}
	}
	for k, v := range deltas {
		if v == 0 {
			delete(deltas, k)
		}
	}
	return tx.write(ctx, node, inserts, updates, deltas)
}

// merge applies r to the current row cur (nil when there is none). It returns
// the new row, or nil when r changes nothing, and the change of its charge.
func merge(cur *Entry, r *record) (*Entry, int64) {
	switch r.kind {
	case kindReserve:
		if cur != nil {
			return nil, 0
		}
		e := r.e
		e.Status = StatusReserved
		e.Actual, e.ActualCost, e.SettledAt = costmodel.Usage{}, 0, time.Time{}
		return &e, int64(e.Charge())
	case kindSettle:
		if cur == nil {
			e := r.e
			return &e, int64(e.Charge())
		}
		if cur.Status != StatusReserved && cur.Status != StatusRecovered {
			return nil, 0
		}
		old := cur.Charge()
		e := *cur
		e.Status, e.HTTPStatus = r.e.Status, r.e.HTTPStatus
		e.Actual, e.ActualCost, e.SettledAt = r.e.Actual, r.e.ActualCost, r.e.SettledAt
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
	}
	return nil, 0
}
