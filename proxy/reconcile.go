package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/weighted"
)

// ReconcileBudgets brings each budget's counter in the limiter store up to
// what the ledger has recorded for the current period. The counters are
// kept in step with the ledger request by request (both are charged the
// same settled cost), but the limiter store can lose them: Redis restarted
// without persistence, a key evicted, requests admitted on the local
// fallback while Redis was out. The ledger is the source of truth, so a
// counter below the ledger's spend is debited the difference; a counter
// above it (reservations of requests still in flight) is left alone.
//
// It runs when the server opens, every ReconcileInterval, and when the
// store's circuit breaker closes again. It returns the first error; the
// other budgets are still reconciled.
func (s *Server) ReconcileBudgets(ctx context.Context) error {
	st := s.state.Load()
	if err := s.ledger.Stats().StoreErr; err != nil {
		return fmt.Errorf("proxy: reconcile: the ledger's store is failing: %w", err)
	}
	if err := s.ledger.Flush(ctx); err != nil {
		return fmt.Errorf("proxy: reconcile: %w", err)
	}
	seen := map[string]bool{}
	var errs []error
	for _, t := range st.cfg.Tenants {
		for _, k := range t.Keys {
			c := &caller{tenant: t.Name, user: k.User, keyID: k.id(), plan: t.Plan}
			for _, l := range st.limits {
				if !l.budget || !l.appliesTo(t.Plan) {
					continue
				}
				key := l.callerKey(c)
				if seen[l.limit.Name+"\x00"+key] {
					continue
				}
				seen[l.limit.Name+"\x00"+key] = true
				q := ledger.SpendQuery{Tenant: t.Name, Period: l.period}
				switch l.dims[0] {
				case "user":
					q.User = c.user
				case "api_key":
					q.KeyID = c.keyID
				}
				if err := s.reconcile(ctx, l, key, q); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func (s *Server) reconcile(ctx context.Context, l *compiledLimit, key string, q ledger.SpendQuery) error {
	spent, err := s.ledger.Spend(ctx, q)
	if err != nil {
		return fmt.Errorf("proxy: reconcile %s: %w", l.limit.Name, err)
	}
	items := []weighted.Item{{Limit: l.limit, Key: key}}
	res, err := s.store.Peek(ctx, items)
	if err != nil {
		return fmt.Errorf("proxy: reconcile %s: %w", l.limit.Name, err)
	}
	st := res.Items[0]
	counted := st.Capacity - st.Remaining
	missing := min(int64(spent)-counted, st.Remaining)
	if missing <= 0 {
		return nil
	}
	items[0].Cost = missing
	id := "reconcile:" + newRequestID()
	if _, err := s.store.Debit(ctx, id, items); err != nil {
		return fmt.Errorf("proxy: reconcile %s: %w", l.limit.Name, err)
	}
	if err := s.store.Settle(ctx, id, items, []int64{missing}); err != nil {
		return fmt.Errorf("proxy: reconcile %s: %w", l.limit.Name, err)
	}
	s.log.Info("budget counter reconciled from the ledger", "limit", l.limit.Name, "key", key,
		"ledger_nano_usd", int64(spent), "counter_was_nano_usd", counted)
	return nil
}

// reconcileLoop reconciles the budgets every interval, and as soon as the
// store's breaker has closed after an outage. The server owns it.
func (s *Server) reconcileLoop(ctx context.Context, interval time.Duration) {
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
			open := s.breaker != nil && s.breaker.State() != "closed"
			recovered := wasOpen && !open
			wasOpen = open
			if !recovered {
				continue
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := s.ReconcileBudgets(rctx); err != nil {
			s.log.Warn("budget reconciliation failed", "err", err)
		}
		cancel()
	}
}
