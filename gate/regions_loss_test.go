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
// the ledger shows it spent (its own entries, or the ledger's spend less
// what the other regions reported), not only to its last report, which
// would let it spend the difference twice.
func TestRegionDataLossKeepsItsCap(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	euRedis := redistest.New(t)
	eu, us := lossRegion(t, dsn, "eu", euRedis), lossRegion(t, dsn, "us", redistest.New(t))
	euSpent := spendAcme(t, eu, 2)
	euCap, ok := eu.regions.Cap(eu.state.Load().limits[0].limit, "{acme}:tenant=acme")
	if !ok || euCap < 4_000_000 {
		t.Fatalf("eu's cap %d (known %v): want room for 4 requests", euCap, ok)
	}
	if err := eu.regions.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	euCap, _ = eu.regions.Cap(eu.state.Load().limits[0].limit, "{acme}:tenant=acme")
	usSpent := spendAcme(t, us, 1)
	euSpent += spendAcme(t, eu, 2) // not reported: no rebalance since
	if err := euRedis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	euSpent += spendAcme(t, eu, 20)
	t.Logf("eu spent %d of its cap %d; us %d", euSpent, euCap/1_000_000, usSpent)
	if int64(euSpent)*1_000_000 > euCap {
		t.Fatalf("eu spent %d requests of 0.001 across its data loss, above its cap of %d nano-USD", euSpent, euCap)
	}
	if int64(euSpent)*1_000_000 < euCap {
		t.Fatalf("eu spent %d requests of 0.001, below its cap of %d nano-USD: the restore counted more than it spent", euSpent, euCap)
	}
}

// TestRegionDataLossWhileOtherRegionLedgerLags: after a Redis data loss
// a region's counters were restored to the ledger's spend less what the
// other regions last reported, on the grounds that their spend is at
// least that. The other regions report what their Redis counts, which
// includes requests admitted whose ledger entries are not in PostgreSQL
// yet (Record follows the debit, and the spool reaches the store up to
// BatchDelay later, on the other region's own flusher): the ledger's
// spend less their reports was then below this region's real spend, and
// what it spent since its last report was spent again. Here us has 3
// requests admitted but not yet in the ledger when it reports, and eu,
// which spent 4 of its cap of 5, loses its Redis: it must admit no more
// than its cap across the loss. The restore now counts eu's own entries
// in the ledger (see Regions.spent).
func TestRegionDataLossWhileOtherRegionLedgerLags(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	euRedis := redistest.New(t)
	eu, us := lossRegion(t, dsn, "eu", euRedis), lossRegion(t, dsn, "us", redistest.New(t))
	const key = "{acme}:tenant=acme"
	usSpent := spendAcme(t, us, 1) // us reads its cap
	euSpent := spendAcme(t, eu, 2)
	if err := eu.regions.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	euCap, _ := eu.regions.Cap(eu.state.Load().limits[0].limit, key)
	// us admits 3 requests; their ledger entries are not written yet when
	// us rebalances (reports them).
	c := us.Identify("cg-acme")
	var inflight []*Reservation
	for range 3 {
		res, d := us.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 1_000_000}})
		if res == nil {
			t.Fatalf("us refused: %+v", d)
		}
		inflight = append(inflight, res)
	}
	if err := us.regions.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	euSpent += spendAcme(t, eu, 2) // not reported
	if err := euRedis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	euSpent += spendAcme(t, eu, 20)
	for _, res := range inflight {
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, Charge{Cost: 1_000_000, HTTPStatus: 200})
	}
	t.Logf("us spent %d (+3 in flight); eu spent %d requests of 0.001 against its cap %d nano-USD (%d requests)", usSpent, euSpent, euCap, euCap/1_000_000)
	if int64(euSpent)*1_000_000 > euCap {
		t.Fatalf("eu spent %d requests of 0.001 across its data loss, above its cap of %d nano-USD: %d spent twice; global %d of 10",
			euSpent, euCap, int64(euSpent)-euCap/1_000_000, euSpent+usSpent+3)
	}
}

// lossRegion opens a gate of region (eu or us, rebalanced only when a test
// says) on the Redis srv and the ledger's PostgreSQL at dsn, with tenant
// acme (key cg-acme) and its daily budget of $0.01.
func lossRegion(t *testing.T, dsn, region string, srv *redistest.Server) *Gate {
	t.Helper()
	return acmeGate(t, dsn, srv, fmt.Sprintf("region: %s\nregions: {names: [eu, us], interval: 1h}\n", region))
}

// acmeGate opens a gate on the Redis srv and the ledger's PostgreSQL at
// dsn, with tenant acme (key cg-acme), its daily budget of $0.01, and the
// config lines extra. A restore waits up to 10 s for the other replicas'
// ledger records (ledger.peer_wait), not the default 2 s: these replicas
// all answer, and a slow test machine must not make one look dead.
func acmeGate(t *testing.T, dsn string, srv *redistest.Server, extra string) *Gate {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q, peer_wait: 10s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {name: daily, scope: tenant, amount: "0.01"}
`, t.TempDir(), srv.URL, dsn) + extra))
	if err != nil {
		t.Fatal(err)
	}
	g, err := Open(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// spendAcme makes up to n requests of $0.001 as acme on g, each recorded
// and settled at its estimate, and returns how many were admitted before
// the first refusal (a 402).
func spendAcme(t *testing.T, g *Gate, n int) (admitted int) {
	t.Helper()
	return spendAcmeUntil(t, g, n, 402)
}

// spendAcmeUntil is spendAcme with the refusal's status.
func spendAcmeUntil(t *testing.T, g *Gate, n, status int) (admitted int) {
	t.Helper()
	return spendAsUntil(t, g, "cg-acme", n, status)
}

// spendAsUntil is spendAcmeUntil as the caller of key.
func spendAsUntil(t *testing.T, g *Gate, key string, n, status int) (admitted int) {
	t.Helper()
	ctx := context.Background()
	c := g.Identify(key)
	for range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 1_000_000}})
		if res == nil {
			if d.Status != status {
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
