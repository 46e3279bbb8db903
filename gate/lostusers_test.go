package gate

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// lostUsersGate opens a gate on the Redis srv and the ledger dsn with one
// configured tenant, acme on plan small, whose only key is dave's, and a
// daily budget of $0.01 (ten requests of $0.001) of the given scope.
func lostUsersGate(t *testing.T, dsn string, srv *redistest.Server, scope string) *Gate {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: dave-key, key: cg-dave, user: dave}]}
budgets:
  - {name: per-caller, scope: %s, amount: "0.01"}
`, t.TempDir(), srv.URL, dsn, scope)))
	if err != nil {
		t.Fatal(err)
	}
	return openConfig(t, cfg)
}

// TestLostUsersRestoreCountsTheLedgersCallers: the rate limit service (and
// the reserve API) name users and key ids that neither the configuration
// nor a control plane lists (Gate.Trusted). Each of two such callers of
// one tenant spends its $0.01 per-caller budget; Redis loses its data;
// the first caller's request finds the loss, restores the tenant's
// counters and writes a fresh marker. The second caller's counter must
// come back at the ledger's spend too: a restore that counted only the
// callers it knew left it at 0 under the fresh marker, and the second
// caller spent its day's budget again.
func TestLostUsersRestoreCountsTheLedgersCallers(t *testing.T) {
	for _, tc := range []struct {
		name, scope, tenant string
		callers             func(g *Gate, tenant string) []*Caller
	}{
		{"users of a configured tenant", "user", "acme", rlsUsers},
		{"keys of a configured tenant", "api_key", "acme", rlsKeys},
		{"users of a tenant only the RLS names", "user", "newco", rlsUsers},
		{"keys of a tenant only the RLS names", "api_key", "newco", rlsKeys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn, srv := pgtest.New(t), redistest.New(t)
			g := lostUsersGate(t, dsn, srv, tc.scope)
			callers := tc.callers(g, tc.tenant)
			for i, n := range spentThenLost(t, g, srv, callers...) {
				if n != 0 {
					t.Errorf("after Redis lost its data: %d more of $0.001 admitted to %s/%s/%s, whose $0.01 budget the ledger says is spent",
						n, callers[i].Tenant, callers[i].User, callers[i].KeyID)
				}
			}
		})
	}
}

// rlsUsers are two callers of tenant named by user alone, as the rate
// limit service names them.
func rlsUsers(g *Gate, tenant string) []*Caller {
	return []*Caller{g.Trusted(tenant, "ann", "", "small"), g.Trusted(tenant, "bob", "", "small")}
}

// rlsKeys are two callers of tenant named by key id alone.
func rlsKeys(g *Gate, tenant string) []*Caller {
	return []*Caller{g.Trusted(tenant, "", "key-ann", "small"), g.Trusted(tenant, "", "key-bob", "small")}
}

// TestLostUsersReconcileCountsTheLedgersTenants: the scheduled
// reconciliation raises the counters of a tenant that only the rate limit
// service names, and of its users, to the ledger's spend. Redis evicts
// the budget counters but keeps the generation markers, so no request
// finds the tenant stale: only the reconciliation can bring the counters
// back. It reconciled the configuration's and the control plane's tenants
// alone, and newco's users spent their budgets again.
func TestLostUsersReconcileCountsTheLedgersTenants(t *testing.T) {
	ctx := context.Background()
	dsn, srv := pgtest.New(t), redistest.New(t)
	g := lostUsersGate(t, dsn, srv, "user")
	callers := rlsUsers(g, "newco")
	for _, c := range callers {
		if n := spendCaller(t, g, c, 20); n != 10 {
			t.Fatalf("%s before the eviction: %d of $0.001 admitted under a $0.01 budget, want 10", c.User, n)
		}
	}
	if err := g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rc := srv.Client(t)
	keys, err := rc.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	evicted := 0
	for _, k := range keys {
		if strings.Contains(k, "{newco}:user=") {
			if err := rc.Del(ctx, k).Err(); err != nil {
				t.Fatal(err)
			}
			evicted++
		}
	}
	if evicted == 0 {
		t.Fatalf("no counter of newco's users among Redis's keys %q", keys)
	}
	if err := g.ReconcileBudgets(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range callers {
		if n := spendCaller(t, g, c, 20); n != 0 {
			t.Errorf("after the eviction and a reconciliation: %d more of $0.001 admitted to newco/%s, whose $0.01 budget the ledger says is spent", n, c.User)
		}
	}
}

// TestLostUsersRestoreBatches: a tenant whose ledger names more users than
// one Redis call of a restore carries (restoreBatch): every one's counter
// comes back at the ledger's spend, those of the calls before the last
// one's too.
func TestLostUsersRestoreBatches(t *testing.T) {
	ctx := context.Background()
	dsn, srv := pgtest.New(t), redistest.New(t)
	g := lostUsersGate(t, dsn, srv, "user")
	n := restoreBatch + restoreBatch/2
	for i := range n {
		e := ledger.Entry{RequestID: fmt.Sprintf("lost-users-%d", i), Tenant: "newco", User: fmt.Sprintf("u%05d", i),
			Route: "/x", EstimatedCost: 10_000_000} // the whole $0.01
		if err := g.Ledger().Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for i := range n {
		admitted += spendCaller(t, g, g.Trusted("newco", fmt.Sprintf("u%05d", i), "", "small"), 1)
	}
	if admitted != 0 {
		t.Errorf("after Redis lost its data: %d of %d users, each of whose $0.01 budget the ledger says is spent, admitted $0.001", admitted, n)
	}
}
