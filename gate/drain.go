package gate

import (
	"context"
	"time"
)

// A reload that moves budgets (see budgetsMoved) gives them new counters,
// restored from the ledger before their first debit. Requests decided on
// the old state meanwhile debit the old counters, and the ledger learns
// of them only when their entries are written: a restore that read it
// before would forget them, and the new counters would admit them again.
// So the old state counts its reservations until their entries are
// written (track, untrack), the restore waits for the count to drain
// (drain), and a request identified on a replaced state before the
// reload is decided on the active one (rebind).

// drainWait bounds how long a restore waits for the requests decided on
// replaced states: a request that holds its reservation unrecorded longer
// (a friction delay) is not waited for, and its spend is counted by the
// next reconciliation.
const drainWait = 2 * time.Second

// track counts r in the in-flight reservations of its caller's state,
// after moving the caller to the active state when a reload that moved
// budgets replaced its own.
func (r *Reservation) track() {
	for {
		st := r.req.Caller.st
		if !st.superseded.Load() {
			st.inflight.Add(1)
			if !st.superseded.Load() {
				r.st = st
				r.tracked.Store(true)
				return
			}
			st.inflight.Add(-1) // replaced meanwhile: its drain may have begun
		}
		r.req.Caller = r.g.rebind(r.req.Caller)
		r.st = r.req.Caller.st
	}
}

// untrack ends what track counted: r's ledger entry is written, or r
// ended without one. Only the first call counts.
func (r *Reservation) untrack() {
	if r.tracked.CompareAndSwap(true, false) {
		r.st.inflight.Add(-1)
	}
}

// rebind is caller c on the active state: the plan the active
// configuration gives its tenant, when it lists the tenant.
func (g *Gate) rebind(c *Caller) *Caller {
	st := g.state.Load()
	if c.st == st {
		return c
	}
	n := *c
	n.st = st
	if p, ok := st.tenants[c.Tenant]; ok {
		n.Plan = p
	}
	return &n
}

// drain waits, for at most drainWait and while ctx lasts, until the
// states st replaced by moving budgets hold no reservation without its
// ledger entry; then they are forgotten.
func (g *Gate) drain(ctx context.Context, st *state) {
	p := st.prev.Load()
	if p == nil {
		return
	}
	end := time.Now().Add(drainWait)
	for s := p; s != nil; s = s.prev.Load() {
		for s.inflight.Load() > 0 {
			if time.Now().After(end) {
				g.log.Warn("a reload's restore did not wait for every request decided on the replaced configuration", "in_flight", s.inflight.Load())
				st.prev.CompareAndSwap(p, nil)
				return
			}
			if sleepCtx(ctx, time.Millisecond) != nil {
				return
			}
		}
	}
	st.prev.CompareAndSwap(p, nil)
}
