package gate

import (
	"context"
	"fmt"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// A region whose Redis loses its data (FLUSHALL) after spending more than
// it last reported keeps within its cap: its counter is restored to what
// the ledger shows it spent (the ledger's spend less what the other
// regions reported), not only to its last report, which would let it
// spend the difference twice.
func TestRegionDataLossKeepsItsCap(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	open := func(region string, srv *redistest.Server) *Gate {
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
region: %s
regions: {names: [eu, us], interval: 1h}
store: {redis: %q}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {name: daily, scope: tenant, amount: "0.01"}
`, t.TempDir(), region, srv.URL, dsn)))
		if err != nil {
			t.Fatal(err)
		}
		g, err := Open(ctx, cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		return g
	}
	euRedis := redistest.New(t)
	eu, us := open("eu", euRedis), open("us", redistest.New(t))
	spend := func(g *Gate, n int) (admitted int) {
		t.Helper()
		c := g.Identify("cg-acme")
		for range n {
			res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 1_000_000}})
			if res == nil {
				if d.Status != 402 {
					t.Fatalf("refused with %d: %+v", d.Status, d)
				}
				return admitted
			}
			if d, ok := res.Record(ctx); !ok {
				t.Fatalf("record: %+v", d)
			}
			res.Settle(ctx, Charge{Cost: 1_000_000, HTTPStatus: 200})
			admitted++
		}
		return admitted
	}
	euSpent := spend(eu, 2)
	euCap, ok := eu.regions.Cap(eu.state.Load().limits[0].limit, "{acme}:tenant=acme")
	if !ok || euCap < 4_000_000 {
		t.Fatalf("eu's cap %d (known %v): want room for 4 requests", euCap, ok)
	}
	if err := eu.regions.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	euCap, _ = eu.regions.Cap(eu.state.Load().limits[0].limit, "{acme}:tenant=acme")
	usSpent := spend(us, 1)
	euSpent += spend(eu, 2) // not reported: no rebalance since
	if err := euRedis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	euSpent += spend(eu, 20)
	t.Logf("eu spent %d of its cap %d; us %d", euSpent, euCap/1_000_000, usSpent)
	if int64(euSpent)*1_000_000 > euCap {
		t.Fatalf("eu spent %d requests of 0.001 across its data loss, above its cap of %d nano-USD", euSpent, euCap)
	}
	if int64(euSpent)*1_000_000 < euCap {
		t.Fatalf("eu spent %d requests of 0.001, below its cap of %d nano-USD: the restore counted more than it spent", euSpent, euCap)
	}
}
