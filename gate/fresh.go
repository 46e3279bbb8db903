package gate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// store is what a freshStore wraps: a limiter store that keeps generation
// markers, and so reports a tenant's counters stale (weighted.ErrStale)
// until they are restored.
type store interface {
	weighted.Store
	weighted.Restorer
}

// freshStore is a limiter store whose counters are never used before they
// are brought up to the ledger. Its store keeps a generation marker per
// tenant (the keys' hash tag): a store that starts empty, a Redis that
// restarted empty, was flushed or failed over to a replica that lags, or
// the local fallback taking over, answers the first call that touches a
// tenant with weighted.ErrStale and changes nothing. The freshStore then
// restores that tenant, in one atomic call, from the ledger's spend
// (every budget of every key of the tenant raised to what the ledger
// says was spent this period, divided by share for the fallback) and
// retries the call. So no request is charged against a counter that has
// not been brought up to the ledger's spend, and a restart, a data loss
// and a failover all give the same answer. So are the limits keyed by the
// caller (compiledLimit.restorable), alone or with the model, route,
// upstream, region, address or attributes, in dollars, requests or
// tokens, to what the entries of the caller (and of the model, route,
// upstream, region, address or attributes its key names) counted in their
// window, and the limits of the whole deployment
// (keyed by model, route, upstream, the region, address or attributes, or
// by nothing) under their own tag, to what every tenant's entries counted
// (restoreGlobal), sliding logs included (their count as one mark at the
// restore's time, which stops counting a period later, no sooner than the
// spend it stands for: see weighted.Restorer). A concurrency limit is not
// restored: its holders renew their slots (see restored). A front door's
// own limits under the tenant's tag (the rate limit service's descriptor
// limits of a descriptor that names the tenant) are restored after a loss
// from the counters the tenant's entries record (descCounters); under
// another tag (a descriptor that names no tenant, under its domain's
// tag) from the tallies whose tenant is that tag (see
// Reservation.TallyShared), which the restore of the tag, as a tenant's,
// reads the same way.
//
// It is safe for concurrent use: concurrent calls that find one tenant
// stale share one restore.
type freshStore struct {
	store
	g     *Gate
	share int64 // the counters are the ledger's spend divided by share
	group singleflight.Group
	lost  losses // the tags restored after a loss (see losses)
}

var _ weighted.Store = (*freshStore)(nil)

func (g *Gate) fresh(st store, share int64) *freshStore {
	return &freshStore{store: st, g: g, share: max(share, 1)}
}

// ErrSpendUnknown is a restore's error when the ledger's database cannot
// be read and this node does not know what it holds of a fail-closed
// budget's period (ledger.LocalSpendError.Unknown): no read of that spend
// since the ledger opened. A counter restored from this node's records
// alone would forget the spend already in the database, so the restore
// fails, and the requests that need it are refused (503) until the
// database answers. A fail-open budget (the default) is restored from
// what this node knows: it keeps serving, and may admit again what the
// database holds of its period.
var ErrSpendUnknown = errors.New("gate: the ledger's database cannot be read, and this node has not read the spend it holds")

// knownSpend is err, a ledger read's error, for a restore of a budget
// (failClosed: a fail-closed one): nil when the read answered, or
// answered from this node's records (see ErrSpendUnknown).
func knownSpend(err error, failClosed bool) error {
	var local *ledger.LocalSpendError
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &local):
		return err
	case local.Unknown && failClosed:
		return fmt.Errorf("%w: %w", ErrSpendUnknown, err)
	}
	return nil
}

// maxRestores bounds the restores one call may need: on Redis Cluster a
// stale answer names one tag at a time.
const maxRestores = 4

func (f *freshStore) Debit(ctx context.Context, id string, items []weighted.Item) (res weighted.Result, err error) {
	return f.DebitInto(ctx, id, items, nil)
}

// DebitInto is Debit with the result's item states kept in states where
// the store can (see weighted.Leased.DebitInto): a decision taken from
// leases held then allocates nothing.
func (f *freshStore) DebitInto(ctx context.Context, id string, items []weighted.Item, states []weighted.ItemState) (res weighted.Result, err error) {
	f.catchUp(ctx, items)
	for range maxRestores {
		sent := f.lost.mark()
		res, err = f.debitOnce(ctx, id, items, states)
		if !f.restored(ctx, items, err, sent) {
			return res, err
		}
	}
	return f.debitOnce(ctx, id, items, states)
}

func (f *freshStore) debitOnce(ctx context.Context, id string, items []weighted.Item, states []weighted.ItemState) (weighted.Result, error) {
	if sd, ok := f.store.(weighted.StatesDebiter); ok {
		return sd.DebitInto(ctx, id, items, states)
	}
	return f.store.Debit(ctx, id, items)
}

// SettleClaimed settles and claims in one call (see weighted.Claimer);
// ErrUnclaimable when its store cannot. A claim that the store may have
// lost with a tag's state (a stale answer) is no evidence that the
// reservation is open: the tags are restored, which has every replica
// write its ledger records, and the call fails with errClaimsLost, for
// its caller to ask the ledger how the reservation ended before it claims
// again.
func (f *freshStore) SettleClaimed(ctx context.Context, id string, items []weighted.Item, actual []int64, c weighted.Claim) (bool, string, error) {
	sent := f.lost.mark()
	won, prior, err := weighted.SettleClaimed(ctx, f.store, id, items, actual, c)
	if f.restored(ctx, items, err, sent) {
		return false, "", errClaimsLost
	}
	return won, prior, err
}

// errClaimsLost is freshStore.SettleClaimed's error when the store had
// lost the claims of the reservation's tags, now restored.
var errClaimsLost = errors.New("gate: the limiter store lost the claims of held reservations; restored")

func (f *freshStore) Peek(ctx context.Context, items []weighted.Item) (res weighted.Result, err error) {
	f.catchUp(ctx, items)
	for range maxRestores {
		sent := f.lost.mark()
		res, err = f.store.Peek(ctx, items)
		if !f.restored(ctx, items, err, sent) {
			return res, err
		}
	}
	return f.store.Peek(ctx, items)
}

// restored restores the tags err names stale, and tells whether the call
// should be tried again. A restore that fails leaves err as it was: the
// caller sees the stale answer, which is no store failure (the breaker
// does not count it) and no decision. A restore made renews this
// replica's reservations in flight that hold a concurrency item of the
// tag (renewer.renewTag): a concurrency limit is not restored from the
// ledger, it counts again what is in flight as its holders renew (see
// weighted.Store.Renew), this replica's before the call is retried, the
// other replicas' at their next renewal. A tag restored since the call
// was sent, or being restored then (sent is losses.mark's), is not
// restored again: the call is tried again, and a stale answer then is a
// loss of its own.
func (f *freshStore) restored(ctx context.Context, items []weighted.Item, err error, sent uint32) bool {
	if err == nil {
		return false // before se, which escapes: no allocation per call
	}
	var se *weighted.StaleError
	if !errors.As(err, &se) {
		return false
	}
	for _, tag := range se.Tags {
		// The call's items under this tag, found by their keys: restoring
		// a tag writes its marker, so another tag's items must not ride
		// along, and one of its items left out would leave the marker
		// unwritten when the tag has no budget (the call stale again).
		var mine []weighted.Item
		for _, it := range items {
			if weighted.HashTag(it.Key) == tag {
				mine = append(mine, it)
			}
		}
		if len(mine) == 0 {
			return false // not this call's tag: a restore would not help it
		}
		_, rerr, _ := f.group.Do(tag, func() (any, error) {
			if f.lost.restoredSince(sent, tag) {
				return nil, nil // its stale answer came before that restore
			}
			defer f.lost.end(f.lost.begin(tag)) // before the ledger is read
			var err error
			if tag == globalTag {
				err = f.restoreGlobal(ctx, mine)
			} else {
				err = f.restore(ctx, tag, mine, true)
			}
			f.g.tel.Reconcile(telemetry.ReconcileStale, err)
			if err == nil && f.g.renewer != nil {
				// This replica's holds under tag, lost with the
				// counters, are back before the call is decided.
				f.g.renewer.renewTag(ctx, f, tag)
			}
			return nil, err
		})
		if rerr != nil {
			f.g.log.Warn("limiter counters could not be restored from the ledger", "tenant", tag, "err", rerr)
			return false
		}
	}
	return true
}

// restoreGlobal brings the counters of the limits of the whole
// deployment (see globalLimit), which share the hash tag globalTag, up
// to what the ledger says every tenant spent or counted in their window,
// and writes the tag's marker: a store restarted empty or flushed lost
// them with every tenant's. extra are more items under the tag, restored
// as they are.
//
// A spend cap (compiledLimit.spendCap) is read from the ledger's
// roll-up (Ledger.TotalSpend); when the ledger's database cannot give it,
// a fail-open one is restored at 0 and a fail-closed one fails the
// restore. The other limits, and a spend cap with regions, are restored
// as ledgerGroupCounters reads them: each counter from the entries its
// key names, this region's only with regions (each region's store counts
// its own), from what this node knows while the database is out.
func (f *freshStore) restoreGlobal(ctx context.Context, extra []weighted.Item) error {
	if err := f.g.ledgerCaughtUp(ctx, true, f.lossNote(globalTag)...); err != nil {
		return err
	}
	st := f.g.state.Load()
	var (
		items   []weighted.Item
		counted []int64
		seen    = map[string]bool{}
		now     = time.Now()
	)
	for _, l := range st.limits {
		if !l.spendCap() || f.g.regions != nil {
			continue
		}
		it := weighted.Item{Limit: l.limit, Key: l.key(&Reservation{st: st})}
		seen[it.Limit.Name+"\x00"+it.Key] = true
		spent, err := f.g.ledger.TotalSpend(ctx, l.spentSince(now), now.AddDate(100, 0, 0))
		switch {
		case err != nil && l.failClosed:
			return fmt.Errorf("gate: restore of the global limit %s: %w", l.limit.Name, err)
		case err != nil:
			// Fail-open: restored from nothing rather than refusing
			// every request until the database answers.
			f.g.log.Warn("a global limit's counter restored without the ledger's spend", "limit", l.limit.Name, "err", err)
			spent = 0
		}
		items, counted = append(items, it), append(counted, int64(spent)/f.share)
	}
	grouped, groupedSpent, err := f.g.ledgerGroupCounters(ctx, st, "", seen, f.share)
	if err != nil {
		return err
	}
	items, counted = append(items, grouped...), append(counted, groupedSpent...)
	items, counted, _ = extraCounters(items, counted, seen, extra, func(weighted.Item) (int64, error) { return 0, nil })
	if f.share > 1 {
		items = fallbackItems(items, f.share)
	}
	if err := f.store.Restore(ctx, items, counted); err != nil {
		return fmt.Errorf("gate: restore of the global limits: %w", err)
	}
	for i, it := range items {
		if counted[i] > 0 {
			f.g.log.Info("global limit counter restored from the ledger", "limit", it.Limit.Name, "key", it.Key, "counted", counted[i], "share", f.share)
		}
	}
	return nil
}

// restore brings tenant's counters up to the ledger's spend; extra are
// more items under its tag, restored as they are (so that a tenant without
// budgets is marked fresh too). lost tells that the store lost the
// tenant's counters (a stale answer), rather than a scheduled check.
//
// The counters are those of the callers the gate lists (budgetCounters),
// of the callers the ledger knows (ledgerCounters: users and keys that
// only the rate limit service or the reserve API names), of the control
// plane's levels, after a loss those of the limits keyed by the caller
// (limitCounters, ledgerLimitCounters) and by model, route or upstream
// (ledgerGroupCounters), and extra. Its cost: a few reads of the ledger per
// budget period (see ledgerCounters), a read per listed caller and
// budget, and one Redis call that restores every counter of the tenant
// at once. Past restoreBatch of the ledger's callers, the others go in
// calls of restoreBatch before it, which write no marker: the tenant
// stays stale until the last call, so that no request is decided on a
// counter not yet restored (one call of every counter would hold Redis
// for every tenant). Only the restore of a loss (lost) writes the
// tenant's marker: a scheduled one leaves the limits it does not count
// as the store holds them, and on a store that lost them and that no
// request has found stale yet, its marker would leave them at 0; it
// raises the counters and leaves the tenant stale, for the first request
// to restore whole.
func (f *freshStore) restore(ctx context.Context, tenant string, extra []weighted.Item, lost bool) error {
	var note []string
	if lost {
		note = f.lossNote(tenant)
	}
	if err := f.g.ledgerCaughtUp(ctx, lost, note...); err != nil {
		return err
	}
	seen := map[string]bool{}
	items, counted, err := f.g.budgetCounters(ctx, tenant, lost, f.share, seen)
	if err != nil {
		return err
	}
	budgets := len(items) // the configured budgets; the items after these are the levels' and extra
	st := f.g.state.Load()
	known, knownSpent, err := f.g.ledgerCounters(ctx, st, tenant, seen, lost, f.share)
	if err != nil {
		return err
	}
	knownBudgets := len(known) // the ledger's callers' budgets; those after, their limits'
	if items, counted, err = f.g.levelCounters(ctx, tenant, items, counted, seen, f.share); err != nil {
		return err
	}
	if lost {
		// A scheduled check leaves limits alone: a token bucket's
		// counter holds less than the spend its restore counts.
		if items, counted, err = f.g.limitCounters(ctx, st, tenant, items, counted, seen, f.share); err != nil {
			return err
		}
		lk, lkSpent, err := f.g.ledgerLimitCounters(ctx, st, tenant, seen, f.share)
		if err != nil {
			return err
		}
		// Batched with the ledger's callers of budgets, after them.
		known, knownSpent = append(known, lk...), append(knownSpent, lkSpent...)
		lg, lgSpent, err := f.g.ledgerGroupCounters(ctx, st, tenant, seen, f.share)
		if err != nil {
			return err
		}
		known, knownSpent = append(known, lg...), append(knownSpent, lgSpent...)
		ld, ldSpent, err := f.g.descCounters(ctx, st, tenant, extra, seen, f.share)
		if err != nil {
			return err
		}
		known, knownSpent = append(known, ld...), append(knownSpent, ldSpent...)
	}
	items, counted, err = extraCounters(items, counted, seen, extra, func(it weighted.Item) (int64, error) {
		return f.g.extraSpent(ctx, st, tenant, it, lost, f.share)
	})
	if err != nil {
		return err
	}
	if f.share > 1 {
		// The counted amounts are the share's already (see shareOf).
		items, known = fallbackItems(items, f.share), fallbackItems(known, f.share)
	}
	// The last restoreBatch of the ledger's callers ride with the rest in
	// the last call, which marks the tenant fresh; those before them, in
	// calls of restoreBatch first, which leave it stale. After a loss,
	// the calls are the stages of one restore (weighted.StagedRestorer),
	// each of which finds the one before it still in the store, or fails:
	// a store that lost its data again between them lost the counters the
	// first calls raised, and a last call that marked the tenant fresh
	// left those at zero (1,024 users who had spent their budget each
	// spent it again, TestRestoreSplitAtkLossBetweenTheCalls).
	last := max(len(known)-restoreBatch, 0)
	staged, _ := f.store.(weighted.StagedRestorer)
	var stage weighted.Stage
	if lost && last > 0 && staged != nil && oneTag(tenant, items, known) {
		stage.ID = newClaimToken()
	}
	for i := 0; i < last; i += restoreBatch {
		j := min(i+restoreBatch, last)
		var err error
		if stage.ID != "" {
			err = staged.RestoreStage(ctx, known[i:j], knownSpent[i:j], stage)
			stage.Step++
		} else {
			err = f.store.RestoreCounters(ctx, known[i:j], knownSpent[i:j])
		}
		if err != nil {
			return fmt.Errorf("gate: restore %s: %w", tenant, err)
		}
	}
	all := append(items[:len(items):len(items)], known[last:]...)
	if len(all) > 0 {
		restore := f.store.RestoreCounters
		switch {
		case stage.ID != "":
			stage.Last = true
			restore = func(ctx context.Context, items []weighted.Item, counted []int64) error {
				return staged.RestoreStage(ctx, items, counted, stage)
			}
		case lost:
			restore = f.store.Restore
		}
		if err := restore(ctx, all, append(counted[:len(counted):len(counted)], knownSpent[last:]...)); err != nil {
			return fmt.Errorf("gate: restore %s: %w", tenant, err)
		}
	}
	if f == f.g.store {
		f.g.budgetRemaining(tenant, append(items[:budgets:budgets], known[:knownBudgets]...), append(counted[:budgets:budgets], knownSpent[:knownBudgets]...))
	}
	for i, it := range items[:budgets] {
		if counted[i] > 0 {
			f.g.log.Info("budget counter restored from the ledger", "limit", it.Limit.Name, "key", it.Key,
				"ledger_nano_usd", counted[i], "share", f.share)
		}
	}
	if len(known) > 0 {
		f.g.log.Info("budget counters of the ledger's callers restored", "tenant", tenant, "counters", len(known), "share", f.share)
	}
	return nil
}

// oneTag tells whether every item of the lists is under hash tag tag: the
// stages of a restore each check the tags the first noted.
func oneTag(tag string, lists ...[]weighted.Item) bool {
	for _, l := range lists {
		for i := range l {
			if weighted.HashTag(l[i].Key) != tag {
				return false
			}
		}
	}
	return true
}

// restoreBatch bounds the ledger's callers' counters one Redis call of a
// restore carries (see restore).
const restoreBatch = 1024

// maxLedgerCallers bounds the counters of the ledger's callers one
// restore writes (see ledgerCounters): the most spent first. Past it,
// the least spent come back at 0, each able to spend its budget once
// more; a warning says so.
const maxLedgerCallers = 16 * restoreBatch

// ledgerCounters returns an item for every configured budget of tenant
// keyed by one caller (its tenant, user or key) whose key is not among
// seen but whose caller the ledger says spent this period, with that
// spend, and marks them seen: the users and keys that only the rate limit
// service or the reserve API names, which no list holds, and the tenant of
// a tenant known only from those. Without them a restore left those
// counters at 0 under a fresh generation marker once one request had
// restored the tenant, and each such caller spent its budget again.
//
// Its reads of the ledger do not grow with the callers: per budget period
// (day, month), one of the spend by user and one by key (each a single
// grouped query of the roll-up) and one of the tenant's; with regions,
// one more per caller (as budgetSpent reads a listed caller's). It
// returns at most maxLedgerCallers items, one a caller and budget with
// spend. The budgets of the tenant's
// plan when the gate knows it (the configuration's, the control plane's),
// else every plan's budgets: the rate limit service names a plan with
// each request, and a counter no request of the tenant debits costs a
// Redis key. While the ledger's database is out, the spend is what this
// node knows. The amounts are a fallback's of share replicas (see
// shareOf).
func (g *Gate) ledgerCounters(ctx context.Context, st *state, tenant string, seen map[string]bool, lost bool, share int64) ([]weighted.Item, []int64, error) {
	plan, planKnown := g.tenantPlan(st, tenant)
	type read struct{ dim, period string }
	type answer struct {
		v   map[string]costmodel.NanoUSD
		err error // the read's, a *ledger.LocalSpendError
	}
	reads := map[read]answer{}
	now := time.Now()
	spendBy := func(l *compiledLimit) (map[string]costmodel.NanoUSD, error) {
		dim, period := l.dims[0], l.period
		r := read{dim, period}
		if a, ok := reads[r]; ok {
			return a.v, knownSpend(a.err, l.failClosed)
		}
		from, to, err := ledger.Period(period, now, time.UTC)
		if err != nil {
			return nil, err
		}
		v, err := g.spendOfEach(ctx, tenant, dim, from, to)
		if err := knownSpend(err, false); err != nil {
			return nil, fmt.Errorf("gate: spend of %s by %s: %w", tenant, dim, err)
		}
		if share > 1 {
			var local *ledger.LocalSpendError
			errors.As(err, &local)
			shared := make(map[string]costmodel.NanoUSD, len(v))
			for id, spent := range v {
				var pending costmodel.NanoUSD
				if local != nil {
					pending = local.PendingOf(id)
				}
				shared[id] = costmodel.NanoUSD(shareOf(spent, pending, share))
			}
			v = shared
		}
		reads[r] = answer{v, err}
		if err := knownSpend(err, l.failClosed); err != nil {
			return nil, fmt.Errorf("gate: spend of %s by %s: %w", tenant, dim, err)
		}
		return v, nil
	}
	type counter struct {
		l     *compiledLimit
		c     *Caller
		key   string
		spent int64 // -1: to be read (budgetSpent)
	}
	var found []counter
	for _, l := range st.limits {
		if !l.budget || l.fixedKey != "" || len(l.dims) != 1 || planKnown && !l.appliesTo(plan) {
			continue
		}
		add := func(c *Caller, spent int64) {
			if key := l.callerKey(c); !seen[l.limit.Name+"\x00"+key] && weighted.HashTag(key) == tenant {
				found = append(found, counter{l, c, key, spent})
			}
		}
		switch l.dims[0] {
		case "tenant":
			add(&Caller{Tenant: tenant}, -1)
		case "user", "api_key":
			by, err := spendBy(l)
			if err != nil {
				return nil, nil, err
			}
			for id, v := range by {
				switch {
				case id == "" || v <= 0:
					// The counter of the callers without one is
					// budgetSpent's; a counter the store holds is at
					// least 0.
				case l.dims[0] == "user":
					add(&Caller{Tenant: tenant, User: id}, int64(v))
				default:
					add(&Caller{Tenant: tenant, KeyID: id}, int64(v))
				}
			}
		}
	}
	if len(found) > maxLedgerCallers {
		// The tenant's own counters (-1) first, then the most spent.
		slices.SortFunc(found, func(a, b counter) int {
			if (a.spent < 0) != (b.spent < 0) {
				return cmp.Compare(a.spent, b.spent)
			}
			return cmp.Compare(b.spent, a.spent)
		})
		g.log.Warn("a restore leaves out the budget counters of the ledger's least spent callers", "tenant", tenant,
			"callers", len(found), "restored", maxLedgerCallers)
		found = found[:maxLedgerCallers]
	}
	kept := found[:0]
	for _, c := range found {
		if c.spent < 0 || g.regions != nil {
			v, err := g.budgetSpent(ctx, st, c.l, c.c, c.key, lost, nil, share)
			if err != nil {
				return nil, nil, err
			}
			c.spent = v
		}
		if c.spent > 0 {
			seen[c.l.limit.Name+"\x00"+c.key] = true
			kept = append(kept, c)
		}
	}
	found = kept
	items, counted := make([]weighted.Item, len(found)), make([]int64, len(found))
	for i, c := range found {
		items[i], counted[i] = weighted.Item{Limit: c.l.limit, Key: c.key}, c.spent
	}
	return items, counted, nil
}

// budgetRemaining sets costgate.budget.remaining for each budget of
// tenant from the ledger's spend: the share left of its most spent key.
func (g *Gate) budgetRemaining(tenant string, items []weighted.Item, spent []int64) {
	least := map[string]float64{}
	for i, it := range items {
		c := it.Limit.Capacity()
		if c <= 0 {
			continue
		}
		r := float64(c-spent[i]) / float64(c)
		if old, ok := least[it.Limit.Name]; !ok || r < old {
			least[it.Limit.Name] = r
		}
	}
	for name, r := range least {
		g.tel.BudgetRemaining(name, tenant, r)
	}
}

// budgetCounters returns an item for every budget of every key of tenant
// under the active configuration, and what the ledger says each has spent
// this period. While the ledger's database is out, the spend is what this
// node knows (its last read plus what it recorded since). With regions,
// the spend is this region's (see Regions.spent; lost tells that the
// store lost its counters). The amounts are a fallback's of share
// replicas (see shareOf). It marks the counters in seen.
func (g *Gate) budgetCounters(ctx context.Context, tenant string, lost bool, share int64, seen map[string]bool) ([]weighted.Item, []int64, error) {
	st := g.state.Load()
	callers, userless := g.budgetCallers(st, tenant)
	return callerCounters(st, callers, seen, nil, nil,
		func(l *compiledLimit) bool { return l.budget },
		func(l *compiledLimit, c *Caller, key string) (int64, error) {
			return g.budgetSpent(ctx, st, l, c, key, lost, userless, share)
		})
}

// callerCounters appends to items an item for every limit of st that pick
// chooses, of every caller in callers whose plan it applies to, skipping
// the counters seen (and marking the rest), and to counted what spent says
// the caller spent of it.
func callerCounters(st *state, callers []*Caller, seen map[string]bool, items []weighted.Item, counted []int64,
	pick func(*compiledLimit) bool, spent func(l *compiledLimit, c *Caller, key string) (int64, error)) ([]weighted.Item, []int64, error) {
	for _, c := range callers {
		for _, l := range st.limits {
			if !pick(l) || !l.appliesTo(c.Plan) {
				continue
			}
			key := l.callerKey(c)
			if seen[l.limit.Name+"\x00"+key] {
				continue
			}
			seen[l.limit.Name+"\x00"+key] = true
			v, err := spent(l, c, key)
			if err != nil {
				return nil, nil, err
			}
			items, counted = append(items, weighted.Item{Limit: l.limit, Key: key}), append(counted, v)
		}
	}
	return items, counted, nil
}

// extraCounters appends to items the items of extra whose counters are
// not among seen (marking them), at cost 0, and to counted what spent says
// was spent of each.
func extraCounters(items []weighted.Item, counted []int64, seen map[string]bool, extra []weighted.Item,
	spent func(weighted.Item) (int64, error)) ([]weighted.Item, []int64, error) {
	for _, it := range extra {
		if seen[it.Limit.Name+"\x00"+it.Key] {
			continue
		}
		seen[it.Limit.Name+"\x00"+it.Key] = true
		it.Cost = 0
		v, err := spent(it)
		if err != nil {
			return nil, nil, err
		}
		items, counted = append(items, it), append(counted, v)
	}
	return items, counted, nil
}

// ledgerCaughtUp returns once the ledger's store holds this replica's
// records, and with lost (the store lost counters that other replicas
// debited too) the other replicas' (see syncPeers): the records of
// requests admitted before the loss reach the ledger's store a batch
// later, or later still when the database is slow. Its error is ctx's.
// lossTags are the tags of the shared store restored after its loss,
// which the other replicas note (see losses).
func (g *Gate) ledgerCaughtUp(ctx context.Context, lost bool, lossTags ...string) error {
	if lost {
		if err := g.syncPeers(ctx, lossTags...); err != nil {
			return err
		}
	}
	if g.ledger.Stats().StoreErr == nil {
		// Not Flush: tallies (ledger.Tally) reach the store only at a
		// tick, so a store that went down since the last one is not
		// known yet, and the restore reads this node's records then.
		if err := g.ledger.FlushUnlessFailing(ctx); err != nil {
			g.log.Warn("ledger flush before a restore failed", "err", err)
		}
	}
	return nil
}

// budgetCallers returns the callers of tenant whose configured budgets the
// store counts: the configuration's keys of the tenant, and the control
// plane's keys of it (KeyLister), of a tenant of either, each under its
// tenant's plan; and the ids of those keys without a user, which share a
// per-user budget's counter. A restore that counted only the
// configuration's keys wrote back at 0 the counters of the control
// plane's users and keys, once one request had marked the tenant fresh.
func (g *Gate) budgetCallers(st *state, tenant string) (callers []*Caller, userless []string) {
	for _, t := range st.cfg.Tenants {
		if t.Name != tenant {
			continue
		}
		for _, k := range t.Keys {
			callers = append(callers, &Caller{Tenant: t.Name, User: k.User, KeyID: k.KeyID(), Plan: t.Plan, st: st})
		}
	}
	if d := g.dir.dir.Load(); d != nil {
		kl, lists := (*d).(KeyLister)
		if plan, known := g.tenantPlan(st, tenant); lists && known {
			for _, p := range kl.TenantKeys(tenant) {
				callers = append(callers, &Caller{Tenant: tenant, User: p.User, KeyID: p.KeyID, Plan: plan, st: st})
			}
		}
	}
	for _, c := range callers {
		if c.User == "" {
			userless = append(userless, c.KeyID)
		}
	}
	return callers, userless
}

// tenantPlan returns the plan of tenant, and whether the gate knows it:
// the configuration's, else the control plane's (a TenantDirectory).
func (g *Gate) tenantPlan(st *state, tenant string) (plan string, known bool) {
	if plan, ok := st.tenants[tenant]; ok {
		return plan, true
	}
	if d := g.dir.dir.Load(); d != nil {
		if td, ok := (*d).(TenantDirectory); ok {
			plan, _, known, _ = td.TenantPlan(tenant, time.Now())
		}
	}
	return plan, known
}

// budgetSpent is what the ledger says caller c spent of the configured
// budget l, whose key is key, this period (this region's share with
// regions; lost tells that the store lost its counters).
//
// The ledger reads an empty user or key as "every one": the counter of
// callers without a user (or key) counts the spend of userless, the keys
// that share it, one by one; without them, nothing (a loss may then admit
// its capacity once more, rather than the tenant's every user's spend
// refuse callers who spent none of it).
//
// It is a fallback's amount of share replicas (see shareOf); with
// regions, the region's spend divided by share.
func (g *Gate) budgetSpent(ctx context.Context, st *state, l *compiledLimit, c *Caller, key string, lost bool, userless []string, share int64) (int64, error) {
	queries := l.spendQueries(c, userless)
	if g.regions == nil {
		spent, err := g.sumSpend(ctx, l, c, queries, "", true, share)
		return max(spent, 0), err
	}
	spent, err := g.sumSpend(ctx, l, c, queries, "", true, 1)
	if err != nil {
		return 0, err
	}
	// The ledger's spend is every region's: this region's own entries
	// count apart (see Regions.spent).
	own, err := g.sumSpend(ctx, l, c, queries, st.cfg.Region, true, 1)
	if err != nil {
		return 0, err
	}
	return max(g.regions.spent(ctx, l.limit, key, spent, own, lost), 0) / max(share, 1), nil
}

// shareOf is what a counter of a fallback of share replicas counts of
// spend, which the ledger answered with pending of it from this node's
// records that its database does not hold yet (a *ledger.LocalSpendError's
// part spooled since its last read; 0 for the database's answer). Share
// 1, the limiter store's counter, counts spend whole. A fallback holds
// 1/share of each budget, so it counts 1/share of the spend the database
// holds, which every replica reads; but this node's pending records are
// this replica's own admissions, on the fallbacks of the outages since
// the database went out among them, and count whole: divided too, each
// outage forgot part of what this replica admitted on the last one's
// fallback, and a replica spent, over outages, the whole budget left.
func shareOf(spend, pending costmodel.NanoUSD, share int64) int64 {
	if share <= 1 {
		return int64(spend)
	}
	pending = min(max(pending, 0), max(spend, 0))
	return int64(spend-pending)/share + int64(pending)
}

// spendQueries are the ledger's queries whose spend, summed, is what
// caller c spent of the configured budget l this period (see
// budgetSpent).
func (l *compiledLimit) spendQueries(c *Caller, userless []string) []ledger.SpendQuery {
	q := ledger.SpendQuery{Tenant: c.Tenant, Period: l.period}
	byUser, byKey := slices.Contains(l.dims, "user"), slices.Contains(l.dims, "api_key")
	switch {
	case byKey && c.KeyID == "":
		return nil
	case byKey:
		q.KeyID = c.KeyID // a key has one user
	case byUser && c.User == "":
		var queries []ledger.SpendQuery
		for _, id := range userless {
			queries = append(queries, ledger.SpendQuery{Tenant: c.Tenant, Period: l.period, KeyID: id})
		}
		return queries
	case byUser:
		q.User = c.User
	}
	return []ledger.SpendQuery{q}
}

// sumSpend sums the ledger's spend of queries in l's unit (see spendOf),
// the entries of region only unless region is empty, each as a fallback
// of share replicas counts it (see shareOf). With local, an answer from
// this node's records stands, unless the spend is unknown (see
// knownSpend); without it, only the database's does.
func (g *Gate) sumSpend(ctx context.Context, l *compiledLimit, c *Caller, queries []ledger.SpendQuery, region string, local bool, share int64) (int64, error) {
	var sum costmodel.NanoUSD
	for _, q := range queries {
		q.Region = region
		spend, pending, err := g.spendOf(ctx, l, q)
		if local {
			err = knownSpend(err, l.failClosed)
		}
		if err != nil {
			return 0, fmt.Errorf("gate: spend of %s for %s: %w", c.Tenant, l.limit.Name, err)
		}
		v := costmodel.NanoUSD(shareOf(spend, pending, share))
		if sum += v; sum < v {
			sum = math.MaxInt64 // the ledger saturates a sum; so does this one
		}
	}
	return int64(sum), nil
}

// spendOf is what the ledger says the entries q selects spent in l's
// unit: their charges in dollars (Ledger.Spend), or what they counted
// in requests or tokens (Ledger.Counts); with pending, its part from
// this node's records the database does not hold yet (see shareOf), and
// the read's error, a *ledger.LocalSpendError for an answer from this
// node's records.
func (g *Gate) spendOf(ctx context.Context, l *compiledLimit, q ledger.SpendQuery) (spend, pending costmodel.NanoUSD, err error) {
	var le *ledger.LocalSpendError
	if l.unit == "usd" {
		spend, err = g.ledger.Spend(ctx, q)
		if errors.As(err, &le) {
			pending = le.Pending
		}
		return spend, pending, err
	}
	c, err := g.ledger.Counts(ctx, q)
	if errors.As(err, &le) {
		pending = costmodel.NanoUSD(l.ledgerCount(le.PendingCounts))
	}
	return costmodel.NanoUSD(l.ledgerCount(c)), pending, err
}

// regionSpent is what the ledger says region spent of the configured
// budget named budget.Name for key this period (Regions.Spent): its
// caller's spend as budgetSpent reads it, the region's entries only; 0
// for a key no configured budget's caller has. Only the database's
// answer will do: what this node knows says nothing of another region's
// spend, and a region's cap counts its answer for the whole period.
func (g *Gate) regionSpent(ctx context.Context, budget weighted.Limit, key, region string) (int64, error) {
	l, c, ok := g.state.Load().budgetOfKey(budget.Name, weighted.HashTag(key), key)
	if !ok {
		return 0, nil
	}
	return g.sumSpend(ctx, l, c, l.spendQueries(c, nil), region, false, 1)
}

// budgetOfKey finds the configured budget named name whose counter of a
// caller of tenant is key, and that caller.
func (st *state) budgetOfKey(name, tenant, key string) (*compiledLimit, *Caller, bool) {
	for _, l := range st.limits {
		if !l.budget || l.fixedKey != "" || l.limit.Name != name {
			continue
		}
		if c, ok := l.callerOfKey(tenant, key); ok {
			return l, c, true
		}
	}
	return nil, nil, false
}

// extraSpent is what the ledger says was spent of item it, a counter of
// tenant's that the request found stale: for a configured budget of a
// caller the configuration does not list (a tenant of the control plane
// or one the rate limit service names, their users and keys), the
// caller's spend as budgetCounters reads it for a listed one; for a
// restorable limit of a caller keyed by one dimension, after a loss, what
// limitSpent reads; 0 for anything else. It is a fallback's amount of
// share replicas (see shareOf).
func (g *Gate) extraSpent(ctx context.Context, st *state, tenant string, it weighted.Item, lost bool, share int64) (int64, error) {
	if l, c, ok := st.budgetOfKey(it.Limit.Name, tenant, it.Key); ok {
		return g.budgetSpent(ctx, st, l, c, it.Key, lost, nil, share)
	}
	for _, l := range st.limits {
		if !lost || l.limit.Name != it.Limit.Name || !l.callerRestorable() {
			continue
		}
		if c, ok := l.callerOfKey(tenant, it.Key); ok {
			return g.limitSpent(ctx, st, l, c, nil, share)
		}
	}
	return 0, nil
}

// limitCounters appends to items an item for every restorable limit keyed
// by the caller alone (see compiledLimit.callerRestorable) of every
// caller of tenant the gate lists, and to counted what the ledger says
// each spent in the limit's window, in its unit, skipping those seen (and
// marking the rest): a limit keyed by the caller is a budget over a
// window of its own, in dollars, requests or tokens, and a store that
// lost its counter must not admit that window's spend again. The amounts
// are a fallback's of share replicas (see shareOf).
func (g *Gate) limitCounters(ctx context.Context, st *state, tenant string, items []weighted.Item, counted []int64,
	seen map[string]bool, share int64) ([]weighted.Item, []int64, error) {
	if !slices.ContainsFunc(st.limits, (*compiledLimit).callerRestorable) {
		return items, counted, nil // no caller list to build
	}
	callers, userless := g.budgetCallers(st, tenant)
	return callerCounters(st, callers, seen, items, counted, (*compiledLimit).callerRestorable,
		func(l *compiledLimit, c *Caller, _ string) (int64, error) {
			return g.limitSpent(ctx, st, l, c, userless, share)
		})
}

// limitSpent is what the ledger says caller c spent of restorable limit l
// in its window (see compiledLimit.spentSince), in its unit (see
// spendOf), this region's entries only with regions (each region's store
// counts its own), as a fallback of share replicas counts it.
func (g *Gate) limitSpent(ctx context.Context, st *state, l *compiledLimit, c *Caller, userless []string, share int64) (int64, error) {
	from := l.spentSince(time.Now())
	queries := l.spendQueries(c, userless)
	for i := range queries {
		queries[i].Period, queries[i].From, queries[i].To = "", from, from.AddDate(100, 0, 0)
	}
	region := ""
	if g.regions != nil {
		region = st.cfg.Region
	}
	spent, err := g.sumSpend(ctx, l, c, queries, region, true, share)
	return max(spent, 0), err
}

// spendOfEach is the ledger's spend of each caller of tenant by dim
// ("user" or "api_key") over [from, to): UserSpend or KeySpend.
func (g *Gate) spendOfEach(ctx context.Context, tenant, dim string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	if dim == "user" {
		return g.ledger.UserSpend(ctx, tenant, from, to)
	}
	return g.ledger.KeySpend(ctx, tenant, from, to)
}

// ledgerLimitCounters returns an item for every restorable limit of
// tenant keyed by a user or a key (with the tenant or not) whose caller
// the ledger says spent in the limit's window and whose key is not among
// seen, with what the caller counted there (see limitSpent), and marks
// them seen: the users and keys only the rate limit service or the
// reserve API names, as ledgerCounters finds them for budgets. Without
// them, the restore of a loss counted the limits of the callers the gate
// lists and of the request that found it, and the others' came back at
// 0 under the fresh marker. The callers are found by their entries (one
// grouped read of the roll-up per limit, from the quarter hour of the
// window's start), those that cost nothing too: a rate limit service's
// hits on a limit without a price are requests all the same. At most
// maxLedgerCallers in all.
func (g *Gate) ledgerLimitCounters(ctx context.Context, st *state, tenant string, seen map[string]bool, share int64) ([]weighted.Item, []int64, error) {
	plan, planKnown := g.tenantPlan(st, tenant)
	now := time.Now()
	var (
		items   []weighted.Item
		counted []int64
	)
	for _, l := range st.limits {
		if !l.callerRestorable() || planKnown && !l.appliesTo(plan) {
			continue
		}
		byUser, byKey := slices.Contains(l.dims, "user"), slices.Contains(l.dims, "api_key")
		if byUser == byKey {
			continue // the tenant's alone (limitCounters), or a user and a key
		}
		dim := "user"
		if byKey {
			dim = "api_key"
		}
		by, err := g.spendOfEach(ctx, tenant, dim, l.spentSince(now).Truncate(15*time.Minute), now.AddDate(100, 0, 0))
		if err := knownSpend(err, false); err != nil {
			return nil, nil, fmt.Errorf("gate: callers of %s for %s: %w", tenant, l.limit.Name, err)
		}
		for id := range by {
			if id == "" {
				continue // the callers without one are limitCounters'
			}
			c := &Caller{Tenant: tenant, User: id}
			if byKey {
				c = &Caller{Tenant: tenant, KeyID: id}
			}
			key := l.callerKey(c)
			if seen[l.limit.Name+"\x00"+key] || weighted.HashTag(key) != tenant {
				continue
			}
			if len(items) >= maxLedgerCallers {
				g.log.Warn("a restore leaves out the limit counters of some of the ledger's callers", "tenant", tenant,
					"limit", l.limit.Name, "restored", maxLedgerCallers)
				return items, counted, nil
			}
			seen[l.limit.Name+"\x00"+key] = true
			spent, err := g.limitSpent(ctx, st, l, c, nil, share)
			if err != nil {
				return nil, nil, err
			}
			if spent > 0 {
				items, counted = append(items, weighted.Item{Limit: l.limit, Key: key}), append(counted, spent)
			}
		}
	}
	return items, counted, nil
}

// ledgerGroupCounters returns an item for every counter of tenant's
// restorable limits keyed by the caller and by model, route, upstream,
// region, client address or attributes (see compiledLimit.keyedByEntry)
// that the ledger's entries in the limit's window name, with what those
// entries counted in the limit's unit (see groupSpent), and marks them
// seen, skipping those seen already. A counter's key is the one the gate
// debits for a request of the entry's caller, route, upstream, model and
// region, and of the address and attributes as the debit's key wrote
// them (ledger.Entry.KeyIP, KeyAttrs; a group of the entries of many
// attributes' values counts on each counter of the values its limit
// names), the model by its
// canonical name (see Reservation.Model), so that the entries of a
// model's aliases count on one counter, as their requests did, and the
// region the entry records, the one the gate that decided it keyed it
// by (every region's counters, as one Redis may hold them; this
// region's only with regions, each of which has a Redis of its own).
//
// With tenant empty, the counters are those of the limits of the whole
// deployment (see globalLimit) but the spend caps that restoreGlobal
// reads from the roll-up, from every tenant's entries (Ledger.
// TotalCountsBy); a limit of some plans from the entries of those plans
// only, the plan each entry records of its caller at the decision (so a
// tenant moved to another plan counts its earlier entries on its old
// plan's limits), and the entries that record none (written before the
// ledger kept it, or of a caller without a plan), which may refuse
// early, never late.
//
// Its reads of the ledger do not grow with the models, routes and
// upstreams, nor with the callers: one grouped read of the tenant's
// entries (Ledger.CountsBy) per window and grouping, this region's
// entries only with regions (each region's store counts its own). While
// the ledger's database is out, the counts are what this node knows
// (see knownSpend: a fail-closed limit whose count is unknown fails the
// restore). At most maxLedgerCallers counters, the most requests first;
// past it, the others come back at 0 and a warning says so. The amounts
// are a fallback's of share replicas (see shareOf).
func (g *Gate) ledgerGroupCounters(ctx context.Context, st *state, tenant string, seen map[string]bool, share int64) ([]weighted.Item, []int64, error) {
	plan, planKnown := g.tenantPlan(st, tenant)
	tag, name := tenant, tenant
	if tenant == "" {
		tag, name, planKnown = globalTag, "every tenant", false
	}
	type read struct {
		from   time.Time
		by     ledger.GroupBy
		region string
	}
	type answer struct {
		groups []ledger.Group
		err    error // the read's, a *ledger.LocalSpendError
	}
	reads := map[read]answer{}
	now := time.Now()
	var (
		items   []weighted.Item
		counted []int64
		at      = map[string]int{} // the index in items of each key of a limit's ("name\x00key")
	)
	for _, l := range st.limits {
		switch {
		case tenant == "" && (!l.restorable() || !l.global || l.spendCap() && g.regions == nil):
			continue
		case tenant != "" && (!l.restorable() || !l.keyedByEntry() || planKnown && !l.appliesTo(plan)):
			continue
		}
		r := read{from: l.spentSince(now), by: ledger.GroupBy{
			User: slices.Contains(l.dims, "user"), KeyID: slices.Contains(l.dims, "api_key"),
			Route: slices.Contains(l.dims, "route"), Upstream: l.byUpstream, Model: l.byModel,
			Region: slices.Contains(l.dims, "region"), Plan: tenant == "" && len(l.plans) > 0,
			IP: l.byIP, Attrs: len(l.attrs) > 0,
		}}
		if g.regions != nil {
			r.region = st.cfg.Region
		}
		a, ok := reads[r]
		if !ok {
			q := ledger.SpendQuery{Tenant: tenant, Region: r.region, From: r.from, To: r.from.AddDate(100, 0, 0)}
			var gs []ledger.Group
			var err error
			if tenant == "" {
				gs, err = g.ledger.TotalCountsBy(ctx, q, r.by)
			} else {
				gs, err = g.ledger.CountsBy(ctx, q, r.by)
			}
			if err := knownSpend(err, false); err != nil {
				return nil, nil, fmt.Errorf("gate: counts of %s for %s: %w", name, l.limit.Name, err)
			}
			a = answer{gs, err}
			reads[r] = a
		}
		if err := knownSpend(a.err, l.failClosed); err != nil {
			return nil, nil, fmt.Errorf("gate: counts of %s for %s: %w", name, l.limit.Name, err)
		}
		for i := range a.groups {
			gr := &a.groups[i]
			if l.byUpstream && gr.Upstream == "" {
				continue // a request that names no upstream is not keyed by one (see keyedFor)
			}
			if gr.Plan != "" && !l.appliesTo(gr.Plan) {
				continue // the limit did not apply to the caller's plan at the decision
			}
			written, ok := writtenOf(l, gr)
			if !ok {
				continue // not keyed by an address or an attribute the limit names (see keyedFor)
			}
			res := &Reservation{st: st, model: st.est.Canonical(gr.Model), region: gr.Region, written: written,
				req: Request{Caller: &Caller{Tenant: tenant, User: gr.User, KeyID: gr.KeyID}, Route: gr.Route, Upstream: gr.Upstream}}
			key := l.key(res)
			id := l.limit.Name + "\x00" + key
			spent := groupSpent(l, gr, share)
			if j, ok := at[id]; ok {
				counted[j] = int64(addSpend(costmodel.NanoUSD(counted[j]), costmodel.NanoUSD(spent)))
				continue
			}
			if seen[id] || weighted.HashTag(key) != tag || spent <= 0 {
				continue
			}
			if len(items) >= maxLedgerCallers {
				g.log.Warn("a restore leaves out the counters of some of the ledger's models, routes and upstreams", "tenant", name,
					"limit", l.limit.Name, "restored", maxLedgerCallers)
				return items, counted, nil
			}
			seen[id], at[id] = true, len(items)
			items, counted = append(items, weighted.Item{Limit: l.limit, Key: key}), append(counted, spent)
		}
	}
	return items, counted, nil
}

// groupSpent is what the entries of group gr counted of limit l, in its
// unit: their charge in dollars, else their requests or tokens (see
// ledgerCount), as a fallback of share replicas counts it (see shareOf).
func groupSpent(l *compiledLimit, gr *ledger.Group, share int64) int64 {
	if l.unit == "usd" {
		return max(shareOf(gr.Charge, gr.PendingCharge, share), 0)
	}
	return max(shareOf(costmodel.NanoUSD(l.ledgerCount(gr.Counts)), costmodel.NanoUSD(l.ledgerCount(gr.PendingCounts)), share), 0)
}

// levelCounters appends to items an item for every budget of the control
// plane's levels under tenant, and to counted what the ledger says each
// has spent in its window since its last reset, skipping those seen (and
// marking the rest). A team's, user's or key's budget counts its keys'
// spend, one read of the ledger per distinct window; a tenant's counts
// the tenant's. While the ledger's database is out, the spend is what
// this node knows. The amounts are a fallback's of share replicas (see
// shareOf).
func (g *Gate) levelCounters(ctx context.Context, tenant string, items []weighted.Item, counted []int64,
	seen map[string]bool, share int64) ([]weighted.Item, []int64, error) {
	d := g.dir.dir.Load()
	if d == nil {
		return items, counted, nil
	}
	type span struct{ from, to time.Time }
	type answer struct {
		byKey map[string]costmodel.NanoUSD
		err   error // the read's, a *ledger.LocalSpendError
	}
	keys := map[span]answer{}
	spend := func(lb LevelBudget, l *compiledLimit, from, to time.Time) (int64, error) {
		if lb.KeyIDs == nil {
			v, err := g.ledger.Spend(ctx, ledger.SpendQuery{Tenant: tenant, From: from, To: to})
			var pending costmodel.NanoUSD
			if le := (*ledger.LocalSpendError)(nil); errors.As(err, &le) {
				pending = le.Pending
			}
			return shareOf(v, pending, share), knownSpend(err, l.failClosed)
		}
		a, ok := keys[span{from, to}]
		if !ok {
			byKey, err := g.ledger.KeySpend(ctx, tenant, from, to)
			if err := knownSpend(err, false); err != nil {
				return 0, err
			}
			a = answer{byKey, err}
			keys[span{from, to}] = a
		}
		if err := knownSpend(a.err, l.failClosed); err != nil {
			return 0, err
		}
		var local *ledger.LocalSpendError
		errors.As(a.err, &local)
		var v, pending costmodel.NanoUSD
		for _, id := range lb.KeyIDs {
			v = addSpend(v, a.byKey[id])
			if local != nil {
				pending = addSpend(pending, local.PendingOf(id))
			}
		}
		return shareOf(v, pending, share), nil
	}
	now := time.Now()
	for _, lb := range (*d).Budgets(tenant) {
		ll := lb.Limit.at(now)
		l := ll.cl
		if !l.budget || seen[l.limit.Name+"\x00"+l.fixedKey] {
			continue
		}
		seen[l.limit.Name+"\x00"+l.fixedKey] = true
		from, to := ll.spendRange(now)
		v, err := spend(lb, l, from, to)
		if err != nil {
			return nil, nil, fmt.Errorf("gate: spend of %s for %s: %w", tenant, l.limit.Name, err)
		}
		items = append(items, weighted.Item{Limit: l.limit, Key: l.fixedKey})
		counted = append(counted, max(v, 0))
	}
	return items, counted, nil
}

// addSpend is a+b, saturating at the largest int64 as the ledger's sums do.
func addSpend(a, b costmodel.NanoUSD) costmodel.NanoUSD {
	if s := a + b; s >= a || b < 0 {
		return s
	}
	return math.MaxInt64
}

// fallback is the local fallback store of one outage of the limiter store
// (from its first failure to the breaker closing again): a new one, empty
// and so restored from the ledger at its first use, for each outage, so
// that an outage starts from what the ledger says was spent, not from what
// an earlier outage left, and rate limits get one fallback burst per
// outage.
type fallback struct {
	*freshStore
	outage uint64 // the breaker's recoveries when it was made
}

// fallbackStore returns the fallback of the current outage.
func (g *Gate) fallbackStore() *freshStore {
	fb := g.fallback.Load()
	if g.breaker == nil {
		return fb.freshStore
	}
	n := g.breaker.recoveries()
	for fb.outage != n {
		next := &fallback{freshStore: g.fresh(weighted.NewMemory(weighted.MemoryConfig{Generations: true}), g.state.Load().cfg.Store.FallbackReplicas), outage: n}
		if g.fallback.CompareAndSwap(fb, next) {
			return next.freshStore
		}
		fb = g.fallback.Load()
	}
	return fb.freshStore
}

// syncPeers waits until the other replicas on the ledger's database have
// written there what they had recorded (ledger.SyncPeers). One that does
// not answer in time (gone without a word, or its writes held up) is
// logged and not waited for further: the restore goes on with what the
// ledger holds. ctx's end is its error. lossTags go with the request (see
// peerRestored).
func (g *Gate) syncPeers(ctx context.Context, lossTags ...string) error {
	err := g.ledger.SyncPeers(ctx, lossTags...)
	if err != nil && ctx.Err() == nil {
		g.log.Warn("a restore from the ledger goes on without every replica's latest records", "err", err)
		return nil
	}
	return err
}

// sleepCtx waits d, or until ctx is done (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// markBehind marks the tenants of items as lagging the ledger in the
// limiter store (see Gate.behind).
func (g *Gate) markBehind(items []weighted.Item) {
	for _, it := range items {
		g.markBehindTag(weighted.HashTag(it.Key))
	}
}

// markBehindTag marks the tenants of hash tag tag as lagging (see
// markBehind).
func (g *Gate) markBehindTag(tag string) {
	if _, had := g.behind.LoadOrStore(tag, struct{}{}); !had {
		g.behindN.Add(1)
	}
}

// catchUp brings the tenants of items that lag the ledger (see
// Gate.behind) up to date before the limiter store decides on them: the
// settlements the store failed are made again, then the tenant's budgets
// are restored from the ledger, which holds what the local fallback
// admitted. It waits for a store the breaker lets calls through to; a
// catch-up that fails leaves the mark for the next call. With no tenant
// behind it costs one atomic load.
func (f *freshStore) catchUp(ctx context.Context, items []weighted.Item) {
	if f.g.behindN.Load() == 0 || f != f.g.store || f.g.breaker != nil && !f.g.breaker.ready() {
		return
	}
	for _, it := range items {
		tag := weighted.HashTag(it.Key)
		if _, ok := f.g.behind.Load(tag); !ok {
			if _, busy := f.g.catching.Load(tag); !busy {
				continue
			}
		}
		f.catchUpTag(ctx, tag) // or wait for the one under way
	}
}

// catchUpTag catches up the tenants of hash tag tag (see catchUp). Until
// it is done, the tag is in catching (and counted in behindN), so that a
// call on the tag that finds it no longer marked behind waits for it
// rather than deciding on counters not caught up yet.
func (f *freshStore) catchUpTag(ctx context.Context, tag string) {
	f.group.Do("catch-up "+tag, func() (any, error) {
		f.g.catching.Store(tag, struct{}{})
		defer f.g.catching.Delete(tag)
		if _, ok := f.g.behind.LoadAndDelete(tag); !ok {
			return nil, nil // another call caught it up
		}
		defer f.g.behindN.Add(-1)
		for _, p := range mergeSpent(f.g.takePending(tag)) {
			if err := f.replay(ctx, p); err != nil {
				if errors.Is(err, weighted.ErrStale) {
					continue // the store lost the tag: the restore below counts from the ledger
				}
				f.g.unsettledAs(p)
			}
		}
		if tag == globalTag {
			return nil, nil // no tenant's: the global limits' counters have what was replayed
		}
		// Deleted before the ledger is read: a mark made since stays.
		if err := f.restore(ctx, tag, nil, false); err != nil {
			f.g.markBehindTag(tag)
			return nil, err
		}
		return nil, nil
	})
}

// catchUpLoop catches up every tenant that lags the ledger in the store
// (see catchUp) once the breaker is closed again, checking every
// interval, without waiting for the tenant's next request here: until a
// replica adds what its fallback admitted to the store's counters, the
// other replicas decide without it (with the ledger's database out, until
// it is back). A breaker that cooled down is left to a request's probe
// for one interval more; on a replica no request comes to, the loop
// probes, once a write outside the breaker (storeWritable) says the store
// takes writes again: a probe of the loop that failed would hold the
// breaker open for another cooldown, sending the requests that come as
// the store recovers to the fallback. With no tenant behind a round costs
// one atomic load.
func (g *Gate) catchUpLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if g.behindN.Load() == 0 || !g.breaker.closedOrIdle(interval) {
			continue
		}
		if g.breaker.State() != telemetry.BreakerClosed && !g.storeWritable(ctx) {
			continue
		}
		f := g.store
		g.behind.Range(func(k, _ any) bool {
			f.catchUpTag(ctx, k.(string))
			return ctx.Err() == nil && g.breaker.ready()
		})
	}
}

// storeWritable tells whether the limiter store's Redis takes a write
// now (a SET of a key of its own, expiring in a second), without the
// breaker: it neither counts as the breaker's probe nor opens it again.
func (g *Gate) storeWritable(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, g.objTimeout)
	defer cancel()
	return g.redis.Set(ctx, "cg:writable", "1", time.Second).Err() == nil
}
