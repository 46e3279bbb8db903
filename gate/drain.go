package gate

import (
	"context"
	"hash/maphash"
	"sync/atomic"
	"time"
)

// A reload that moves budgets (see budgetsMoved) gives them new counters,
// restored from the ledger before their first debit. Requests decided on
// the old state meanwhile debit the old counters, and the ledger learns
// of them only when their entries are written: a restore that read it
// before would forget them, and the new counters would admit them again.
// So the old state counts its reservations, per tenant, until their
// entries are written (track, untrack), a tenant's restore waits for its
// count to drain (drain), and a request identified on a replaced state
// before the reload is decided on the active one (rebind).

// drainWait bounds how long the restores after a reload wait for the
// requests decided on replaced states, from the reload on: a request that
// holds its reservation unrecorded longer (a friction delay) is not
// waited for, and its spend is counted by the next reconciliation.
const drainWait = 2 * time.Second

// inflight counts reservations without their ledger entries, in stripes
// that tenants hash to, so that a tenant's restore waits for its own
// requests (and those of the few tenants that share its stripe) only. A
// fixed array: no allocation or map lookup per request, and no growth
// with the tenant names a caller may invent (the rate limit service takes
// them from Envoy). It is safe for concurrent use.
type inflight [inflightStripes]atomic.Int64

const inflightStripes = 64

var inflightSeed = maphash.MakeSeed()

// of is the count of tenant's stripe.
func (n *inflight) of(tenant string) *atomic.Int64 {
	return &n[maphash.String(inflightSeed, tenant)%inflightStripes]
}

// total is every stripe's count.
func (n *inflight) total() (t int64) {
	for i := range n {
		t += n[i].Load()
	}
	return t
}

// replaced tells that a reload that moved budgets replaced st (or a state
// st shares its counters with).
func (g *Gate) replaced(st *state) bool {
	return st.moveGen != g.state.Load().moveGen
}

// track counts r in the in-flight reservations of its caller's state,
// after moving the caller to the active state when a reload that moved
// budgets replaced its own.
func (r *Reservation) track() {
	for {
		st := r.req.Caller.st
		if !r.g.replaced(st) {
			n := st.counts.of(r.req.Caller.Tenant)
			n.Add(1)
			if !r.g.replaced(st) {
				r.st, r.inflight = st, n
				r.tracked.Store(true)
				return
			}
			n.Add(-1) // replaced meanwhile: its drain may have begun
		}
		r.req.Caller = r.g.rebind(r.req.Caller)
		r.st = r.req.Caller.st
	}
}

// untrack ends what track counted: r's ledger entry is written, or r
// ended without one. Only the first call counts.
func (r *Reservation) untrack() {
	if r.tracked.CompareAndSwap(true, false) {
		r.inflight.Add(-1)
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

// drain waits, until the bound the reload set (see drainWait) and while
// ctx lasts, until the states st replaced by moving budgets hold no
// reservation of tenant without its ledger entry ("" for every tenant);
// once they hold none of any tenant, they are forgotten. It reports
// whether it waited: the entries it waited for may not be in the ledger's
// store yet.
func (g *Gate) drain(ctx context.Context, st *state, tenant string) (waited bool) {
	p := st.prev.Load()
	if p == nil {
		return false
	}
	end := time.Unix(0, st.drainBy.Load())
	count := func(s *state) int64 {
		if tenant == "" {
			return s.counts.total()
		}
		return s.counts.of(tenant).Load()
	}
	for s := p; s != nil; s = s.prev.Load() {
		for count(s) > 0 {
			if time.Now().After(end) {
				g.log.Warn("a reload's restore did not wait for every request decided on the replaced configuration", "tenant", tenant, "in_flight", count(s))
				st.prev.CompareAndSwap(p, nil)
				return true
			}
			waited = true
			if sleepCtx(ctx, time.Millisecond) != nil {
				return true
			}
		}
	}
	if tenant == "" {
		st.prev.CompareAndSwap(p, nil)
	}
	return waited
}
