package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/redistest"
)

// TestRollbackAtkRestartOnAnOlderSnapshot: Redis and costgate go down
// together (a host's crash) and Redis comes back on a snapshot older than
// its last writes: acme had spent 6 of its 10 requests a day when the
// snapshot was taken and 9 when they went down. The counters and
// generation markers are rolled back, not emptied, and the restarted
// costgate has seen no newer marker; the ledger holds all 9. acme has 1
// left, on a budget, a fixed window and a token bucket. Before, the
// limits were decided on the rolled-back counters: 4 admitted, 13 of 10
// (budgets were raised by the reconciliation at start).
func TestRollbackAtkRestartOnAnOlderSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name, limits string
		status       int
	}{
		{"budget", `budgets:
  - {name: daily, scope: tenant, amount: "0.01"}`, 402},
		{"window", `limits:
  - {name: daily, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}`, 429},
		{"bucket", `limits:
  - {name: daily, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: token_bucket}`, 429},
	} {
		t.Run(tc.name, func(t *testing.T) { rollbackAtk(t, tc.limits, tc.status) })
	}
}

func rollbackAtk(t *testing.T, limits string, status int) {
	awayFromWindowEdge(t, 24*time.Hour)
	srv := redistest.New(t)
	dir := t.TempDir()
	open := func() *Gate {
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
%s
`, dir, srv.URL, limits)))
		if err != nil {
			t.Fatal(err)
		}
		g, err := Open(context.Background(), cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	ctx := context.Background()
	g := open()
	if n := spendAcmeUntil(t, g, 6, status); n != 6 {
		t.Fatalf("before the snapshot: %d of 6", n)
	}
	if err := srv.Client(t).Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n := spendAcmeUntil(t, g, 3, status); n != 3 {
		t.Fatalf("after the snapshot: %d of 3", n)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t) // a crash: the writes since the snapshot are lost
	srv.RestartOnSnapshot(t)
	g = open()
	defer g.Close()
	if n := spendAcmeUntil(t, g, 20, status); n != 1 {
		t.Fatalf("after the restart on the older snapshot: %d admitted where 1 of 10 was left (9 spent, 6 in the snapshot)", n)
	}
}
