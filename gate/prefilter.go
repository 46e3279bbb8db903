package gate

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/weighted"
)

// prefilter remembers the request-count limits known to be spent, so that a
// caller whose requests are refused costs little: its next requests are
// refused before their bodies are read and estimated, with the same 429
// and the same Retry-After as the store would answer.
//
// Only limits whose cost does not depend on the request are remembered:
// unit requests, enforced, not concurrency (a release frees a slot at any
// time), not keyed by model (the model is in the body). Such a limit's
// denial says exactly when one unit is free again; until then every
// request of that key is refused. A reservation cancelled meanwhile (a
// policy's refusal, a ledger failure) can free a unit earlier than that:
// the prefilter then refuses for at most the Retry-After it announced.
// A leased limit's denial is remembered for at most its lease TTL, with
// the store's Retry-After: a replica that died holding leases of the key
// has them given back by the store within a TTL; and it refuses nothing
// while this replica's own leases of the key hold any of its units (the
// leases then decide). A denial is of a cost (a request may count for
// several requests, or none): it refuses requests of that cost (of that
// cost or more on a fixed window, see spent.refuses), never smaller ones,
// which the store may admit.
// The table is per configuration (a reload starts it anew), holds the
// configuration's own limits only (not a request's extra limits nor the
// control plane's, whatever their names), and is bounded by maxRefusals
// keys; it is safe for concurrent use.
type prefilter struct {
	n     atomic.Int64 // entries in m, expired ones included
	m     sync.Map     // refusalKey -> *spent
	sweep sync.Mutex   // one sweeper at a time
	swept atomic.Int64 // when the last sweep of a full table ran, Unix ns
	// tenants counts each tenant's entries in m (tenant -> *atomic.Int64),
	// at most maxRefusalsPerTenant.
	tenants sync.Map
}

// refusalKey is a configured limit and one of its keys.
type refusalKey struct {
	l   *compiledLimit
	key string
}

type spent struct {
	tenant string    // whose entry it is, counted in prefilter.tenants
	until  time.Time // when the limit frees for cost, as the store said
	check  time.Time // when to ask the store again: until, or sooner
	cost   int64     // the cost refused: smaller ones go to the store
}

// refuses tells whether s refuses a request of cost requests of l, with
// s.until as its Retry-After: one of the cost denied, or of more on a
// fixed window, whose denial lasts until the window ends whatever the
// cost. On the other algorithms a larger cost frees later than the one
// denied: the store answers it, with its own Retry-After.
func (s *spent) refuses(l *compiledLimit, requests int64) bool {
	return requests == s.cost || requests > s.cost && l.limit.Algorithm == weighted.FixedWindow
}

// maxRefusals bounds the keys the prefilter remembers, and
// maxRefusalsPerTenant those of one tenant, so that one tenant's keys do
// not crowd the others' out.
const (
	maxRefusals          = 1 << 16
	maxRefusalsPerTenant = maxRefusals / 16
)

// sweepFullEvery is how often a full prefilter is swept at most: a sweep
// walks every entry, which each denial must not pay.
const sweepFullEvery = time.Second

// count is tenant's count of entries, made at its first: a tenant counted
// already costs a lookup, no allocation.
func (r *prefilter) count(tenant string) *atomic.Int64 {
	if c, ok := r.tenants.Load(tenant); ok {
		return c.(*atomic.Int64)
	}
	c, _ := r.tenants.LoadOrStore(tenant, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// prefiltered tells whether l's denials can be remembered.
func (l *compiledLimit) prefiltered() bool {
	if l.unit != "requests" || l.shadow || l.budget || l.limit.Algorithm == weighted.Concurrency {
		return false
	}
	for _, d := range l.dims {
		if d == "model" {
			return false
		}
	}
	return true
}

// add remembers that l is spent for key, for costs of cost or more, until
// until, and no longer than check. An entry of a smaller cost still
// current is kept: it refuses more requests.
func (r *prefilter) add(tenant string, l *compiledLimit, key string, cost int64, until, check, now time.Time) {
	if cost <= 0 {
		return // a cost of nothing is never refused
	}
	k := refusalKey{l: l, key: key}
	if until.Before(check) {
		check = until
	}
	if old, ok := r.m.Load(k); ok {
		o := old.(*spent)
		if !o.check.After(now) || cost < o.cost || cost == o.cost && o.check.Before(check) {
			r.m.Store(k, &spent{tenant: o.tenant, until: until, check: check, cost: cost})
		}
		return
	}
	c := r.count(tenant)
	if (r.n.Load() >= maxRefusals || c.Load() >= maxRefusalsPerTenant) && !r.expire(now) {
		return
	}
	if c.Load() >= maxRefusalsPerTenant {
		return
	}
	if _, loaded := r.m.LoadOrStore(k, &spent{tenant: tenant, until: until, check: check, cost: cost}); !loaded {
		r.n.Add(1)
		c.Add(1)
	}
}

// expire drops the entries that have run out and tells whether there is
// room again.
func (r *prefilter) expire(now time.Time) bool {
	if last := r.swept.Load(); last != 0 && now.Sub(time.Unix(0, last)) < sweepFullEvery {
		return r.n.Load() < maxRefusals
	}
	if !r.sweep.TryLock() {
		return false
	}
	defer r.sweep.Unlock()
	r.swept.Store(now.UnixNano())
	r.m.Range(func(k, v any) bool {
		if s := v.(*spent); !s.check.After(now) {
			r.m.Delete(k)
			r.n.Add(-1)
			if c, ok := r.tenants.Load(s.tenant); ok && c.(*atomic.Int64).Add(-1) <= 0 {
				// A tenant's counter goes with its last key, so that the
				// tenants counted stay those with keys (an RLS tenant is any
				// string Envoy sends). A key added meanwhile counts on a
				// new counter: the share is a soft bound, maxRefusals the
				// hard one.
				r.tenants.Delete(s.tenant)
			}
		}
		return true
	})
	return r.n.Load() < maxRefusals
}

// check returns the first limit of r's caller that is known to be spent,
// with its key and when it frees; l is nil when none is. It costs one
// atomic load while nothing is remembered.
func (p *prefilter) check(r *Reservation, now time.Time) (l *compiledLimit, key string, until time.Time) {
	if p.n.Load() == 0 {
		return nil, "", time.Time{}
	}
	requests := r.req.requests()
	if requests <= 0 {
		return nil, "", time.Time{}
	}
	for _, cl := range r.st.limits {
		if !cl.prefiltered() || !cl.appliesTo(r.req.Caller.Plan) || !cl.keyedFor(&r.req) {
			continue
		}
		k := cl.key(r)
		v, ok := p.m.Load(refusalKey{l: cl, key: k})
		if !ok {
			continue
		}
		if s := v.(*spent); s.check.After(now) && s.refuses(cl, requests) && !r.g.leaseHolds(cl, k) {
			return cl, k, s.until
		}
	}
	return nil, "", time.Time{}
}

// leaseHolds tells whether this replica holds units of l's key unspent
// in its leases: they are admitted from whatever the store last said of
// the key (a denial that reached Redis after a lease took what was left),
// and with them a request lacks less of the store than the one denied. The
// leases decide then, in process: they refuse only what they and the
// store together cannot cover.
func (g *Gate) leaseHolds(l *compiledLimit, key string) bool {
	return g.leases != nil && l.limit.Lease.On() &&
		g.leases.Unspent(weighted.Item{Limit: l.limit, Key: key}) > 0
}

// remember records a denial decided by a limit the prefilter can hold.
func (r *Reservation) remember() {
	if r.degraded {
		return // the local fallback's state is not the store's
	}
	i := r.result.Decider
	if i < 0 || i >= len(r.limits) || i >= len(r.items) || !r.limits[i].prefiltered() ||
		r.limits[i].extra != 0 || r.limits[i].level != nil || r.limits[i].model != "" {
		return
	}
	now := time.Now()
	until := now.Add(r.result.RetryAfter)
	check := until
	if p := r.limits[i].limit.Lease; p.On() {
		check = now.Add(p.Life())
	}
	r.st.prefilter.add(r.req.Caller.Tenant, r.limits[i], r.items[i].Key, r.items[i].Cost, until, check, now)
}

// Prefilter refuses, before its body is read and estimated, a request
// whose caller has a request-count limit known to be spent: the 429 the
// store would give, without asking it. ok is false when the request may
// go on. req needs its Caller, Route, Upstream and IP.
func (g *Gate) Prefilter(req *Request) (d Decision, refused bool) {
	if req.Caller.st.prefilter.n.Load() == 0 {
		return Decision{}, false // nothing remembered: the common case, free
	}
	now := time.Now()
	r := &Reservation{g: g, st: req.Caller.st, req: *req, ctx: context.Background()}
	l, key, until := r.st.prefilter.check(r, now)
	if l == nil {
		return Decision{}, false
	}
	wait := until.Sub(now)
	r.limits, r.items = append(r.limitsBuf[:0], l), append(r.itemsBuf[:0], weighted.Item{Limit: l.limit, Key: key, Cost: 1})
	r.result = weighted.Result{Decider: 0, RetryAfter: wait,
		Items: []weighted.ItemState{{Capacity: l.limit.Capacity(), RetryAfter: wait, ResetAfter: wait}}}
	d = r.deny()
	r.record(d.Status)
	return d, true
}
