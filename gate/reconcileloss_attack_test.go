package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
)

// TestReconcileLossAtkLimitsHold: a scheduled reconciliation (at start,
// every store.reconcile_interval, and when the breaker closes again: a
// Redis restarted empty comes back so) raises the tenant's budgets to the
// ledger's spend and marks the tenant fresh. Run after a data loss and
// before any request found it, it left the limits keyed by the caller
// (in requests, tokens or dollars), which only the restore of a loss
// counts, at 0 under the fresh marker: acme, which had spent its 10
// requests of the day, was admitted 10 more (and $0.01 more of a $0.01
// limit). A reconciliation that finds the tenant's counters lost must
// restore them as the first request would.
func TestReconcileLossAtkLimitsHold(t *testing.T) {
	for _, limit := range []string{
		`{name: daily-requests, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}`,
		`{name: spend, dimensions: [user], unit: usd, rate_usd: "0.01", period: 24h, algorithm: sliding_window}`,
	} {
		t.Run(limit[7:20], func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			srv := redistest.New(t)
			g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
limits:
  - %s
`, t.TempDir(), srv.URL, limit))
			t.Cleanup(func() { g.Close() })
			if n := spendAcmeUntil(t, g, 20, 429); n != 10 {
				t.Fatalf("before the loss: %d admitted of 10", n)
			}
			ctx := context.Background()
			if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := g.ReconcileBudgets(ctx); err != nil {
				t.Fatal(err)
			}
			if n := spendAcmeUntil(t, g, 20, 429); n != 0 {
				t.Errorf("after Redis lost its data and a reconciliation: %d more admitted of the 10 acme had spent", n)
			}
		})
	}
}

// TestReconcileLossAtkRestartOnMemory: the embedded default (the
// in-memory store, the embedded ledger) restarted with a budget
// configured: the reconciliation at start marked acme fresh with its
// budget restored and its 10 requests a day at 0, and acme, which had
// spent them, was admitted 10 more.
func TestReconcileLossAtkRestartOnMemory(t *testing.T) {
	awayFromWindowEdge(t, 24*time.Hour)
	before, after := spendAcmeAroundARestart(t, `
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
limits:
  - {name: daily-requests, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}
`)
	if before != 10 {
		t.Fatalf("before the restart: %d admitted of 10", before)
	}
	if after != 0 {
		t.Errorf("after a restart: %d more admitted of the 10 acme had spent today", after)
	}
}
