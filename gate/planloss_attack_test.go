package gate

import (
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// planYAML is a config on srv with the ledger of dsn (the embedded one in
// dir when empty): tenants acme (key cg-acme) on plan acmePlan, initech
// (cg-initech) on free and globex (cg-globex) on enterprise, and limits.
func planYAML(dir string, srv *redistest.Server, dsn, acmePlan, limits string) string {
	ledgerYAML := ""
	if dsn != "" {
		ledgerYAML = fmt.Sprintf("ledger: {dsn: %q}\n", dsn)
	}
	return fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
%stenants:
  - {name: acme, plan: %s, keys: [{id: acme-key, key: cg-acme}]}
  - {name: initech, plan: free, keys: [{id: initech-key, key: cg-initech}]}
  - {name: globex, plan: enterprise, keys: [{id: globex-key, key: cg-globex}]}
limits:
%s`, dir, srv.URL, ledgerYAML, acmePlan, limits)
}

// TestLimitLossAtkPlanLimitsCountTheirPlans: a limit of the whole
// deployment for some plans (the free plan's gpt-4o requests a day
// across every free tenant; an enterprise-only one) counts only the
// requests of tenants of those plans, and after Redis loses its data it
// must come back at what those requests counted, not every tenant's.
// globex (enterprise) spends 8 of 10 on gpt-4o, acme (free) 3: after the
// loss, acme is admitted 7 more on the free plan's limit; conversely, on
// an enterprise-only limit, acme (free) spends 8 and globex 3, and globex
// is admitted 7. Before, the limit was restored from every plan's
// entries, at its first use too (an empty store is restored as a lost
// one): the other plan's 8 left 2 of the first 3, and none after the
// loss, for the rest of the day. On the embedded ledger and PostgreSQL, keyed by model and by
// nothing, in requests and in dollars (a spend cap of some plans).
func TestLimitLossAtkPlanLimitsCountTheirPlans(t *testing.T) {
	for _, c := range []struct{ name, dims, unit, rate string }{
		{"requests per model", "[model]", "requests", "rate: 10"},
		{"tokens per model", "[model]", "tokens", "rate: 50"},
		{"dollars, no dimension", "[]", "usd", `rate_usd: "0.00001"`},
	} {
		for _, store := range []string{"embedded", "postgres"} {
			for _, plan := range []struct{ limited, other, mine string }{
				{"free", "cg-globex", "cg-acme"},
				{"enterprise", "cg-acme", "cg-globex"},
			} {
				t.Run(c.name+"/"+plan.limited+"/"+store, func(t *testing.T) {
					t.Parallel()
					awayFromWindowEdge(t, 24*time.Hour)
					srv, dsn := redistest.New(t), ""
					if store == "postgres" {
						dsn = pgtest.New(t)
					}
					limit := fmt.Sprintf("  - {name: shared, plans: [%s], dimensions: %s, unit: %s, %s, period: 24h, algorithm: fixed_window}\n",
						plan.limited, c.dims, c.unit, c.rate)
					g := openYAML(t, planYAML(t.TempDir(), srv, dsn, "free", limit))
					other, mine := groupRequest{key: plan.other}, groupRequest{key: plan.mine}
					if n := spendGroupUntil(t, g, other, 8, 429); n != 8 {
						t.Fatalf("the other plan's tenant: %d admitted of 8", n)
					}
					if n := spendGroupUntil(t, g, mine, 3, 429); n != 3 {
						t.Fatalf("before the loss: %d admitted of 3", n)
					}
					flushRedis(t, srv)
					if n := spendGroupUntil(t, g, mine, 20, 429); n != 7 {
						t.Fatalf("after Redis lost its data: %d admitted of the 7 requests' worth plan %s's tenants left of 10 (the other plan's 8 count on no limit of %s)",
							n, plan.limited, plan.limited)
					}
				})
			}
		}
	}
}

// TestLimitLossAtkPlanLimitsTenantMoved: a tenant moved to another plan
// mid-window counts its earlier requests on its old plan's limits, as
// the gate did, and its later ones on its new plan's. acme spends 4 of
// the free plan's 10 on gpt-4o, moves to enterprise (a reload) and
// spends 3 of enterprise's 10; after the loss, initech (free) is
// admitted 6 on the free plan's limit and acme 7 on enterprise's
// (before, each counted both plans' 7: 3 and 3).
func TestLimitLossAtkPlanLimitsTenantMoved(t *testing.T) {
	for _, store := range []string{"embedded", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			awayFromWindowEdge(t, 24*time.Hour)
			srv, dsn, dir := redistest.New(t), "", t.TempDir()
			if store == "postgres" {
				dsn = pgtest.New(t)
			}
			limits := "  - {name: free-gpt4o, plans: [free], dimensions: [model], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}\n" +
				"  - {name: enterprise-gpt4o, plans: [enterprise], dimensions: [model], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}\n"
			g := openYAML(t, planYAML(dir, srv, dsn, "free", limits))
			acme, initech := groupRequest{key: "cg-acme"}, groupRequest{key: "cg-initech"}
			if n := spendGroupUntil(t, g, acme, 4, 429); n != 4 {
				t.Fatalf("acme on free: %d admitted of 4", n)
			}
			moved, err := config.Parse([]byte(planYAML(dir, srv, dsn, "enterprise", limits)))
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Apply(moved); err != nil {
				t.Fatal(err)
			}
			if n := spendGroupUntil(t, g, acme, 3, 429); n != 3 {
				t.Fatalf("acme on enterprise: %d admitted of 3", n)
			}
			flushRedis(t, srv)
			if n := spendGroupUntil(t, g, initech, 20, 429); n != 6 {
				t.Fatalf("after Redis lost its data: initech (free) admitted %d of the 6 left of the free plan's 10 (acme spent 4 while free)", n)
			}
			if n := spendGroupUntil(t, g, acme, 20, 429); n != 7 {
				t.Fatalf("after Redis lost its data: acme (enterprise) admitted %d of the 7 left of enterprise's 10", n)
			}
		})
	}
}
