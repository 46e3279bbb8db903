package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// ReconcileBudgets brings each budget's counter in the limiter store up to
// what the ledger has recorded for the current period. The counters are
// kept in step with the ledger request by request (both are charged the
// same settled cost), but the limiter store can lose them: Redis restarted
// without persistence, a key evicted, requests admitted on the local
// fallback while Redis was out. The ledger is the source of truth, so a
// counter below the ledger's spend is raised to it; a counter above it
// (reservations of requests still in flight) is left alone. A store that
// lost its data is restored the same way at the first request that finds
// it (see freshStore); this catches what that cannot see, such as spend
// recorded by a replica on its local fallback.
//
// The tenants are the configuration's, those with budgets in the control
// plane's directory, and those with spend in the ledger this period (see
// ledgerTenants). It runs when the server opens, every ReconcileInterval, and when the
// store's circuit breaker closes again. Each tenant's restore counts in
// costgate.budget.reconcile, as does a reconciliation that cannot start;
// a successful one sets costgate.budget.remaining (see restore). It returns every tenant's error,
// joined; the other tenants are still reconciled.
func (g *Gate) ReconcileBudgets(ctx context.Context) error {
	st := g.state.Load()
	if err := g.ledger.Stats().StoreErr; err != nil {
		g.tel.Reconcile(telemetry.ReconcileScheduled, err)
		return fmt.Errorf("gate: reconcile: the ledger's store is failing: %w", err)
	}
	if err := g.ledger.Flush(ctx); err != nil {
		g.tel.Reconcile(telemetry.ReconcileScheduled, err)
		return fmt.Errorf("gate: reconcile: %w", err)
	}
	tenants := make([]string, 0, len(st.cfg.Tenants))
	for _, t := range st.cfg.Tenants {
		tenants = append(tenants, t.Name)
	}
	if d := g.dir.dir.Load(); d != nil {
		for _, t := range (*d).BudgetTenants() {
			if _, declared := st.tenants[t]; !declared {
				tenants = append(tenants, t)
			}
		}
	}
	var errs []error
	ledgerTenants, lerr := g.ledgerTenants(ctx, st)
	if lerr != nil {
		g.tel.Reconcile(telemetry.ReconcileScheduled, lerr)
		errs = append(errs, lerr)
	}
	listed := make(map[string]bool, len(tenants))
	for _, t := range tenants {
		listed[t] = true
	}
	for _, t := range ledgerTenants {
		if !listed[t] {
			listed[t] = true
			tenants = append(tenants, t)
		}
	}
	for _, t := range tenants {
		// Each tenant waits for its own requests decided on a replaced
		// configuration, within the reload's one bound (see drain).
		if g.drain(ctx, st, t) {
			if err := g.ledger.Flush(ctx); err != nil {
				errs = append(errs, fmt.Errorf("gate: reconcile %s: %w", t, err))
				continue
			}
		}
		err := g.restoreTenant(ctx, t)
		if err == nil {
			st.restored.Store(t, struct{}{})
		}
		errs = append(errs, err)
	}
	g.drain(ctx, st, "") // forgets the replaced states
	err := errors.Join(errs...)
	if err == nil {
		st.allRestored.Store(true)
	}
	return err
}

// ledgerTenants returns the tenants with spend in the ledger in the
// current period of a configured budget keyed by its caller: those that
// only the rate limit service names are in no list. It reads the ledger
// once per budget period (day, month). A tenant whose name would put its
// keys under another's hash tag is left out: its restore would mark that
// tenant's counters fresh.
func (g *Gate) ledgerTenants(ctx context.Context, st *state) ([]string, error) {
	var periods []string
	for _, l := range st.limits {
		if l.budget && l.fixedKey == "" && l.tagged && !slices.Contains(periods, l.period) {
			periods = append(periods, l.period)
		}
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range periods {
		ts, err := g.ledger.Summary(ctx, p, time.Time{})
		if err != nil {
			return out, fmt.Errorf("gate: reconcile: the ledger's tenants: %w", err)
		}
		for _, t := range ts {
			if t.Spend > 0 && weighted.HashTag("{"+t.Tenant+"}") == t.Tenant && !seen[t.Tenant] {
				seen[t.Tenant] = true
				out = append(out, t.Tenant)
			}
		}
	}
	return out, nil
}

// restoreTenant raises tenant's budget counters to the ledger's spend,
// counted in costgate.budget.reconcile.
func (g *Gate) restoreTenant(ctx context.Context, tenant string) error {
	err := g.store.restore(ctx, tenant, nil, false)
	g.tel.Reconcile(telemetry.ReconcileScheduled, err)
	if err != nil {
		return fmt.Errorf("gate: reconcile %s: %w", tenant, err)
	}
	return nil
}

// ReconcileTenant is ReconcileBudgets for tenant alone, at once: the
// control plane calls it when a change gave one of the tenant's budgets a
// counter that has not counted its period, and so does the first request
// that would debit such a counter (see LevelLimit.MarkUnrestored). Calls
// for one tenant share one restore, which waits for the requests decided
// on a configuration a reload replaced (see drain), for the ledger records
// of the other replicas' requests (Ledger.SyncPeers) and this one's; the
// budgets it restored are then marked restored. It runs apart from ctx's
// cancellation, for at most restoreTimeout: the requests waiting on it
// are not failed by the one that started it leaving.
func (g *Gate) ReconcileTenant(ctx context.Context, tenant string) error {
	ch := g.store.group.DoChan("reconcile "+tenant, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
		defer cancel()
		started := g.restores.Add(1)
		st := g.state.Load()
		var lbs []LevelBudget
		if d := g.dir.dir.Load(); d != nil {
			lbs = (*d).Budgets(tenant)
		}
		g.drain(ctx, st, tenant)
		err := g.syncPeers(ctx)
		if err == nil && g.ledger.Stats().StoreErr == nil {
			// While the ledger's database fails, a flush would wait for
			// it: the restore counts what this node knows (see restore).
			err = g.ledger.Flush(ctx)
		}
		if err != nil {
			g.tel.Reconcile(telemetry.ReconcileScheduled, err)
			return nil, fmt.Errorf("gate: reconcile %s: %w", tenant, err)
		}
		if err := g.restoreTenant(ctx, tenant); err != nil {
			// The store is out: the requests go to the local fallback,
			// whose counters of the tenant may have been restored before
			// the change. Bring them up to the ledger's spend there too;
			// the marks stay, for the store.
			if fb := g.fallbackStore(); fb != g.store {
				if ferr := fb.restore(ctx, tenant, nil, false); ferr != nil {
					err = errors.Join(err, ferr)
				}
			}
			return nil, err
		}
		st.restored.Store(tenant, struct{}{})
		if m, ok := g.planMoved.Load(tenant); ok && m.(uint64) < started && g.planMoved.CompareAndDelete(tenant, m) {
			g.planMovedN.Add(-1)
		}
		for _, lb := range lbs {
			lb.Limit.restored()
		}
		return nil, nil
	})
	select {
	case res := <-ch:
		return res.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// restoreTimeout bounds a restore that requests wait for.
const restoreTimeout = 10 * time.Second

// restoreCounters brings the counters of r's tenant up to the ledger's
// spend before r debits a budget whose counter has not counted its period:
// a level budget the control plane changed (see
// LevelLimit.MarkUnrestored), or any of a configuration that a reload
// gave such counters (see state.moved), until the tenant's are restored.
// A restore started before the change did not count it: it is asked
// again, a few times at most. A restore that fails leaves the marks for
// the next request. r is then decided on the counters as they are (the
// store out: the local fallback's, restored in its place), unless the
// spend is unknown (ErrSpendUnknown): restoreCounters returns that error,
// and r must not be decided.
func (r *Reservation) restoreCounters(ctx context.Context) error {
	moved := false
	if r.g.planMovedN.Load() > 0 {
		_, moved = r.g.planMoved.Load(r.req.Caller.Tenant)
	}
	if st := r.st; moved || st.moved && !st.allRestored.Load() {
		if _, ok := st.restored.Load(r.req.Caller.Tenant); !ok || moved {
			if err := r.g.ReconcileTenant(ctx, r.req.Caller.Tenant); err != nil {
				r.g.log.Warn("a tenant's changed budget counters could not be restored from the ledger", "tenant", r.req.Caller.Tenant, "err", err)
				if errors.Is(err, ErrSpendUnknown) {
					return err
				}
			}
		}
	}
	if !r.unrestored {
		return nil
	}
	for range maxRestores {
		tenant := ""
		for _, l := range r.limits {
			if l.level != nil && l.level.unrestored.Load() {
				tenant = weighted.HashTag(l.fixedKey)
				break
			}
		}
		if tenant == "" {
			return nil
		}
		if err := r.g.ReconcileTenant(ctx, tenant); err != nil {
			r.g.log.Warn("a changed budget's counter could not be restored from the ledger", "tenant", tenant, "err", err)
			if errors.Is(err, ErrSpendUnknown) {
				return err
			}
			return nil
		}
	}
	return nil
}

// reconcileLoop reconciles the budgets every interval, and as soon as the
// store's breaker has closed after an outage. The server owns it.
func (g *Gate) reconcileLoop(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	wasOpen := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-poll.C:
			open := g.breaker != nil && g.breaker.State() != telemetry.BreakerClosed
			recovered := wasOpen && !open
			wasOpen = open
			if !recovered {
				continue
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := g.ReconcileBudgets(rctx); err != nil {
			g.log.Warn("budget reconciliation failed", "err", err)
		}
		cancel()
	}
}
