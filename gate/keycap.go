package gate

// A limit keyed by a value the caller chooses (an attribute, a client
// address, a model the price table does not know, a user only the rate
// limit service names, a rate limit service descriptor's value) has one
// counter in the store per value: a tenant that sends a new value with
// each request makes a new key each time. Redis under maxmemory with
// noeviction then refuses every write, and every other tenant's limits
// fail open (admitting past them, a fresh fallback burst per outage) or
// closed (refusing them all); the in-memory store grows the process.
// keyCap counts, per tenant, the counters of such values this replica
// let it make, each until it may have expired in the store (its limit's
// weighted.Limit.KeyLife after its last write), and a request that would
// make one past store.max_keys_per_tenant is refused before the store is
// called: only the tenant that makes them pays.

import (
	"fmt"
	"hash/maphash"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// maxKeyEntries bounds the counters a keyCap holds, every tenant's
// together (about 24 bytes each): past it, a new counter is refused to
// any tenant until some expire. One tenant holds at most
// store.max_keys_per_tenant of them, and the tenants named by a front
// door's word alone (see Caller.named), half of them all together: a
// client that names tenants at will (a rate limit service descriptor's
// value) makes as many tenants as it likes, and filled the bound with 512
// names, after which a configured tenant was refused every new counter
// (TestKeyCapAtkNamedTenantsFillTheReplica).
const maxKeyEntries = 1 << 21

// keyShards is how many locks the tenants' counters are spread over.
const keyShards = 16

// keyCap holds, per tenant, the counters of values the tenant chose that
// this replica let it write to the store, each with the time after which
// the store may have dropped it. Its zero value is not ready: use
// newKeyCap. It is safe for concurrent use.
type keyCap struct {
	seed maphash.Seed
	max  int64        // the most counters held, every tenant's: maxKeyEntries
	n    atomic.Int64 // counters held, every tenant's
	// named counts the counters held by tenants named by a front door's
	// word alone, at most max/2.
	named  atomic.Int64
	shards [keyShards]keyShard
}

type keyShard struct {
	mu      sync.Mutex
	tenants map[string]*tenantKeys
	_       [40]byte // keeps neighbouring shards' locks off one cache line
}

// tenantKeys are one tenant's counters.
type tenantKeys struct {
	exp  map[uint64]int64 // counter (see keyCap.id) -> when the store may have dropped it, Unix ns
	next int64            // no counter expires before, Unix ns: a sweep before finds nothing
	// named: the tenant was named by a front door's word alone when it
	// last made or wrote a counter; its counters count in keyCap.named.
	named bool
}

func newKeyCap() *keyCap {
	k := &keyCap{seed: maphash.MakeSeed(), max: maxKeyEntries}
	for i := range k.shards {
		k.shards[i].tenants = map[string]*tenantKeys{}
	}
	return k
}

// id names item's counter: its limit's name, algorithm and calendar, and
// its key, as the stores tell counters apart.
func (k *keyCap) id(it *weighted.Item) uint64 {
	var h maphash.Hash
	h.SetSeed(k.seed)
	h.WriteString(it.Limit.Name)
	h.WriteByte(0)
	h.WriteByte(byte(it.Limit.Algorithm))
	h.WriteByte(byte(it.Limit.Calendar))
	h.WriteString(it.Key)
	return h.Sum64()
}

func (k *keyCap) shard(tenant string) *keyShard {
	return &k.shards[maphash.String(k.seed, tenant)%keyShards]
}

// admit makes room among tenant's counters, at most max, for ids, the
// counters a request writes, each held until the matching exps (Unix ns)
// at least: those held already are held longer, and the others are added
// when they all fit, under the bounds of every tenant's counters together
// (k.max) and, for a tenant named by a front door's word alone (named),
// of those tenants' together (k.max/2). When they do not, it adds nothing
// and returns false, when the tenant's first counter may expire (Unix ns),
// and whether the tenant's own max was the bound.
func (k *keyCap) admit(tenant string, named bool, ids []uint64, exps []int64, max int, now int64) (ok bool, next int64, own bool) {
	sh := k.shard(tenant)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	tk := sh.tenants[tenant]
	if tk != nil {
		k.setNamed(tk, named)
	}
	fresh := func() int {
		n := 0
		for _, id := range ids {
			if tk == nil || tk.exp[id] <= now {
				n++
			}
		}
		return n
	}
	add := fresh()
	if tk != nil && add > 0 && len(tk.exp)+add > max && tk.next <= now {
		k.sweep(tk, now)
		add = fresh()
	}
	held := 0
	if tk != nil {
		held = len(tk.exp)
	}
	own = held+add > max
	if own || add > 0 && (k.n.Load()+int64(add) > k.max || named && k.named.Load()+int64(add) > k.max/2) {
		next := now + int64(time.Second)
		if tk != nil && tk.next > now {
			next = tk.next
		}
		return false, next, own
	}
	if tk == nil {
		tk = &tenantKeys{exp: make(map[uint64]int64, len(ids)), named: named}
		sh.tenants[tenant] = tk
	}
	k.hold(tk, ids, exps)
	return true, 0, false
}

// setNamed moves tk's counters in or out of k.named as the tenant is named
// by a front door's word alone or not. The caller holds the shard's lock.
func (k *keyCap) setNamed(tk *tenantKeys, named bool) {
	if tk.named == named {
		return
	}
	tk.named = named
	if named {
		k.named.Add(int64(len(tk.exp)))
	} else {
		k.named.Add(-int64(len(tk.exp)))
	}
}

// refresh holds tenant's counters ids until exps at least, whatever their
// number: a settlement or a renewal writes them again, which keeps them
// in the store (the request that made them was admitted).
func (k *keyCap) refresh(tenant string, named bool, ids []uint64, exps []int64) {
	sh := k.shard(tenant)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	tk := sh.tenants[tenant]
	if tk == nil {
		tk = &tenantKeys{exp: make(map[uint64]int64, len(ids)), named: named}
		sh.tenants[tenant] = tk
	}
	k.setNamed(tk, named)
	k.hold(tk, ids, exps)
}

// hold holds tk's counters ids until exps at least. The caller holds the
// shard's lock.
func (k *keyCap) hold(tk *tenantKeys, ids []uint64, exps []int64) {
	for i, id := range ids {
		old, ok := tk.exp[id]
		if !ok {
			k.n.Add(1)
			if tk.named {
				k.named.Add(1)
			}
		}
		if exps[i] > old {
			tk.exp[id] = exps[i]
		}
		if tk.next == 0 || exps[i] < tk.next {
			tk.next = exps[i]
		}
	}
}

// sweep drops tk's counters expired at now and sets tk.next. The caller
// holds the shard's lock.
func (k *keyCap) sweep(tk *tenantKeys, now int64) {
	next := int64(0)
	for id, exp := range tk.exp {
		if exp <= now {
			delete(tk.exp, id)
			k.n.Add(-1)
			if tk.named {
				k.named.Add(-1)
			}
		} else if next == 0 || exp < next {
			next = exp
		}
	}
	tk.next = next
}

// expire drops the counters expired at now, and the tenants left with
// none, so that tenants named once (the rate limit service's are any
// string) are not held forever.
func (k *keyCap) expire(now time.Time) {
	t := now.UnixNano()
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		for tenant, tk := range sh.tenants {
			if tk.next > t {
				continue
			}
			k.sweep(tk, t)
			if len(tk.exp) == 0 {
				delete(sh.tenants, tenant)
			}
		}
		sh.mu.Unlock()
	}
}

// held is how many counters tenant holds at now.
func (k *keyCap) held(tenant string, now time.Time) int {
	sh := k.shard(tenant)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := 0
	if tk := sh.tenants[tenant]; tk != nil {
		for _, exp := range tk.exp {
			if exp > now.UnixNano() {
				n++
			}
		}
	}
	return n
}

// chosen tells whether the value of l's key for r is one the caller
// chooses without bound (see keyCap): a key of an attribute or a client
// address, of a model the price table does not know, of a user or key
// that a front door names (Trusted: the rate limit service's, any
// string), and a front door's extra limit (a rate limit service
// descriptor, whose values a wildcard node takes from the request). A
// control-plane level's fixed key, and keys of the tenant, a route, an
// upstream, a region, a known model or a configured caller, are not:
// the configuration bounds them.
func (l *compiledLimit) chosen(r *Reservation) bool {
	switch {
	case l.fixedKey != "":
		return false
	case l.extra > 0, len(l.attrs) > 0, l.byIP:
		return true
	case l.byCaller && r.req.Caller.trusted:
		return true
	case l.byModel && l.model != "":
		_, known := r.st.est.Price(l.model)
		return !known
	case l.byModel:
		_, known := r.st.est.Price(r.req.Estimate.Model)
		return !known
	}
	return false
}

// chosenItems appends to ids and exps the counter and the hold (Unix ns)
// of each of r's items whose value the caller chose, and to idx its
// index, and returns the time the holds count from. It reads the clock
// only when there is such an item: most requests have none.
func (r *Reservation) chosenItems(ids []uint64, exps []int64, idx []int) ([]uint64, []int64, []int, int64) {
	if len(r.limits) != len(r.items) {
		return ids, exps, idx, 0
	}
	for i, l := range r.limits {
		if !l.chosen(r) {
			continue
		}
		it := &r.items[i]
		ids = append(ids, r.g.keys.id(it))
		exps = append(exps, int64(it.Limit.KeyLife()))
		idx = append(idx, i)
	}
	if len(ids) == 0 {
		return ids, exps, idx, 0
	}
	now := time.Now().UnixNano()
	for i := range exps {
		exps[i] += now
	}
	return ids, exps, idx, now
}

// capKeys makes room among the tenant's counters for those of r's items
// whose values it chose, before the store writes them (see keyCap). When
// they do not fit under store.max_keys_per_tenant, it refuses r (429 whose
// code is the first such limit's name, as any limit's refusal is, and
// whose policy is store.max_keys_per_tenant) and writes nothing;
// usage already served (Request.Served), which is counted whatever its
// limits say, and shadow limits, which never refuse, lose those items
// instead: their counters are not made.
func (r *Reservation) capKeys() (Decision, bool) {
	if r.g.keys == nil {
		return Decision{}, false
	}
	var idsBuf [4]uint64
	var expsBuf [4]int64
	var idxBuf [4]int
	ids, exps, idx, now := r.chosenItems(idsBuf[:0], expsBuf[:0], idxBuf[:0])
	if len(ids) == 0 {
		return Decision{}, false
	}
	max := r.st.cfg.Store.MaxKeysPerTenant
	ok, next, own := r.g.keys.admit(r.req.Caller.Tenant, r.req.Caller.named(), ids, exps, max, now)
	if ok {
		return Decision{}, false
	}
	refuse := -1
	for _, i := range idx {
		if !r.req.Served && !r.limits[i].shadow {
			refuse = i
			break
		}
	}
	if refuse < 0 {
		r.dropItems(idx)
		return Decision{}, false
	}
	l := r.limits[refuse]
	retry := retryAfterSeconds(time.Duration(next - now))
	r.outcome, r.answer, r.blocked = telemetry.OutcomeHard, http.StatusTooManyRequests, l
	r.items = r.items[:0]
	held := fmt.Sprintf("this tenant holds %d counters of values it chose (attributes, client addresses, unknown models, users or descriptor values), the most store.max_keys_per_tenant allows", max)
	if !own {
		held = "this replica holds the most counters of values callers chose (attributes, client addresses, unknown models, users or descriptor values) that it holds, every tenant's together"
	}
	d := refusal(telemetry.OutcomeHard, http.StatusTooManyRequests, Error{
		Type: "rate_limit_exceeded", Code: l.limit.Name, Policy: keyCapPolicy,
		Message: fmt.Sprintf("limit %q: %s; a request with a new %s is refused until one expires, in %d s",
			l.limit.Name, held, l.dimension, retry),
		RetryAfterMS: (time.Duration(next-now) + time.Millisecond - 1).Milliseconds(),
	})
	d.RetryAfter = retry
	return d, true
}

// keyCapPolicy is the policy of a refusal by the key cap (capKeys): its
// code is the limit's name, as CONTRACT.md has it for every limit's
// refusal, and its policy says which rule refused.
const keyCapPolicy = "store.max_keys_per_tenant"

// dropItems removes r's items (and their limits) at the indexes idx, in
// increasing order.
func (r *Reservation) dropItems(idx []int) {
	limits, items := r.limits[:0], r.items[:0]
	j := 0
	for i := range r.limits {
		if j < len(idx) && idx[j] == i {
			j++
			continue
		}
		limits = append(limits, r.limits[i])
		items = append(items, r.items[i])
	}
	r.limits, r.items = limits, items
}

// refreshKeys holds the counters of r's items whose values the tenant
// chose one KeyLife from now, as a settlement or a renewal writes them.
func (r *Reservation) refreshKeys() {
	if r.g.keys == nil {
		return
	}
	var idsBuf [4]uint64
	var expsBuf [4]int64
	var idxBuf [4]int
	ids, exps, _, _ := r.chosenItems(idsBuf[:0], expsBuf[:0], idxBuf[:0])
	if len(ids) > 0 {
		r.g.keys.refresh(r.req.Caller.Tenant, r.req.Caller.named(), ids, exps)
	}
}

// named tells whether c's tenant is a front door's word alone (Trusted):
// one the configuration and the control plane do not know, which a client
// of that front door may name at will. The empty tenant (a rate limit
// service's descriptors that name none, the deployment's own) is not.
func (c *Caller) named() bool {
	if !c.trusted || c.controlPlan || c.Tenant == "" {
		return false
	}
	_, ok := c.st.tenants[c.Tenant]
	return !ok
}
