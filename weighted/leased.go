package weighted

// A lease is a slice of a key's allowance that one replica takes from the
// store in one Debit, under an id of its own, and then spends in process.
// The store counts the lease's units as spent when it is taken, so the
// replicas together never spend more than the store admitted; what a
// replica has not spent when the lease ends goes back to the store. In a
// LeaseStore (Memory, Redis), the store also keeps the lease with its TTL
// and what the replica reported spent of it (with each lease it takes of
// the key), and gives back, once the TTL passes without the lease ended,
// what was not reported spent: a replica that dies has its leases given
// back a TTL after it took them. In another store, a lease ends with one
// Settle (actual = what was spent), and a dead replica's leases come back
// only as the store refills them, their window ends or their marks leave
// the log.
//
// The over-admission this allows comes from the delay between taking a
// unit and spending it, and from what a dead replica spent unreported:
// see Leased for the bound.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Lease is a limit's lease policy. The zero value is strict: no leases.
type Lease struct {
	// Max is the most units of the limit one replica holds unspent for
	// one key at any time, its leases together: a lease is never larger.
	// It is at most the limit's capacity; 0 means no leases.
	Max int64
	// TTL is how long a lease lives before its unspent units go back to
	// the store. 0 means DefaultLeaseTTL. A lease on a window also ends
	// with the window it was taken in.
	TTL time.Duration
}

// DefaultLeaseTTL is a lease's life when Lease.TTL is 0.
const DefaultLeaseTTL = 2 * time.Second

// On reports whether the policy takes leases.
func (l Lease) On() bool { return l.Max > 0 }

// Life is how long a lease lives: TTL, or DefaultLeaseTTL when it is 0.
func (l Lease) Life() time.Duration { return cmp.Or(l.TTL, DefaultLeaseTTL) }

func (l Lease) check(a Algorithm, capacity int64) error {
	switch {
	case l.Max < 0:
		return fmt.Errorf("lease max %d is negative", l.Max)
	case l.TTL < 0:
		return fmt.Errorf("lease ttl %s is negative", l.TTL)
	case l.Max == 0:
		return nil
	case a == Concurrency:
		return errors.New("a concurrency limit cannot be leased (its units are held, not spent)")
	case l.Max > capacity:
		return fmt.Errorf("lease max %d exceeds the capacity %d", l.Max, capacity)
	case l.TTL > time.Hour:
		return fmt.Errorf("lease ttl %s exceeds 1h", l.TTL)
	}
	return nil
}

// LeasedConfig configures a Leased store. The zero value is ready to use.
type LeasedConfig struct {
	// Now is the replica's clock; nil means time.Now. Leases are timed by
	// it from when their Debit is sent, so a lease ends no later, by the
	// store's clock, than the store said it may.
	Now func() time.Time
	// Sweep is how often leases past their TTL are returned and idle keys
	// forgotten. 0 means 100ms.
	Sweep time.Duration
	// MaxKeys bounds the keys whose leases and demand are remembered; a
	// key past it is debited strictly. 0 means 65,536. The keys of one
	// hash tag (a tenant's) take at most a sixteenth of it, so that one
	// tenant's many keys do not leave the others' strict.
	MaxKeys int
}

// LeaseStats counts what a Leased store did since it was made.
type LeaseStats struct {
	Local    int64 // leased items decided in process, admitted or refused
	Refused  int64 // of Local, refused because the key is known spent
	Acquired int64 // Debits of the store that took a lease
	Returned int64 // leases ended in the store: Settles of their unspent units, or, in a LeaseStore, reported done
	Strict   int64 // Debits of the store for a leased item's own cost (a cold key)
	Calls    int64 // every call made to the store: Debit, Settle, Cancel, Renew, Peek
	// Pending is how many reservations that spent leased units are
	// remembered unsettled now (see Ended).
	Pending int64
}

// LeaseInfo is the state of one leased key on this replica.
type LeaseInfo struct {
	Limit       string
	Key         string
	Leases      int   // leases held
	Unspent     int64 // their units not yet spent
	Debt        int64 // settled costs beyond the estimates, paid from the next lease
	RatePerSec  int64 // the replica's recent demand, units per second
	SpentUntil  time.Time
	LastAcquire time.Time
}

// Leased is a Store that decides the items of leased limits (Limit.Lease)
// in process, from leases taken from its inner store, and passes every
// other item to the inner store. A Debit whose items are all leased and
// covered by leases held touches no store; a key without enough leased
// units takes a new lease (one Debit of the store, shared by the
// concurrent requests that wait for it), or, while its demand on this
// replica is too low to be worth a lease, debits the request's own cost
// as a strict store would. A key whose lease was refused is refused in
// process, with the store's RetryAfter, until then (for costs at least as
// large as the one refused), or, in a LeaseStore, for at most a TTL.
//
// # Lease size
//
// A key's demand on this replica is measured between leases, in units per
// second. A lease is sized to last half its TTL at that demand, at least
// the request's cost, at most what keeps the replica's unspent units of
// the key within Lease.Max, and, once the store has said how much was
// left, at most half of that: a hot key gets large leases, a cold one
// none. A lease is renewed in the background when its unspent units fall
// below a quarter of its size. In a LeaseStore a lease is spent for half
// its TTL (the other half is for its end to reach the store); otherwise
// for its TTL.
//
// # The bound
//
// The store debits a lease when it is taken; the replica spends it later,
// within its TTL. With R replicas holding leases on a key:
//   - TokenBucket, GCRA and SlidingLog: over any interval, the units
//     admitted are at most what the strict limit admits over it (Burst +
//     Rate × length for a meter; Rate for a log over one Period) plus the
//     units leased before the interval and unspent at its start: at most
//     R × Lease.Max. Counted from a state the store has not leased from,
//     nothing more is admitted than strictly.
//   - FixedWindow (by period or calendar month) and SlidingWindow: a lease
//     ends with the window it was taken in, so each window admits at most
//     its capacity, as strictly; a sliding window's weighted count sees a
//     unit when it was leased, up to one TTL before it was spent.
//   - Settlements: a cost settled above its estimate is charged to the
//     replica's leases (a debt the next lease pays first; one that no
//     lease will pay, a TTL unpaid, or at Close, it is charged to the
//     store as a strict Settle charges it, clamped as a strict Settle
//     clamps it, and the debt is at most what the store holds beyond
//     empty, maxOwed). A refund of a meter or a log never brings the
//     replica's unspent units of the key above Lease.Max (see give). So
//     settlements add nothing to the bound beyond what they add strictly.
//   - A reservation is settled against the leases of the replica that
//     debited it, once. Settled again, or on another replica, its leased
//     items are charged what exceeds their estimate and never refunded,
//     so that no settle gives back twice; the replica that debited them
//     gives back what it spent from its leases beyond that end when told
//     of it (GiveBack), once.
//   - A replica that dies admits nothing more. In a LeaseStore, its
//     leases come back a TTL after they were taken: the store gives back
//     their units less what the replica reported spent. What it spent
//     since its last report was unspent then or is the lease that report
//     came with, at most Lease.Max in all: so with D replicas dead
//     holding leases on a key, add D × Lease.Max to the bound above, over
//     any interval for meters and logs, and per window for windows. (A
//     replica whose end of a lease reaches the store more than half a
//     TTL late counts as dead until it does, when the store charges what
//     it spent beyond what the store kept.) In another store, it loses
//     what it held unspent, at most Lease.Max per key, which the store
//     counts spent until it refills a meter, a log's marks leave it or
//     their window ends; nothing is admitted twice.
//   - A store that loses its data (restarted empty, flushed, failed over
//     to a replica that lags) while replicas hold leases forgets them.
//     Restore counts what the restoring replica holds unspent with the
//     caller's count (its ledger's spend), so that replica's leases stay
//     counted; a report of a lease the store forgot gives nothing back.
//     Each other replica spends what it held unspent of the key, at most
//     Lease.Max, uncounted: with R replicas holding leases on the key, add
//     (R - 1) × Lease.Max, once per loss, to the window (a budget's
//     period) of the loss, beyond the loss's own bound.
//   - A limit changed under its leases (a config reload: another capacity,
//     rate, period or lease policy under the same name and algorithm)
//     ends the leases taken under the old one at the key's next debit:
//     they are returned, never spent under the new limit.
//
// Leased is safe for concurrent use. NewLeased starts its sweeper; Close
// stops it and returns the leases held.
type Leased struct {
	store   Store
	ls      LeaseStore // store, when it keeps leases
	now     func() time.Time
	sweep   time.Duration
	maxKeys int
	// maxPerTag bounds the keys of one hash tag (see LeasedConfig.MaxKeys).
	maxPerTag int
	prefix    string
	seq       atomic.Uint64
	stats     leaseStats
	stop      chan struct{}
	stopped   sync.Once
	wg        sync.WaitGroup
	// inline takes a lease that renews one before it runs out in the
	// request that notices, not in the background: tests use it to be
	// deterministic.
	inline bool

	mu   sync.RWMutex
	keys map[leaseKey]*leaseState
	// tags counts keys' states by their hash tag (see remember).
	tags map[string]int
	// nkeys is len(keys), read without mu: a store that keeps no state
	// has no leases to end when a limit turns strict (endStrict).
	nkeys atomic.Int64
	// retired are the states replaced when their key's limit changed (a
	// config reload) whose leases have not all been returned yet: the
	// sweeper retries them.
	retired []*leaseState

	seed  maphash.Seed
	pends [16]pending
}

var _ Store = (*Leased)(nil)

type leaseStats struct {
	local, refused, acquired, returned, strict, calls atomic.Int64
}

type leaseKey struct {
	name string
	algo Algorithm
	cal  Calendar
	key  string
}

// stateKeyOf is the key of its lease state: every version of its limit
// (another capacity, rate or period under the same name and algorithm)
// shares it.
func stateKeyOf(it *Item) leaseKey {
	return leaseKey{name: it.Limit.Name, algo: it.Limit.Algorithm, cal: it.Limit.Calendar, key: it.Key}
}

// leaseState is one key's leases on this replica.
type leaseState struct {
	mu      sync.Mutex
	item    Item // the key's item, Cost 0, for the store
	leases  []heldLease
	ended   []heldLease // past their TTL, to return
	debt    int64
	debtAge time.Time // when the debt first went unpaid

	// demand
	taken int64
	since time.Time
	rate  float64 // units per second
	size  int64   // the last lease's size

	// the store's last answer
	remaining  int64
	known      bool
	resetAt    time.Time
	spentCost  int64
	spentUntil time.Time
	spentCheck time.Time // when to ask the store again: spentUntil, or a TTL, sooner, in a LeaseStore
	spentState ItemState

	fetching chan struct{} // open while a lease is being taken
	// retired is set when the key's limit changed under this state (a
	// config reload): its leases, taken under the old limit, are ended,
	// and nothing more is spent from or leased into it.
	retired  bool
	lastUsed time.Time
	lastAcq  time.Time
	// keep is set when the store keeps leases (a LeaseStore): every
	// lease, spent whole or not, ends with a report that it is done.
	keep bool
}

type heldLease struct {
	id       string
	seq      uint64 // its number, in a LeaseStore
	granted  int64
	used     int64
	reported int64 // used, as the LeaseStore last heard
	expires  time.Time
	window   bool      // ends with its window: nothing to return after
	wstart   time.Time // a window's lease: when the window it counts in began, by the replica's clock
}

// NewLeased returns a Leased store over inner and starts its sweeper.
func NewLeased(inner Store, cfg LeasedConfig) *Leased {
	var b [6]byte
	_, _ = rand.Read(b[:])
	maxKeys := cmp.Or(cfg.MaxKeys, 1<<16)
	l := &Leased{
		store: inner, now: cfg.Now, sweep: cmp.Or(cfg.Sweep, 100*time.Millisecond),
		maxKeys: maxKeys, maxPerTag: cmp.Or(maxKeys/16, 1), tags: map[string]int{}, prefix: "lease-" + hex.EncodeToString(b[:]) + "-",
		stop: make(chan struct{}), keys: map[leaseKey]*leaseState{}, seed: maphash.MakeSeed(),
	}
	if l.now == nil {
		l.now = time.Now
	}
	l.ls, _ = inner.(LeaseStore)
	l.wg.Go(l.sweeper)
	return l
}

// Inner returns the store the leases are taken from.
func (l *Leased) Inner() Store { return l.store }

// Stats returns the store's counts.
func (l *Leased) Stats() LeaseStats {
	s := &l.stats
	st := LeaseStats{Local: s.local.Load(), Refused: s.refused.Load(), Acquired: s.acquired.Load(),
		Returned: s.returned.Load(), Strict: s.strict.Load(), Calls: s.calls.Load()}
	for i := range l.pends {
		p := &l.pends[i]
		p.mu.Lock()
		st.Pending += int64(len(p.m))
		p.mu.Unlock()
	}
	return st
}

// Leases returns the state of every leased key this replica holds leases
// for or remembers as spent, for the admin API.
func (l *Leased) Leases() []LeaseInfo {
	now := l.now()
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]LeaseInfo, 0, len(l.keys))
	for k, st := range l.keys {
		st.mu.Lock()
		st.expire(now)
		info := LeaseInfo{Limit: k.name, Key: k.key, Leases: len(st.leases), Unspent: st.avail(),
			Debt: st.debt, RatePerSec: int64(st.rate), LastAcquire: st.lastAcq}
		if st.spentUntil.After(now) {
			info.SpentUntil = st.spentUntil
		}
		st.mu.Unlock()
		if info.Leases > 0 || info.Debt > 0 || !info.SpentUntil.IsZero() {
			out = append(out, info)
		}
	}
	return out
}

// Close stops the sweeper and returns every lease held. The store stays
// usable, strictly: a Debit after Close takes no lease.
func (l *Leased) Close(ctx context.Context) error {
	l.stopped.Do(func() { close(l.stop) })
	l.wg.Wait()
	l.mu.Lock()
	states := make([]*leaseState, 0, len(l.keys))
	for _, st := range l.keys {
		states = append(states, st)
	}
	l.mu.Unlock()
	errs := []error{l.returnRetired(ctx)}
	for _, st := range states {
		st.mu.Lock()
		st.expire(l.now())
		// What the replica owes the key is paid from its unspent units
		// first, as the next lease would pay it; the rest is charged to
		// the store.
		paid := min(st.avail(), st.debt)
		st.spend(paid)
		debt := st.debt - paid
		st.debt = 0
		st.endAll()
		st.mu.Unlock()
		if err := l.returnEnded(ctx, st, true); err != nil {
			errs = append(errs, err)
		}
		if debt > 0 {
			if err := l.chargeDebt(ctx, st, debt); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (l *Leased) closed() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// Debit implements Store.
func (l *Leased) Debit(ctx context.Context, id string, items []Item) (Result, error) {
	return l.DebitInto(ctx, id, items, nil)
}

// DebitInto is Debit with the result's item states kept in states when it
// has room for one per item: a decision taken from leases held then
// allocates nothing. The result's Items alias states.
func (l *Leased) DebitInto(ctx context.Context, id string, items []Item, states []ItemState) (Result, error) {
	return l.debitInto(ctx, id, items, states, true)
}

// StatesDebiter is a store whose Debit can keep the result's item states
// in the caller's memory. Redis and Leased implement it.
type StatesDebiter interface {
	// DebitInto is Debit with the result's item states kept in states
	// when it has room for one per item, the result's Items then aliasing
	// states; otherwise as Debit.
	DebitInto(ctx context.Context, id string, items []Item, states []ItemState) (Result, error)
}

var (
	_ StatesDebiter = (*Redis)(nil)
	_ StatesDebiter = (*Leased)(nil)
)

// statesFor is states, cleared, for n items when it has room for them;
// else a new slice.
func statesFor(states []ItemState, n int) []ItemState {
	if cap(states) < n {
		return make([]ItemState, n)
	}
	states = states[:n]
	clear(states)
	return states
}

// debitInto is DebitInto; a strict debit the store refused is decided
// again once when retry is set and regain says it may be.
func (l *Leased) debitInto(ctx context.Context, id string, items []Item, states []ItemState, retry bool) (Result, error) {
	if id == "" {
		return Result{}, errNoID
	}
	nl := 0
	for i := range items {
		if items[i].Limit.Lease.On() {
			nl++
		}
	}
	if nl < len(items) && l.nkeys.Load() > 0 {
		l.endStrict(ctx, items)
	}
	if nl == 0 || l.closed() || len(items) > maxLeasedItems {
		l.stats.calls.Add(1)
		if sd, ok := l.store.(StatesDebiter); ok {
			return sd.DebitInto(ctx, id, items, states)
		}
		return l.store.Debit(ctx, id, items)
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return Result{}, err
	}
	res := Result{Items: statesFor(states, len(items))}
	// Leased items first: a key known spent costs no store call at all.
	var keys [maxLeasedItems]*leaseState
	var local uint64 // items spent from leases
	undo := func() {
		now := l.now()
		for i := range items {
			if local&(1<<i) != 0 {
				keys[i].give(items[i].Cost, now, now, false)
			}
		}
	}
	for i := range items {
		if !items[i].Limit.Lease.On() {
			continue
		}
		var old *leaseState
		if keys[i], old = l.current(&items[i]); old != nil {
			// The limit changed (a config reload): the leases taken under
			// the old one end now, so that they are not spent under the
			// new one. A failure here leaves them to the sweeper.
			_ = l.returnEnded(context.WithoutCancel(ctx), old, true)
		}
		if keys[i] == nil {
			continue // too many keys: strict
		}
		is, spent, err := l.take(ctx, keys[i], &items[i], &ss[i])
		if err != nil {
			undo()
			return Result{}, ofRequest(err, items)
		}
		if !spent {
			continue
		}
		res.Items[i] = is
		if !is.Allowed {
			undo()
			for j := range items {
				if res.Items[j].Capacity == 0 {
					// Not evaluated: reported at its capacity.
					res.Items[j] = ItemState{Allowed: true, Remaining: ss[j].cap, Capacity: ss[j].cap}
				}
			}
			res.decide()
			return res, nil
		}
		local |= 1 << i
	}
	// When the leased items were spent: a refund goes back only into a
	// lease of the window they were spent in (see give).
	var spentAt time.Time
	if local != 0 {
		spentAt = l.now()
	}
	// The rest, strict, in one Debit of the store.
	if n := len(items) - bits.OnesCount64(local); n > 0 {
		var ibuf [4]Item
		var idx [maxLeasedItems]int
		strict := ibuf[:0]
		for i := range items {
			if local&(1<<i) == 0 {
				idx[len(strict)] = i
				strict = append(strict, items[i])
			}
		}
		l.stats.calls.Add(1)
		if nl > len(items)-len(strict) {
			l.stats.strict.Add(1) // a leased item among them: a cold key
		}
		sr, err := l.store.Debit(ctx, id, strict)
		if err != nil {
			undo()
			return Result{}, ofRequest(err, items)
		}
		now := l.now()
		for j, is := range sr.Items {
			i := idx[j]
			res.Items[i] = is
			if st := keys[i]; st != nil {
				st.saw(is, items[i].Cost, now)
			}
		}
		if !sr.Allowed {
			undo()
			if retry && l.regain(ctx, items, keys[:], idx[:len(strict)], sr.Items) {
				return l.debitInto(ctx, id, items, states, false)
			}
			res.decide()
			return res, nil
		}
	}
	// Remembered also when no unit came from a lease (a cold key debited
	// strictly): its Settle or Cancel here is then the store's, refunded
	// as a strict one is (settle), where an unknown reservation's leased
	// items are never refunded (settleUnknown).
	if local == 0 {
		spentAt = l.now()
	}
	l.pend(id, local, spentAt)
	res.decide()
	return res, nil
}

// regain tells whether a strict debit that the store refused (its item
// states in order; idx maps them to items) may be decided again, and
// prepares it: every item refused is leased, and this replica's leases of
// its key hold its cost (a lease another request took while this one's
// debit was on its way), or, for a cost above what a lease may hold, what
// the store lacked of it. Those leases go back to the store first, so
// that the strict debit finds their units there; the key's mark of spent
// goes with them. Nothing goes back unless every item refused is regained.
func (l *Leased) regain(ctx context.Context, items []Item, keys []*leaseState, idx []int, states []ItemState) bool {
	now := l.now()
	var back [maxLeasedItems]*leaseState
	n := 0
	for j, is := range states {
		if is.Allowed {
			continue
		}
		i := idx[j]
		st := keys[i]
		if st == nil {
			return false
		}
		cost := items[i].Cost
		held := st.heldNow(now)
		switch {
		case held >= cost:
		case held > 0 && cost > items[i].Limit.Lease.Max && is.Remaining+held >= cost:
			back[n] = st
			n++
		default:
			return false
		}
	}
	for _, st := range back[:n] {
		st.mu.Lock()
		st.endAll()
		st.spentUntil = time.Time{}
		st.mu.Unlock()
		_ = l.returnEnded(context.WithoutCancel(ctx), st, true)
	}
	return true
}

// ofRequest is err of a store call made with some of a request's items (a
// lease of one, the strict rest): a *StaleError names its tags' items by
// their indexes in the request, not in the call, so that the caller
// restores the items it names (see StaleError).
func ofRequest(err error, items []Item) error {
	var se *StaleError
	if !errors.As(err, &se) {
		return err
	}
	return staleError(items, se.Tags)
}

// maxLeasedItems is the most items a request with leased items may have;
// a larger one is debited strictly.
const maxLeasedItems = 64

// Unspent is what this replica holds unspent of its leases of its key,
// less what it owes the key: what it would admit from them without asking
// the store. It makes no state for a key it does not know.
func (l *Leased) Unspent(it Item) int64 {
	st := l.known(&it)
	if st == nil {
		return 0
	}
	return st.heldNow(l.now())
}

// known returns the key's state, nil when this replica keeps none.
func (l *Leased) known(it *Item) *leaseState {
	l.mu.RLock()
	st := l.keys[stateKeyOf(it)]
	l.mu.RUnlock()
	return st
}

// state returns the key's state, made on first use; nil when the store
// remembers too many keys already. The state may be of another version
// of its limit (a reservation debited before a config reload): its
// leases are the key's all the same.
func (l *Leased) state(it *Item) *leaseState {
	if st := l.known(it); st != nil {
		return st
	}
	k := stateKeyOf(it)
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.keys[k]; st != nil {
		return st
	}
	tag := HashTag(it.Key)
	if len(l.keys) >= l.maxKeys || l.tags[tag] >= l.maxPerTag {
		return nil
	}
	st := l.newState(it)
	l.keys[k] = st
	l.nkeys.Add(1)
	l.tags[tag]++
	return st
}

// forget drops k's state, counted under the hash tag of key. The caller
// holds l.mu.
func (l *Leased) forget(k leaseKey, key string) {
	delete(l.keys, k)
	l.nkeys.Add(-1)
	tag := HashTag(key)
	if l.tags[tag]--; l.tags[tag] <= 0 {
		delete(l.tags, tag)
	}
}

// newState is a new state for its key, used now: the sweeper, which
// forgets a state unused for a while, must not forget it before the
// request that made it has taken from it.
func (l *Leased) newState(it *Item) *leaseState {
	now := l.now()
	return &leaseState{item: Item{Limit: it.Limit, Key: it.Key}, since: now, lastUsed: now, keep: l.ls != nil}
}

// current is state for a debit: a state kept for another version of its
// limit (its capacity, rate, period or lease policy changed by a config
// reload) is replaced by a new one, and returned as old, retired, with
// its leases ended for the caller to return (returnEnded with all set).
// Leases taken under the old limit are never spent under the new one,
// new leases are taken under the new one, and what the store said of the
// old (a refusal, what was left) is forgotten. The debt carries over.
func (l *Leased) current(it *Item) (st, old *leaseState) {
	if st = l.state(it); st == nil || st.item.Limit == it.Limit {
		return st, nil
	}
	k := stateKeyOf(it)
	l.mu.Lock()
	defer l.mu.Unlock()
	if old = l.keys[k]; old == nil || old.item.Limit == it.Limit {
		return old, nil
	}
	st = l.newState(it)
	st.debt, st.debtAge, st.rate = l.retire(old)
	l.keys[k] = st
	return st, old
}

// retire marks st retired, its leases ended for the caller to return
// (returnEnded with all set; the sweeper retries), and returns what it
// owed, since when, and its demand: the caller carries them over or
// charges the debt. The caller holds l.mu.
func (l *Leased) retire(st *leaseState) (debt int64, since time.Time, rate float64) {
	st.mu.Lock()
	st.retired = true
	st.endAll()
	debt, since, rate = st.debt, st.debtAge, st.rate
	st.debt = 0
	st.mu.Unlock()
	l.retired = append(l.retired, st)
	return debt, since, rate
}

// endStrict ends the leases of the items' keys taken under a leased
// version of a limit that is strict now (a config reload turned its lease
// policy off), at the key's first request since, as current does for a
// limit changed and leased still: they are returned to the store, never
// spent, and what the replica owed the key is charged to it.
func (l *Leased) endStrict(ctx context.Context, items []Item) {
	for i := range items {
		it := &items[i]
		if it.Limit.Lease.On() {
			continue
		}
		st := l.known(it)
		if st == nil || st.item.Limit == it.Limit {
			continue
		}
		k := stateKeyOf(it)
		l.mu.Lock()
		if l.keys[k] != st {
			l.mu.Unlock()
			continue
		}
		l.forget(k, st.item.Key)
		debt, _, _ := l.retire(st)
		l.mu.Unlock()
		work := context.WithoutCancel(ctx)
		_ = l.returnEnded(work, st, true) // a failure leaves them to the sweeper
		if debt > 0 {
			_ = l.chargeDebt(work, st, debt)
		}
	}
}

// chargeDebt charges what a replica owes a key to the store, as a strict
// Settle charges what exceeds an estimate: clamped as it clamps it.
func (l *Leased) chargeDebt(ctx context.Context, st *leaseState, debt int64) error {
	l.stats.calls.Add(1)
	return l.store.Settle(ctx, l.prefix+"debt-"+strconv.FormatUint(l.seq.Add(1), 36), []Item{st.item}, []int64{debt})
}

// take spends cost from the key's leases, taking a new lease when they
// hold too little and the key's demand is worth one. spent reports
// whether the item was decided here: admitted from a lease, or refused
// because the key is known spent; otherwise the caller debits it from
// the store.
func (l *Leased) take(ctx context.Context, st *leaseState, it *Item, s *spec) (is ItemState, spent bool, err error) {
	cost := it.Cost
	for {
		now := l.now()
		st.mu.Lock()
		if st.retired || l.closed() {
			// Its limit changed while this request waited for its lease,
			// or the store closed: strict.
			st.mu.Unlock()
			return ItemState{}, false, nil
		}
		st.lastUsed = now
		st.expire(now)
		need, avail := cost+st.debt, st.avail()
		if avail >= need {
			st.spend(need)
			st.debt = 0
			st.taken += cost
			is := st.view(s, now)
			var size int64
			if st.fetching == nil && st.size > 0 && st.avail() < st.size/4 && !l.closed() {
				if size = st.leaseSize(0, now); size > 0 {
					st.fetching = make(chan struct{})
				}
			}
			st.mu.Unlock()
			l.stats.local.Add(1)
			if size > 0 {
				sp, ttl := *s, it.Limit.Lease.Life()
				if l.inline {
					_, _ = l.acquire(context.WithoutCancel(ctx), st, &sp, size, 0)
					return is, true, nil
				}
				l.wg.Go(func() {
					pctx, cancel := context.WithTimeout(context.Background(), ttl)
					defer cancel()
					_, _ = l.acquire(pctx, st, &sp, size, 0)
				})
			}
			return is, true, nil
		}
		// Known spent only past the leases held: a strict refusal that
		// reached the store after a lease took what was left marks the
		// key, but the lease's units are this replica's. The mark is of
		// the store, which refused spentCost: what the leases lack of
		// need is asked of it.
		if now.Before(st.spentUntil) && now.Before(st.spentCheck) && need-avail >= st.spentCost {
			is := st.spentState
			is.RetryAfter = st.spentUntil.Sub(now)
			is.ResetAfter = max(is.ResetAfter, is.RetryAfter)
			st.mu.Unlock()
			l.stats.local.Add(1)
			l.stats.refused.Add(1)
			return is, true, nil
		}
		if ch := st.fetching; ch != nil {
			st.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return ItemState{}, false, ctx.Err()
			}
		}
		size := st.leaseSize(need, now)
		if size < 2*need {
			// Cold. Leases held that lack part of need get that part from
			// the store as a lease of its own (within Lease.Max): their
			// units and the store's together are the request's, where a
			// strict debit of need would be refused with them in hand. A
			// need above Lease.Max goes strict; its refusal gives the
			// leases back when that would admit it (regain).
			if avail == 0 || need > it.Limit.Lease.Max {
				st.taken += cost
				// What the replica owes the key no lease will pay: it is
				// charged to the store before the strict debit, which so
				// finds the key as a strict store would.
				debt := st.debt
				st.debt = 0
				st.mu.Unlock()
				if debt > 0 {
					if err := l.chargeDebt(context.WithoutCancel(ctx), st, debt); err != nil {
						st.owe(debt, l.now())
						return ItemState{}, false, err
					}
				}
				return ItemState{}, false, nil // strict
			}
			size = need - avail
		}
		st.fetching = make(chan struct{})
		st.mu.Unlock()
		// The lease is every waiter's: a caller that leaves (a client that
		// hangs up) does not cut it short; the store's own bounds do.
		if _, err := l.acquire(context.WithoutCancel(ctx), st, s, size, need); err != nil {
			return ItemState{}, false, err
		}
		// Held, or refused and the key marked spent: the loop's next turn
		// says which.
	}
}

// leaseSize measures the key's demand and returns the size of its next
// lease: half a TTL of demand, at most what keeps the unspent units within
// Lease.Max and half of what the store last said was left. The caller
// holds mu.
func (st *leaseState) leaseSize(need int64, now time.Time) int64 {
	pol := st.item.Limit.Lease
	if el := now.Sub(st.since); el >= time.Millisecond {
		inst := float64(st.taken) / el.Seconds()
		if st.rate == 0 {
			st.rate = inst
		} else {
			st.rate = (st.rate + inst) / 2
		}
		st.taken, st.since = 0, now
	}
	size := int64(min(st.rate*pol.Life().Seconds()/2, float64(pol.Max)))
	return min(size, pol.Max-st.avail())
}

// saw records the store's answer to a strict debit of cost on the key.
func (st *leaseState) saw(is ItemState, cost int64, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.remaining, st.known = is.Remaining, true
	st.resetAt = now.Add(is.ResetAfter)
	if !is.Allowed && is.RetryAfter > 0 {
		st.spentCost, st.spentUntil, st.spentState = cost, now.Add(is.RetryAfter), is
		st.spentCheck = st.recheck(now)
	}
}

// acquire takes a lease of size units for st in one Debit of the store
// and reports whether it got it. When the store has less left, the next
// Debit takes what is left (at most maxShrinks times), or, when less than
// that is left, what the leases held lack of need alone; only that part's
// refusal marks the key known spent (for requests that lack as much of
// the store or more) until the store's RetryAfter. A meter or log
// that refills the lease within a quarter of its TTL is instead known
// spent until then, once less than half the lease is left: a hot key at
// its limit waits for a lease's worth, at most a quarter TTL. need 0 is a
// renewal ahead of time, which marks nothing. The caller has set
// st.fetching, which acquire closes.
func (l *Leased) acquire(ctx context.Context, st *leaseState, s *spec, size, need int64) (bool, error) {
	defer func() {
		st.mu.Lock()
		close(st.fetching)
		st.fetching = nil
		st.mu.Unlock()
	}()
	size = min(size, s.cap)
	ttl := st.item.Limit.Lease.Life()
	for attempt := 0; ; attempt++ {
		seq := l.seq.Add(1)
		id := l.prefix + strconv.FormatUint(seq, 36)
		sent := l.now()
		l.stats.calls.Add(1)
		one := [1]Item{st.item}
		one[0].Cost = size
		var got ItemState
		if l.ls != nil {
			id = l.prefix + strconv.FormatUint(seq, 10)
			var rbuf [8]LeaseReport
			var reps []LeaseReport
			if attempt == 0 {
				reps = st.reports(rbuf[:0])
			}
			var err error
			got, err = l.ls.Lease(ctx, one[0], LeaseCall{Prefix: l.prefix, Seq: seq, TTL: ttl, Reports: reps})
			if err != nil {
				st.unreport(reps)
				return false, err
			}
		} else {
			r, err := l.store.Debit(ctx, id, one[:])
			if err != nil {
				return false, err
			}
			got = r.Items[0]
		}
		st.mu.Lock()
		st.remaining, st.known = got.Remaining, true
		st.resetAt = sent.Add(got.ResetAfter)
		if got.Allowed {
			st.spentUntil = time.Time{}
			st.lastAcq = sent
			life := ttl
			if st.keep {
				// The other half is for its report to reach the store
				// before the store gives it back.
				life = ttl / 2
			}
			expires, window := sent.Add(life), false
			var wstart time.Time
			if s.algo == FixedWindow || s.algo == SlidingWindow {
				end := windowEnd(s, got, sent)
				if end.Before(expires) {
					expires, window = end, true
				}
				wstart = end.Add(-time.Duration(s.period) * time.Microsecond)
				if s.cal != NoCalendar {
					wstart = time.UnixMicro(monthStart(monthIndex(end.UnixMicro() - 1)))
				}
			}
			h := heldLease{id: id, seq: seq, granted: size, expires: expires, window: window, wstart: wstart}
			if st.retired || l.closed() {
				// Its limit changed while the lease was taken, or the store
				// closed (Close returns every lease held): it goes back
				// unspent.
				st.ended = append(st.ended, h)
				st.mu.Unlock()
				l.stats.acquired.Add(1)
				_ = l.returnEnded(ctx, st, true)
				return true, nil
			}
			st.leases = append(st.leases, h)
			st.size = size
			st.mu.Unlock()
			l.stats.acquired.Add(1)
			return true, nil
		}
		if need == 0 {
			st.mu.Unlock()
			return false, nil
		}
		// short is what the leases held lack of need: the request's part
		// of the store. None when they cover need (a refund came back, or
		// the leases of the other requests' calls were taken meanwhile):
		// take spends from them.
		short := need - st.avail()
		if short <= 0 {
			st.mu.Unlock()
			return false, nil
		}
		// A meter or log that refills a lease's worth soon: wait for half a
		// lease rather than chase what trickles in. Otherwise take what is
		// left, or, when that is less than short, ask for short alone: only
		// short's refusal is the request's. A refusal of more says nothing
		// of short, however little the answer says is left: other replicas
		// debit between the answer and the next call.
		fast := s.algo != FixedWindow && s.algo != SlidingWindow && got.RetryAfter <= st.item.Limit.Lease.Life()/4
		if size != short && !(fast && got.Remaining < size/2) {
			switch {
			case got.Remaining >= short && attempt < maxShrinks:
				size = min(got.Remaining, size)
				st.mu.Unlock()
				continue
			case got.Remaining >= short || !fast:
				size = short
				st.mu.Unlock()
				continue
			}
		}
		st.spentCost, st.spentUntil, st.spentState = short, sent.Add(got.RetryAfter), got
		st.spentCheck = st.recheck(sent)
		st.mu.Unlock()
		return false, nil
	}
}

// maxShrinks is how many times acquire takes what the store said was left
// after a lease was refused, before it asks for what the request lacks
// alone:
// other replicas that keep debiting first cost it at most that many calls
// more.
const maxShrinks = 2

// recheck is when a key found spent at t is asked of the store again: when
// it frees, or, in a LeaseStore, a lease's TTL later, when the leases of a
// replica that died are given back. The caller holds mu.
func (st *leaseState) recheck(t time.Time) time.Time {
	if st.keep {
		if c := t.Add(st.item.Limit.Lease.Life()); c.Before(st.spentUntil) {
			return c
		}
	}
	return st.spentUntil
}

// windowEnd is when the window a debit of s just counted in ends, from
// its answer, by the replica's clock from when the debit was sent.
func windowEnd(s *spec, got ItemState, sent time.Time) time.Time {
	if s.algo == SlidingWindow {
		return sent.Add(got.ResetAfter - micros(s.period))
	}
	return sent.Add(got.ResetAfter)
}

// expire moves the leases past their time to ended, and forgets those
// spent whole but the newest (a refund's place). The caller holds mu.
func (st *leaseState) expire(now time.Time) {
	n := 0
	for i, h := range st.leases {
		if h.used >= h.granted && i < len(st.leases)-1 {
			if st.keep {
				st.ended = append(st.ended, h)
			}
			continue
		}
		if now.Before(h.expires) {
			st.leases[n] = h
			n++
		} else if st.keep || !h.window && h.used < h.granted {
			st.ended = append(st.ended, h)
		}
	}
	clear(st.leases[n:])
	st.leases = st.leases[:n]
}

// held is what the leases hold unspent less what is owed the key: what
// this replica admits from them without the store (none once retired).
// The caller holds mu.
func (st *leaseState) held(now time.Time) int64 {
	if st.retired {
		return 0
	}
	st.expire(now)
	return st.avail() - st.debt
}

// heldNow is held, taking mu.
func (st *leaseState) heldNow(now time.Time) int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.held(now)
}

// endAll ends every lease held, to be given back (returnEnded). The
// caller holds mu.
func (st *leaseState) endAll() {
	st.ended = append(st.ended, st.leases...)
	clear(st.leases)
	st.leases = st.leases[:0]
}

// avail is the leases' unspent units. The caller holds mu.
func (st *leaseState) avail() int64 {
	var a int64
	for _, h := range st.leases {
		a += h.granted - h.used
	}
	return a
}

// spend takes n units from the oldest leases first. The caller holds mu
// and has checked avail.
func (st *leaseState) spend(n int64) {
	for i := range st.leases {
		h := &st.leases[i]
		r := min(n, h.granted-h.used)
		h.used += r
		n -= r
		if n == 0 {
			return
		}
	}
}

// give returns n units, spent at at, to the newest leases still held. What
// they have not spent cannot take it all when the units came from a lease
// since spent whole, or reported done: the rest goes to the newest lease
// as a credit (its used below zero), spent before its own units. The
// store counts those units spent in the other lease; spending them again
// here keeps the two counts equal, where dropping them would refuse the
// key that much early. Only with no lease held is the rest dropped. A
// window's units go back only into a lease of the window they were spent
// in, as a strict Settle refunds only into the window debited: a lease
// held ends with its window, so that is a lease whose window began by at.
//
// A refund (refund set) of a meter or a log, which a strict store clamps
// (a bucket refills to its burst at most; a log's marks leave it after a
// Period), goes back only as far as keeps the replica's unspent units of
// the key within Lease.Max, and not at all for a log's units spent a
// Period ago or more: the rest is dropped, as a full bucket drops it. So
// refunds never make a replica hold more than Lease.Max unspent, however
// late they come or however many they are. An undo (refund not set) gives
// back units the caller has just spent, in full.
func (st *leaseState) give(n int64, now, at time.Time, refund bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.expire(now)
	if lim := &st.item.Limit; refund && lim.Algorithm != FixedWindow && lim.Algorithm != SlidingWindow {
		if lim.Algorithm == SlidingLog && now.Sub(at) >= lim.Period {
			return
		}
		n = min(n, max(lim.Lease.Max-st.avail(), 0))
	}
	newest := -1
	for i := len(st.leases) - 1; i >= 0 && n > 0; i-- {
		h := &st.leases[i]
		if h.wstart.After(at) {
			continue // a later window's
		}
		if newest < 0 {
			newest = i
		}
		r := min(n, max(h.used, 0))
		h.used -= r
		n -= r
	}
	if n > 0 && newest >= 0 {
		st.leases[newest].used -= n
	}
}

// view is an admitted item's state from the leases. The caller holds mu.
func (st *leaseState) view(s *spec, now time.Time) ItemState {
	rem := min(st.remaining+st.avail(), s.cap)
	return ItemState{Allowed: true, Remaining: rem, Capacity: s.cap, ResetAfter: max(0, st.resetAt.Sub(now))}
}

// Settle implements Store: leased items are settled against this
// replica's leases of their keys, the others by the store.
func (l *Leased) Settle(ctx context.Context, id string, items []Item, actual []int64) error {
	if err := checkSettle(id, items, actual); err != nil {
		return err
	}
	return l.settle(ctx, id, items, actual)
}

// Cancel implements Store.
func (l *Leased) Cancel(ctx context.Context, id string, items []Item) error {
	if id == "" {
		return errNoID
	}
	return l.settle(ctx, id, items, nil)
}

func (l *Leased) settle(ctx context.Context, id string, items []Item, actual []int64) error {
	local, at, ok := l.unpend(id)
	if !ok || len(items) > maxLeasedItems {
		return l.settleUnknown(ctx, id, items, actual)
	}
	now := l.now()
	for i := range items {
		if local&(1<<i) == 0 {
			continue
		}
		st := l.state(&items[i])
		if st == nil {
			continue
		}
		var a int64
		if actual != nil {
			a = min(actual[i], items[i].Cost+items[i].Limit.Capacity())
		}
		if d := a - items[i].Cost; d < 0 {
			st.give(-d, now, at, true)
		} else if d > 0 {
			st.mu.Lock()
			st.expire(now)
			r := min(st.avail(), d)
			st.spend(r)
			st.mu.Unlock()
			if d > r {
				st.owe(d-r, now)
			}
		}
	}
	if bits.OnesCount64(local) == len(items) {
		return nil
	}
	return l.settleStrict(ctx, id, items, actual, local)
}

// GiveBack gives back, of reservation id, what this replica spent of it
// from its leases and actual leaves unspent (actual nil: all of it), when
// another replica ended the reservation: that one settled the items held
// in the store and charged what any item cost beyond its estimate (see
// settleUnknown), but cannot refund units spent from this replica's
// leases, which the store counts spent until their window ends or their
// meter refills. It charges nothing and calls no store; an item this
// replica debited in the store is left as the other replica left it. It
// reports whether this replica remembered the reservation; either way
// it forgets it.
func (l *Leased) GiveBack(id string, items []Item, actual []int64) bool {
	if actual != nil && len(actual) != len(items) {
		return false
	}
	local, at, ok := l.unpend(id)
	if !ok || len(items) > maxLeasedItems {
		return false
	}
	now := l.now()
	for i := range items {
		if local&(1<<i) == 0 {
			continue
		}
		var a int64
		if actual != nil {
			a = max(actual[i], 0)
		}
		if d := items[i].Cost - a; d > 0 {
			if st := l.state(&items[i]); st != nil {

				st.give(d, now, at, true)
			}
		}
	}
	return true
}

// owe adds n to what the replica owes the key, within maxOwed.
func (st *leaseState) owe(n int64, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.debt == 0 {
		st.debtAge = now
	}
	st.debt = min(st.debt+n, maxOwed(&st.item.Limit))
}

// maxOwed is the most a replica owes a leased key: what a strict store
// holds beyond empty at most (two capacities of a meter's debt, one of a
// window's or a log's count), so that settlements far beyond their
// estimates leave the key spent, as strictly, and never wrap the debt.
func maxOwed(lim *Limit) int64 {
	if lim.Algorithm == TokenBucket || lim.Algorithm == GCRA {
		return 2 * lim.Capacity()
	}
	return lim.Capacity()
}

// SettleClaimed implements Claimer for a reservation none of whose items
// is leased, when the store is a Claimer: ErrUnclaimable otherwise.
func (l *Leased) SettleClaimed(ctx context.Context, id string, items []Item, actual []int64, c Claim) (bool, string, error) {
	if _, ok := l.store.(Claimer); !ok {
		return false, "", ErrUnclaimable
	}
	for i := range items {
		if items[i].Limit.Lease.On() {
			return false, "", ErrUnclaimable
		}
	}
	_, _, _ = l.unpend(id) // none of its units came from a lease
	l.stats.calls.Add(1)
	return SettleClaimed(ctx, l.store, id, items, actual, c)
}

// settleStrict settles or cancels (actual nil) the items of reservation id
// that local does not mark spent from leases, in one call of the store.
// It is apart from settle so that a reservation spent whole from leases
// allocates no buffers for the store's call.
func (l *Leased) settleStrict(ctx context.Context, id string, items []Item, actual []int64, local uint64) error {
	var ibuf [4]Item
	var abuf [4]int64
	strict, sact := ibuf[:0], abuf[:0]
	for i := range items {
		if local&(1<<i) == 0 {
			strict = append(strict, items[i])
			if actual != nil {
				sact = append(sact, actual[i])
			}
		}
	}
	if len(strict) == 0 {
		return nil
	}
	l.stats.calls.Add(1)
	if actual == nil {
		return l.store.Cancel(ctx, id, strict)
	}
	return l.store.Settle(ctx, id, strict, sact)
}

// settleUnknown settles a reservation this replica remembers nothing of:
// settled already, debited on another replica, or forgotten (Ended, or
// unsettled past maxPending). The store
// settles its items; a leased item, which may have been spent from a
// lease (and so has no reservation in the store to refund, or was
// refunded once already), is charged what its actual cost exceeds its
// estimate, never refunded: a second settle, here or on another replica,
// cannot give back twice.
func (l *Leased) settleUnknown(ctx context.Context, id string, items []Item, actual []int64) error {
	nl := 0
	for i := range items {
		if items[i].Limit.Lease.On() {
			nl++
		}
	}
	l.stats.calls.Add(1)
	if nl == 0 {
		if actual == nil {
			return l.store.Cancel(ctx, id, items)
		}
		return l.store.Settle(ctx, id, items, actual)
	}
	if actual == nil {
		var ibuf [4]Item
		rest := ibuf[:0]
		for i := range items {
			if !items[i].Limit.Lease.On() {
				rest = append(rest, items[i])
			}
		}
		if len(rest) == 0 {
			return nil
		}
		return l.store.Cancel(ctx, id, rest)
	}
	a := make([]int64, len(items))
	for i := range items {
		a[i] = actual[i]
		if items[i].Limit.Lease.On() {
			a[i] = max(actual[i], items[i].Cost)
		}
	}
	return l.store.Settle(ctx, id, items, a)
}

// pending remembers, until they are settled or cancelled, the
// reservations that spent leased units here, and which of their items did.
type pending struct {
	mu sync.Mutex
	m  map[string]pendingReq
}

type pendingReq struct {
	local uint64    // items spent from leases
	at    time.Time // when they were spent
}

// maxPending is how long a reservation that spent leased units is
// remembered unsettled: past it, its Settle goes to the store alone.
const maxPending = 2 * time.Hour

func (l *Leased) shard(id string) *pending {
	return &l.pends[maphash.String(l.seed, id)%uint64(len(l.pends))]
}

func (l *Leased) pend(id string, local uint64, at time.Time) {
	p := l.shard(id)
	p.mu.Lock()
	if p.m == nil {
		p.m = map[string]pendingReq{}
	}
	p.m[id] = pendingReq{local: local, at: at}
	p.mu.Unlock()
}

// Ended tells l that reservation id ended at its estimate, for which its
// caller makes no Settle (nothing to charge or refund): l forgets which of
// its items were spent from leases. A caller that skips such a Settle
// without Ended leaves the reservation remembered for maxPending.
func (l *Leased) Ended(id string) {
	_, _, _ = l.unpend(id)
}

func (l *Leased) unpend(id string) (local uint64, at time.Time, ok bool) {
	p := l.shard(id)
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.m[id]
	if ok {
		delete(p.m, id)
	}
	return r.local, r.at, ok
}

// Local tells whether this replica's leases held all n items of
// reservation id, so that settling or cancelling it calls no store.
func (l *Leased) Local(id string, n int) bool {
	if n > maxLeasedItems {
		return false
	}
	p := l.shard(id)
	p.mu.Lock()
	r, ok := p.m[id]
	p.mu.Unlock()
	return ok && bits.OnesCount64(r.local) == n
}

// Renew implements Store: leased items hold nothing to renew.
func (l *Leased) Renew(ctx context.Context, id string, items []Item) error {
	l.stats.calls.Add(1)
	return l.store.Renew(ctx, id, items)
}

// Peek implements Store. It asks the store, where the units leased by the
// replicas count as spent until their leases end or expire, and adds to a
// leased item's Remaining what this replica's leases of its key hold
// unspent (less its debt), which a Debit here spends first: the item fits
// when the two together hold its cost. What other replicas hold unspent
// is not known here and stays counted as spent (see Leases).
func (l *Leased) Peek(ctx context.Context, items []Item) (Result, error) {
	l.stats.calls.Add(1)
	res, err := l.store.Peek(ctx, items)
	if err != nil || len(res.Items) != len(items) {
		return res, err
	}
	held := false
	for i := range items {
		if !items[i].Limit.Lease.On() {
			continue
		}
		h := l.Unspent(items[i])
		if h <= 0 {
			continue
		}
		is := &res.Items[i]
		is.Remaining = min(is.Remaining+h, max(items[i].Limit.Capacity(), is.Remaining))
		if !is.Allowed && is.Remaining >= items[i].Cost {
			is.Allowed, is.RetryAfter = true, 0
		}
		held = true
	}
	if held {
		res.decide()
	}
	return res, nil
}

// Reset implements Store: it forgets this replica's leases of the items'
// keys and empties the limits in the store.
func (l *Leased) Reset(ctx context.Context, items []Item) error {
	l.mu.Lock()
	for i := range items {
		k := stateKeyOf(&items[i])
		if _, ok := l.keys[k]; ok {
			l.forget(k, items[i].Key)
		}
	}
	l.mu.Unlock()
	l.stats.calls.Add(1)
	return l.store.Reset(ctx, items)
}

// Restore implements Restorer when the inner store does. A leased item's
// counted amount is raised by what this replica holds unspent of the
// key's leases (those of its current window, for a window): the store
// counted them spent when they were taken, a store that lost its data no
// longer does, and the caller's count of what was spent (the ledger's)
// cannot hold units not spent yet. So the replica that restores goes on
// spending its leases without the key admitting them twice. (Another
// replica's leases are not known here: see Leased for what they add.)
// A counter the store holds already above the sum is left alone, so a
// restore of a store that lost nothing charges nothing twice.
func (l *Leased) Restore(ctx context.Context, items []Item, counted []int64) error {
	return l.restore(ctx, items, counted, true)
}

// RestoreCounters implements Restorer: Restore without the markers, the
// counted amounts raised as Restore raises them.
func (l *Leased) RestoreCounters(ctx context.Context, items []Item, counted []int64) error {
	return l.restore(ctx, items, counted, false)
}

// RestoreStage implements StagedRestorer, the counted amounts raised as
// Restore raises them. Over an inner store that is no StagedRestorer, a
// stage is a RestoreCounters, its last a Restore.
func (l *Leased) RestoreStage(ctx context.Context, items []Item, counted []int64, s Stage) error {
	return l.restoreAs(ctx, items, counted, s.Last, &s)
}

// restore is Restore, the markers written when mark is set.
func (l *Leased) restore(ctx context.Context, items []Item, counted []int64, mark bool) error {
	return l.restoreAs(ctx, items, counted, mark, nil)
}

// restoreAs is restore, as stage s when s is not nil.
func (l *Leased) restoreAs(ctx context.Context, items []Item, counted []int64, mark bool, s *Stage) error {
	r, ok := l.store.(Restorer)
	if !ok {
		return fmt.Errorf("weighted: %T keeps no generations to restore", l.store)
	}
	if len(counted) == len(items) {
		var held []int64
		now := l.now()
		for i := range items {
			it := &items[i]
			if !it.Limit.Lease.On() || counted[i] < 0 {
				continue // a negative count is the store's to refuse
			}
			st := l.known(it)
			if st == nil {
				continue
			}
			st.mu.Lock()
			st.expire(now)
			u := st.avail()
			// Units leased before spend this replica's leases did not
			// see (a budget renamed and back, made monthly and back: the
			// spend went to another counter meanwhile) overlap the
			// ledger's count: the leases keep only what fits the
			// capacity above it. The rest is taken as spent, and the
			// counter holds it: it refuses rather than admits twice.
			// Neither difference overflows, as the capacity and the count
			// are not negative: a count the ledger saturated cuts the
			// leases whole, even when they hold more than the capacity
			// (taken under a larger one before a reload).
			if keep := min(u, max(it.Limit.Capacity()-counted[i], 0)); keep < u {
				st.spend(u - keep)
				u = st.avail()
			}
			st.mu.Unlock()
			if u <= 0 {
				continue
			}
			if held == nil {
				held = slices.Clone(counted)
			}
			held[i] = min(counted[i]+u, max(it.Limit.Capacity(), counted[i]))
		}
		if held != nil {
			counted = held
		}
	}
	l.stats.calls.Add(1)
	if sr, ok := r.(StagedRestorer); ok && s != nil {
		return sr.RestoreStage(ctx, items, counted, *s)
	}
	if !mark {
		return r.RestoreCounters(ctx, items, counted)
	}
	return r.Restore(ctx, items, counted)
}

// sweeper returns the leases past their TTL, charges debts left unpaid
// and forgets idle keys, every l.sweep, until Close.
func (l *Leased) sweeper() {
	t := time.NewTicker(l.sweep)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.sweepOnce(context.Background())
		}
	}
}

func (l *Leased) sweepOnce(ctx context.Context) {
	now := l.now()
	l.mu.RLock()
	states := make([]*leaseState, 0, len(l.keys))
	for _, st := range l.keys {
		states = append(states, st)
	}
	l.mu.RUnlock()
	for _, st := range states {
		st.mu.Lock()
		st.expire(now)
		ttl := st.item.Limit.Lease.Life()
		idle := len(st.leases) == 0 && len(st.ended) == 0 && st.debt == 0 && st.fetching == nil &&
			now.Sub(st.lastUsed) > 10*ttl && !now.Before(st.spentUntil)
		debt := int64(0)
		if st.debt > 0 && len(st.leases) == 0 && now.Sub(st.debtAge) > ttl {
			debt, st.debt = st.debt, 0
		}
		st.mu.Unlock()
		if debt > 0 {
			_ = l.chargeDebt(ctx, st, debt)
		}
		_ = l.returnEnded(ctx, st, false)
		if idle {
			l.mu.Lock()
			k := stateKeyOf(&st.item)
			if l.keys[k] == st {
				st.mu.Lock()
				if len(st.leases) == 0 && len(st.ended) == 0 && st.fetching == nil && st.debt == 0 && now.Sub(st.lastUsed) > 10*ttl {
					l.forget(k, st.item.Key)
					// A request that found it before it went takes from it
					// no more: as a retired state, it debits strictly, and a
					// lease it was taking goes back at once. A lease held by
					// a state nobody finds would be spent by nobody and
					// returned only when it expires in the store.
					st.retired = true
				}
				st.mu.Unlock()
			}
			l.mu.Unlock()
		}
	}
	_ = l.returnRetired(ctx)
	for i := range l.pends {
		p := &l.pends[i]
		p.mu.Lock()
		for id, r := range p.m {
			if now.Sub(r.at) > maxPending {
				delete(p.m, id)
			}
		}
		p.mu.Unlock()
	}
}

// returnRetired returns the leases of the states retired by a change of
// their limit, and forgets those that hold none.
func (l *Leased) returnRetired(ctx context.Context) error {
	l.mu.RLock()
	retired := slices.Clone(l.retired)
	l.mu.RUnlock()
	if len(retired) == 0 {
		return nil
	}
	var errs []error
	for _, st := range retired {
		if err := l.returnEnded(ctx, st, true); err != nil {
			errs = append(errs, err)
		}
	}
	l.mu.Lock()
	n := 0
	for _, st := range l.retired {
		st.mu.Lock()
		busy := len(st.ended) > 0 || st.fetching != nil
		st.mu.Unlock()
		if busy {
			l.retired[n] = st
			n++
		}
	}
	clear(l.retired[n:])
	l.retired = l.retired[:n]
	l.mu.Unlock()
	return errors.Join(errs...)
}

// returnEnded settles st's ended leases: each gives back what it did not
// spend. A lease whose window has ended has nothing to give back, unless
// all is set (Close), when every lease held goes back.
func (l *Leased) returnEnded(ctx context.Context, st *leaseState, all bool) error {
	if st.keep {
		return l.reportEnded(ctx, st, all)
	}
	st.mu.Lock()
	ended := st.ended
	st.ended = nil
	st.mu.Unlock()
	var errs []error
	for _, h := range ended {
		if h.used >= h.granted || (h.window && !all && !l.now().Before(h.expires)) {
			continue
		}
		it := st.item
		it.Cost = h.granted
		l.stats.calls.Add(1)
		if err := l.store.Settle(ctx, h.id, []Item{it}, []int64{max(h.used, 0)}); err != nil {
			errs = append(errs, err)
			continue
		}
		l.stats.returned.Add(1)
	}
	return errors.Join(errs...)
}

// reports returns, for a LeaseStore, the reports a call on st's key
// carries: the leases ended, done, which it takes from st.ended, and
// what was spent of those held since the store last heard. unreport puts
// them back when the call fails.
func (st *leaseState) reports(buf []LeaseReport) []LeaseReport {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, h := range st.ended {
		buf = append(buf, LeaseReport{Seq: h.seq, Used: max(h.used, 0), Done: true})
	}
	st.ended = st.ended[:0]
	for i := range st.leases {
		h := &st.leases[i]
		if h.used > h.reported {
			buf = append(buf, LeaseReport{Seq: h.seq, Used: h.used})
			h.reported = h.used
		}
	}
	return buf
}

func (st *leaseState) unreport(reps []LeaseReport) {
	if len(reps) == 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, r := range reps {
		if r.Done {
			st.ended = append(st.ended, heldLease{seq: r.Seq, granted: r.Used, used: r.Used, reported: -1})
			continue
		}
		for i := range st.leases {
			if st.leases[i].seq == r.Seq {
				st.leases[i].reported = 0
			}
		}
	}
}

// reportEnded reports st's ended leases done to the LeaseStore, in one
// call that takes no lease, once one of them has reached its end (a lease
// spent whole waits there for the next lease's call to carry its report),
// or at once when all is set (Close).
func (l *Leased) reportEnded(ctx context.Context, st *leaseState, all bool) error {
	now := l.now()
	st.mu.Lock()
	due := all
	for _, h := range st.ended {
		due = due || !now.Before(h.expires)
	}
	st.mu.Unlock()
	if !due {
		return nil
	}
	reps := st.reports(nil)
	if len(reps) == 0 {
		return nil
	}
	it := st.item
	it.Cost = 0
	l.stats.calls.Add(1)
	if _, err := l.ls.Lease(ctx, it, LeaseCall{Prefix: l.prefix, TTL: it.Limit.Lease.Life(), Reports: reps}); err != nil {
		st.unreport(reps)
		return err
	}
	for _, r := range reps {
		if r.Done {
			l.stats.returned.Add(1)
		}
	}
	return nil
}
