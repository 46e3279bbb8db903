package control

// The directory is each replica's copy of the control plane, in memory:
// the key table the gate identifies callers by (no database call on the
// request path), and each entity's compiled level. An entity's level sits
// in a slot that its keys point to, so that a change to a tenant is one
// pointer swap, not a rebuild of its keys.

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/gate"
)

// node is one entity as the request path needs it.
type node struct {
	level   *gate.Level // nil when the entity carries no budget, limit or list
	active  bool
	expires time.Time // zero for never
	plan    string    // a tenant's plan
}

func (n *node) usable(now time.Time) bool {
	return n.active && (n.expires.IsZero() || now.Before(n.expires))
}

// slot holds an entity's current node; nil until the entity is known.
type slot struct{ p atomic.Pointer[node] }

// keyRec is one key: its node, where its user, team and tenant are, and
// the hashes of its secrets in the key table.
type keyRec struct {
	slot
	id, tenant, team, user string
	usr, tm, ten           *slot
	hashes                 [2][sha256.Size]byte // current and old; zero for none
}

// keyEntry is one secret's hash in the key table.
type keyEntry struct {
	*keyRec
	// until ends an old secret's grace period; zero for the current one.
	until time.Time
}

// Directory is the in-memory key table and levels. It is safe for
// concurrent use: Lookup takes a read lock on the key table only.
type Directory struct {
	mu       sync.RWMutex
	keys     map[[sha256.Size]byte]*keyEntry
	byKey    map[string]*keyRec   // by key id
	byTenant map[string][]*keyRec // every key of each tenant, revoked ones too

	slotMu sync.RWMutex
	slots  map[string]*slot  // the tenants', teams' and users', by kind/tenant/name
	names  map[string]string // one copy of each tenant, team and user name

	seq      atomic.Int64           // the version the directory holds
	head     atomic.Pointer[string] // the id of the entity written at seq (see Head)
	loadedAt atomic.Int64           // Unix nanoseconds of the last successful poll
	// altered is set by an Apply that changed an entity the directory
	// held (revoked, turned off, a budget lowered...), not only created
	// ones: the poll writes the snapshot at once (see Plane.saveSnapshot).
	altered  atomic.Bool
	expiryMu sync.Mutex
	expiring map[string]time.Time // key id -> expiry, for the expiry alerts

	// planMoved, when set, is called with a tenant whose plan an Apply
	// changes, before the new plan is served: the plan's budgets are
	// counters the tenant did not have (gate.Gate.MarkPlanMoved).
	planMoved func(tenant string)
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	return &Directory{
		keys:     map[[sha256.Size]byte]*keyEntry{},
		byKey:    map[string]*keyRec{},
		byTenant: map[string][]*keyRec{},
		slots:    map[string]*slot{},
		names:    map[string]string{},
		expiring: map[string]time.Time{},
	}
}

var (
	_ gate.TenantDirectory = (*Directory)(nil)
	_ gate.KeyLister       = (*Directory)(nil)
)

// slotKey is the key of slots of kind's tenant and name.
func slotKey(kind Kind, tenant, name string) string {
	return string(kind) + "\x00" + tenant + "\x00" + name
}

func (d *Directory) slot(kind Kind, tenant, name string) *slot {
	k := slotKey(kind, tenant, name)
	d.slotMu.Lock()
	defer d.slotMu.Unlock()
	s := d.slots[k]
	if s == nil {
		s = &slot{}
		d.slots[k] = s
	}
	return s
}

// Lookup implements gate.Directory: the key must be known and usable, and
// so must its user, team and tenant where it has them. A tenant the config
// file declares has no node: its principal is marked ConfigTenant, with no
// plan, and the gate takes both from the configuration.
func (d *Directory) Lookup(sum [sha256.Size]byte, now time.Time) (gate.Principal, bool) {
	d.mu.RLock()
	e := d.keys[sum]
	d.mu.RUnlock()
	if e == nil || (!e.until.IsZero() && !now.Before(e.until)) {
		return gate.Principal{}, false
	}
	p := gate.Principal{Tenant: e.tenant, Team: e.team, User: e.user, KeyID: e.id}
	kn := e.p.Load()
	if kn == nil || !kn.usable(now) {
		return gate.Principal{}, false
	}
	p.Levels[0] = kn.level
	if e.usr != nil {
		n := e.usr.p.Load()
		if n == nil || !n.usable(now) {
			return gate.Principal{}, false
		}
		p.Levels[1] = n.level
	}
	if e.tm != nil {
		n := e.tm.p.Load()
		if n == nil || !n.usable(now) {
			return gate.Principal{}, false
		}
		p.Levels[2] = n.level
	}
	n := e.ten.p.Load()
	if n == nil {
		p.ConfigTenant = true
		return p, true
	}
	if !n.usable(now) {
		return gate.Principal{}, false
	}
	p.Levels[3], p.Plan = n.level, n.plan
	return p, true
}

// HasTenant implements gate.TenantDirectory: whether the control plane
// holds a tenant named name (active or not).
func (d *Directory) HasTenant(name string) bool {
	_, _, known, _ := d.TenantPlan(name, time.Time{})
	return known
}

// TenantKeys implements gate.KeyLister: every key of tenant, revoked ones
// too.
func (d *Directory) TenantKeys(tenant string) []gate.Principal {
	d.mu.RLock()
	defer d.mu.RUnlock()
	keys := d.byTenant[tenant]
	out := make([]gate.Principal, 0, len(keys))
	for _, k := range keys {
		out = append(out, gate.Principal{Tenant: k.tenant, Team: k.team, User: k.user, KeyID: k.id})
	}
	return out
}

// TenantPlan implements gate.TenantDirectory: the plan and level of the
// control plane's tenant name, whether the control plane holds it, and
// whether it is usable at now. A tenant the config file declares is not
// known.
func (d *Directory) TenantPlan(name string, now time.Time) (plan string, level *gate.Level, known, usable bool) {
	d.slotMu.RLock()
	s := d.slots[slotKey(KindTenant, name, name)]
	d.slotMu.RUnlock()
	if s == nil {
		return "", nil, false, false
	}
	n := s.p.Load()
	if n == nil {
		return "", nil, false, false
	}
	return n.plan, n.level, true, n.usable(now)
}

// TenantPlans returns the plan of each tenant the control plane holds, by
// name.
func (d *Directory) TenantPlans() map[string]string {
	prefix := slotKey(KindTenant, "", "")[:len(KindTenant)+1]
	out := map[string]string{}
	d.slotMu.RLock()
	defer d.slotMu.RUnlock()
	for k, s := range d.slots {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		if n := s.p.Load(); n != nil {
			name, _, _ := strings.Cut(rest, "\x00")
			out[name] = n.plan
		}
	}
	return out
}

// Apply brings the directory up to entities, read at version seq. Once
// the directory has loaded, a budget whose counter the entity's level did
// not have before (a budget added, renamed, reset or given another
// period) is marked for a restore from the ledger before its first debit
// (gate.LevelLimit.MarkUnrestored), except a new key's, which has spent
// nothing; Apply returns the tenants of such budgets, in order, once each.
func (d *Directory) Apply(ents []*Entity, seq int64) (recount []string) {
	loaded := d.seq.Load() > 0 // a first load: the gate reconciles as it starts
	var head *string           // the entity written at seq; none when seq wrote no entity
	for _, e := range ents {
		lv, _ := e.level() // what is stored was validated when it was written
		n := &node{level: lv, active: e.Active && e.RevokedAt == nil, plan: e.Plan}
		if e.ExpiresAt != nil {
			n.expires = *e.ExpiresAt
		}
		marked, held := false, false
		switch e.Kind {
		case KindTenant:
			s := d.slot(KindTenant, e.Tenant, e.Tenant)
			held = s.p.Load() != nil
			moved := loaded && d.planMoved != nil && s.p.Load() != nil && s.p.Load().plan != n.plan
			if moved {
				d.planMoved(e.Tenant) // before a request can see the new plan
			}
			marked = s.store(n, loaded) || moved
			if moved {
				d.planMoved(e.Tenant) // after it, for a restore that read the old plan
			}
		case KindTeam, KindUser:
			s := d.slot(e.Kind, e.Tenant, e.Name)
			held = s.p.Load() != nil
			marked = s.store(n, loaded)
		case KindKey:
			d.mu.RLock()
			held = d.byKey[e.ID] != nil
			d.mu.RUnlock()
			marked = d.applyKey(e, n, loaded)
		}
		if held {
			d.altered.Store(true)
		}
		if marked && !slices.Contains(recount, e.Tenant) {
			recount = append(recount, e.Tenant)
		}
		if e.seq == seq {
			head = &e.ID
		}
	}
	d.head.Store(head)
	d.seq.Store(seq)
	return recount
}

// store makes n the slot's node. With mark, the budgets of n's level
// whose counters the node it replaces did not have, or had not restored
// yet, are marked unrestored first (see Directory.Apply); it tells
// whether one was.
func (s *slot) store(n *node, mark bool) bool {
	marked := false
	if old := s.p.Load(); mark && n.level != nil {
		for _, ll := range n.level.Limits {
			if ll.Budget && !old.counts(ll) {
				ll.MarkUnrestored()
				marked = true
			}
		}
	}
	s.p.Store(n)
	return marked
}

// counts tells whether n's level has the counter of budget ll, restored:
// a budget of the same key and period.
func (n *node) counts(ll *gate.LevelLimit) bool {
	if n == nil || n.level == nil {
		return false
	}
	for _, o := range n.level.Limits {
		if o.Budget && o.Key == ll.Key && o.Period == ll.Period {
			return !o.Unrestored()
		}
	}
	return false
}

// Head is the id of the entity written at the directory's version, as
// the database it read had it; "" when unknown.
func (d *Directory) Head() string {
	if h := d.head.Load(); h != nil {
		return *h
	}
	return ""
}

// replace makes d hold what n holds, at once for every reader: n is
// not used after.
func (d *Directory) replace(n *Directory) {
	d.mu.Lock()
	d.slotMu.Lock()
	d.expiryMu.Lock()
	d.keys, d.byKey, d.byTenant = n.keys, n.byKey, n.byTenant
	d.slots, d.names, d.expiring = n.slots, n.names, n.expiring
	d.seq.Store(n.seq.Load())
	d.head.Store(n.head.Load())
	d.expiryMu.Unlock()
	d.slotMu.Unlock()
	d.mu.Unlock()
}

// applyKey makes n key e's node; with mark, as slot.store, unless e is
// new to the directory.
func (d *Directory) applyKey(e *Entity, n *node, mark bool) (marked bool) {
	d.mu.Lock()
	rec := d.byKey[e.ID]
	if rec == nil {
		mark = false // a new key has spent nothing
		rec = &keyRec{id: e.ID, tenant: d.intern(e.Tenant), team: d.intern(e.Team), user: d.intern(e.User),
			ten: d.slot(KindTenant, e.Tenant, e.Tenant)}
		if e.Team != "" {
			rec.tm = d.slot(KindTeam, e.Tenant, e.Team)
		}
		if e.User != "" {
			rec.usr = d.slot(KindUser, e.Tenant, e.User)
		}
		d.byKey[e.ID] = rec
		d.byTenant[rec.tenant] = append(d.byTenant[rec.tenant], rec)
	}
	marked = rec.slot.store(n, mark)
	for _, h := range rec.hashes {
		if k := d.keys[h]; k != nil && k.keyRec == rec {
			delete(d.keys, h)
		}
	}
	rec.hashes = [2][sha256.Size]byte{}
	if e.RevokedAt == nil {
		if cur, ok := decodeHash(e.hash); ok {
			d.keys[cur], rec.hashes[0] = &keyEntry{keyRec: rec}, cur
		}
		if old, ok := decodeHash(e.oldHash); ok && e.oldUntil.After(time.Now()) {
			d.keys[old], rec.hashes[1] = &keyEntry{keyRec: rec, until: e.oldUntil}, old
		}
	}
	d.mu.Unlock()
	d.expiryMu.Lock()
	if e.ExpiresAt != nil && e.RevokedAt == nil {
		d.expiring[e.ID] = *e.ExpiresAt
	} else {
		delete(d.expiring, e.ID)
	}
	d.expiryMu.Unlock()
	return marked
}

// Budgets implements gate.Directory: the budgets of tenant's own level
// and of the levels of its keys (each key's, and each of its teams' and
// users' with the keys under it). A team or user without keys spends
// nothing and is left out.
func (d *Directory) Budgets(tenant string) []gate.LevelBudget {
	return d.levelLimits(tenant, true)
}

// LevelLimits returns every limit of the levels under tenant, budgets and
// others, usable or not (gate.LevelLimiter): a reservation settled by
// another of the tenant's keys charges the limits of the key that made it.
func (d *Directory) LevelLimits(tenant string) []gate.LevelBudget {
	return d.levelLimits(tenant, false)
}

// levelLimits is Budgets, or with budgetsOnly false LevelLimits.
func (d *Directory) levelLimits(tenant string, budgetsOnly bool) []gate.LevelBudget {
	d.mu.RLock()
	recs := slices.Clone(d.byTenant[tenant])
	d.mu.RUnlock()
	var out []gate.LevelBudget
	add := func(s *slot, keyIDs []string) {
		n := s.p.Load()
		if n == nil || n.level == nil {
			return
		}
		for _, ll := range n.level.Limits {
			if ll.Budget || !budgetsOnly {
				out = append(out, gate.LevelBudget{Limit: ll, KeyIDs: keyIDs})
			}
		}
	}
	d.slotMu.Lock()
	ten := d.slots[slotKey(KindTenant, tenant, tenant)]
	d.slotMu.Unlock()
	if ten != nil {
		add(ten, nil)
	}
	var groups []*slot
	members := map[*slot][]string{}
	for _, r := range recs {
		add(&r.slot, []string{r.id})
		for _, s := range []*slot{r.tm, r.usr} {
			if s == nil {
				continue
			}
			if _, ok := members[s]; !ok {
				groups = append(groups, s)
			}
			members[s] = append(members[s], r.id)
		}
	}
	for _, s := range groups {
		add(s, members[s])
	}
	return out
}

// BudgetTenants implements gate.Directory: the tenants with keys.
func (d *Directory) BudgetTenants() []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]string, 0, len(d.byTenant))
	for t := range d.byTenant {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// intern returns the directory's copy of a name, so that a tenant's
// keys share one.
func (d *Directory) intern(s string) string {
	if s == "" {
		return ""
	}
	d.slotMu.Lock()
	defer d.slotMu.Unlock()
	if c, ok := d.names[s]; ok {
		return c
	}
	d.names[s] = s
	return s
}

func decodeHash(s string) ([sha256.Size]byte, bool) {
	var h [sha256.Size]byte
	if len(s) != 2*sha256.Size {
		return h, false
	}
	_, err := hex.Decode(h[:], []byte(s))
	return h, err == nil
}

// Version is the version of the data the directory holds.
func (d *Directory) Version() int64 { return d.seq.Load() }

// Len is the number of secrets in the key table.
func (d *Directory) Len() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.keys)
}

// Level is an entity's compiled level, nil for none: a key by its id, a
// tenant by its name, a team or user by tenant and name.
func (d *Directory) Level(kind Kind, tenant, name string) *gate.Level {
	var s *slot
	if kind == KindKey {
		d.mu.RLock()
		if rec := d.byKey[name]; rec != nil {
			s = &rec.slot
		}
		d.mu.RUnlock()
	} else {
		d.slotMu.Lock()
		s = d.slots[slotKey(kind, tenant, name)]
		d.slotMu.Unlock()
	}
	if s == nil {
		return nil
	}
	if n := s.p.Load(); n != nil {
		return n.level
	}
	return nil
}

// expired returns the keys whose expiry lies in (after, now].
func (d *Directory) expired(after, now time.Time) []string {
	d.expiryMu.Lock()
	defer d.expiryMu.Unlock()
	var out []string
	for id, at := range d.expiring {
		if at.After(after) && !at.After(now) {
			out = append(out, id)
		}
	}
	return out
}
