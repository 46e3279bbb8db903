package gate

import (
	"context"
	"fmt"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/redistest"
)

// TestLimitLossAtkDollarLimitsHold: a limit in dollars keyed by the
// caller is a spend cap over a window of its own, as a budget is over
// its period. acme spends it ($0.01 in $0.001 requests) and Redis then
// loses its data (FLUSHALL): the first request after the loss finds the
// tenant's counters gone, and must not find the limit empty. Before, a
// budget's counter was restored from the ledger and a limit's was not,
// so acme spent the window's dollars again.
func TestLimitLossAtkDollarLimitsHold(t *testing.T) {
	for _, algo := range []string{"fixed_window", "sliding_window", "token_bucket", "gcra"} {
		for _, dims := range []string{"[tenant]", "[user]", "[api_key]", "[tenant, user]"} {
			t.Run(algo+dims, func(t *testing.T) {
				t.Parallel()
				srv := redistest.New(t)
				cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
limits:
  - {name: spend, dimensions: %s, unit: usd, rate_usd: "0.01", period: 24h, algorithm: %s}
`, t.TempDir(), srv.URL, dims, algo)))
				if err != nil {
					t.Fatal(err)
				}
				g, err := Open(context.Background(), cfg, Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { g.Close() })
				if n := spendAcmeUntil(t, g, 4, 429); n != 4 {
					t.Fatalf("before the first loss: %d admitted of 4", n)
				}
				if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				// The restore counts what was spent, and no more.
				if n := spendAcmeUntil(t, g, 20, 429); n != 6 {
					t.Fatalf("after Redis lost its data: %d admitted of the $0.006 left of a $0.01 limit, in $0.001 requests", n)
				}
				if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				if n := spendAcmeUntil(t, g, 20, 429); n > 0 {
					t.Fatalf("after Redis lost its data again: %d more admitted of a $0.01 limit acme had spent", n)
				}
			})
		}
	}
}

// TestLimitLossAtkRestartOnMemory: the embedded default (the in-memory
// store, the embedded ledger) restarted: the new process's store starts
// empty, and a dollar limit acme spent must stay spent.
func TestLimitLossAtkRestartOnMemory(t *testing.T) {
	dir := t.TempDir()
	open := func() *Gate {
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: spend, dimensions: [tenant], unit: usd, rate_usd: "0.01", period: 1h, algorithm: sliding_window}
`, dir)))
		if err != nil {
			t.Fatal(err)
		}
		g, err := Open(context.Background(), cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g := open()
	if n := spendAcmeUntil(t, g, 20, 429); n != 10 {
		t.Fatalf("before the restart: %d admitted of a $0.01 limit, in $0.001 requests", n)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	g = open()
	defer g.Close()
	if n := spendAcmeUntil(t, g, 20, 429); n > 0 {
		t.Fatalf("after a restart: %d more admitted of a $0.01 limit acme had spent this hour", n)
	}
}
