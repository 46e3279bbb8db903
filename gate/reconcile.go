package gate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/costgate/costgate/telemetry"
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
// The tenants are the configuration's and those with budgets in the
// control plane's directory. It runs when the server opens, every ReconcileInterval, and when the
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
	for _, t := range tenants {
		errs = append(errs, g.restoreTenant(ctx, t))
	}
	return errors.Join(errs...)
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
// counter that has not counted its period.
func (g *Gate) ReconcileTenant(ctx context.Context, tenant string) error {
	if err := g.ledger.Flush(ctx); err != nil {
		g.tel.Reconcile(telemetry.ReconcileScheduled, err)
		return fmt.Errorf("gate: reconcile %s: %w", tenant, err)
	}
	return g.restoreTenant(ctx, tenant)
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
