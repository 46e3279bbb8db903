package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestFallbackAtkFlappingRedisWithTheLedgerDown: two replicas
// (fallback_replicas: 2) share Redis and a PostgreSQL ledger; a caller has
// spent $0.002 of its $0.01 day, which both replicas have read. The
// ledger's database goes down, then Redis refuses every write, comes back
// and refuses again, three times. Each outage starts a fallback restored
// from what the replica knows: its last read of the database plus its own
// records since, which include what it admitted on the earlier outages'
// fallbacks. Dividing that whole figure by the replicas forgot half of
// each replica's own fallback spend at each outage: the two replicas
// admitted $0.014 of the $0.008 left. The fallbacks together must stay
// within the budget: 8 requests of $0.001. So for a tenant's budget (read
// as one spend) and for a user's that only the rate limit service names
// (read with the tenant's other users, by user).
func TestFallbackAtkFlappingRedisWithTheLedgerDown(t *testing.T) {
	for _, tc := range []struct {
		name, scope string
		caller      func(g *gate.Gate) *gate.Caller
	}{
		{"tenant", "tenant", func(g *gate.Gate) *gate.Caller { return g.Identify("cg-acme") }},
		{"user the RLS names", "user", func(g *gate.Gate) *gate.Caller { return g.Trusted("acme", "ann", "", "small") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fallbackAtkFlapping(t, tc.scope, tc.caller)
		})
	}
}

func fallbackAtkFlapping(t *testing.T, scope string, caller func(g *gate.Gate) *gate.Caller) {
	ctx := context.Background()
	srv, pg := redistest.New(t), pgtest.NewPrivate(t)
	replica := func() *gate.Gate {
		return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, fallback_replicas: 2, timeout: 5s, queue_timeout: 5s, breaker_failures: 1, breaker_cooldown: 20ms}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {name: daily, scope: %s, amount: "0.01"}
`, t.TempDir(), srv.URL, pg.URL(), scope))
	}
	replicas := []*gate.Gate{replica(), replica()}
	milli := costmodel.Estimate{Cost: usd("0.001")}
	for _, g := range replicas {
		if n, d := admitN(t, g, caller(g), milli, 1); n != 1 {
			t.Fatalf("a first request: %+v", d)
		}
	}
	for _, g := range replicas {
		if err := g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range replicas { // both read the $0.002
		if err := g.ReconcileBudgets(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pg.Stop()
	for _, g := range replicas {
		// A request cancelled writes two records that the ledger cannot
		// store: it notices its database out, and charges nothing.
		res, d := g.Reserve(ctx, &gate.Request{Caller: caller(g), Route: "/v1/chat/completions", Estimate: milli})
		if res == nil {
			t.Fatalf("with the ledger down: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		res.Cancel(ctx)
		for end := time.Now().Add(10 * time.Second); g.Ledger().Stats().StoreErr == nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("the ledger did not notice its database out")
			}
		}
	}
	rc := srv.Client(t)
	admitted := 0
	for outage := range 3 {
		if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		for i, g := range replicas {
			n, d := admitN(t, g, caller(g), milli, 20)
			if !d.Degraded || d.Status != http.StatusPaymentRequired {
				t.Fatalf("outage %d, replica %d: %d admitted, then %d (degraded %v); want a degraded 402", outage, i, n, d.Status, d.Degraded)
			}
			admitted += n
		}
		if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond) // past the cooldown
		for i, g := range replicas {
			// Redis decides again (and closes the breaker): a request of
			// more than is left is refused there, not on the fallback.
			res, d := g.Reserve(ctx, &gate.Request{Caller: caller(g), Route: "/v1/chat/completions", Estimate: costmodel.Estimate{Cost: usd("0.0099")}})
			if res != nil || d.Degraded || d.Status != http.StatusPaymentRequired {
				if res != nil {
					res.Cancel(ctx)
				}
				t.Fatalf("Redis back after outage %d, replica %d: %+v, want a 402 from Redis", outage, i, d)
			}
		}
	}
	pg.Start() // the replicas' Close then flushes their spools at once
	t.Logf("the fallbacks of three outages admitted %d", admitted)
	if admitted > 8 {
		t.Errorf("%s: over three outages with the ledger down, the two replicas' fallbacks admitted %d requests of $0.001; $0.008 was left", scope, admitted)
	}
}
