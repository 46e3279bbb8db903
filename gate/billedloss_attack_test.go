package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestBilledLossAtkRefundAfterTheRestore: a front door may bill a
// request's ledger entry before it settles its limits (the proxy bills
// as soon as the upstream's answer says what it cost, and settles once
// the client has the answer). Redis loses its data between the two, and
// the restore counts the request at what it was billed; its settlement
// then refunded what its reservation held beyond that, on the restored
// counter: counted once by the restore, and given back again. acme holds
// two requests of $0.004 billed at $0.0005 each; Redis is flushed; a
// request of $0.001 restores acme; the two settle. $0.008 of the $0.01
// limit is left. Before, a token bucket and a GCRA refunded $0.007: 11
// more were admitted, $0.012 of $0.01.
func TestBilledLossAtkRefundAfterTheRestore(t *testing.T) {
	for _, algo := range sharedAlgorithms {
		t.Run(algo, func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := acmeRedisGate(t, fmt.Sprintf(`{name: spend, dimensions: [tenant], unit: usd, rate_usd: "0.01", period: 24h, algorithm: %s}`, algo))
			ctx := context.Background()
			held := billedAcme(t, g, 2)
			if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			first := spendAcmeUntil(t, g, 1, 429) // restores acme: the two at $0.0005 each
			for _, res := range held {
				res.Settle(ctx, Charge{Cost: 500_000, HTTPStatus: 200})
			}
			n := first + spendAcmeUntil(t, g, 30, 429)
			if spent := 1_000_000 + n*1_000_000; spent > 10_000_000 {
				t.Fatalf("after the loss: %d requests of $0.001 admitted beside the two billed at $0.0005: %d nano-USD of a $0.01 limit", n, spent)
			}
			if n != 9 {
				t.Fatalf("after the loss: %d requests of $0.001 admitted, want 9", n)
			}
		})
	}
}

// TestBilledLossAtkNoLossRefunds: without a loss, a request billed before
// its limits are settled is refunded what it did not spend, as any.
func TestBilledLossAtkNoLossRefunds(t *testing.T) {
	for _, algo := range sharedAlgorithms {
		t.Run(algo, func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			g, _ := acmeRedisGate(t, fmt.Sprintf(`{name: spend, dimensions: [tenant], unit: usd, rate_usd: "0.01", period: 24h, algorithm: %s}`, algo))
			ctx := context.Background()
			for _, res := range billedAcme(t, g, 2) {
				res.Settle(ctx, Charge{Cost: 500_000, HTTPStatus: 200})
			}
			if n := spendAcmeUntil(t, g, 30, 429); n != 9 {
				t.Fatalf("%d requests of $0.001 admitted beside the two billed at $0.0005, want 9", n)
			}
		})
	}
}

// billedAcme reserves n requests of $0.004 as acme on g, records them and
// bills them at $0.0005 each, unsettled.
func billedAcme(t *testing.T, g *Gate, n int) []*Reservation {
	t.Helper()
	ctx := context.Background()
	c := g.Identify("cg-acme")
	var held []*Reservation
	for range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 4_000_000}})
		if res == nil {
			t.Fatalf("refused: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		if err := res.Bill(ctx, Charge{Cost: 500_000, HTTPStatus: 200}, false); err != nil {
			t.Fatal(err)
		}
		held = append(held, res)
	}
	return held
}

// TestBilledLossAtkKeptRefundAfterAPeersRestore: a settlement the store
// fails (Redis killed) is kept to be made again, and the entry is billed
// at once. Redis comes back empty; replica b restores acme from the
// ledger, which has the entries billed; replica a then makes its kept
// settlements, refunds of what the restore did not count. acme's two
// requests of $0.004 on a settled at $0.0005 each: $0.007 of a $0.008
// limit is left. Before, the refunds emptied a token bucket or a GCRA:
// $0.009 more were admitted, $0.010 of $0.008 (the budget of $0.01
// stopped it there).
func TestBilledLossAtkKeptRefundAfterAPeersRestore(t *testing.T) {
	for _, algo := range sharedAlgorithms {
		t.Run(algo, func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			dsn, srv := pgtest.New(t), redistest.New(t)
			limit := fmt.Sprintf(`
limits:
  - {name: spend, dimensions: [tenant], unit: usd, rate_usd: "0.008", period: 24h, algorithm: %s}
`, algo)
			// a's catch-up loop waits an hour: its kept settlements are
			// made by its next request, after b's restore.
			a, b := keptGate(t, dsn, srv, limit, "1h"), keptGate(t, dsn, srv, limit, "1s")
			ctx := context.Background()
			c := a.Identify("cg-acme")
			var held []*Reservation
			for range 2 {
				res, d := a.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 4_000_000}})
				if res == nil {
					t.Fatalf("refused: %+v", d)
				}
				if d, ok := res.Record(ctx); !ok {
					t.Fatalf("record: %+v", d)
				}
				held = append(held, res)
			}
			srv.Stop(t)
			for _, res := range held {
				res.Settle(ctx, Charge{Cost: 500_000, HTTPStatus: 200}) // kept; billed
			}
			srv.Restart(t)
			first := spendAcmeUntilEither(t, b, 1) // b restores acme: $0.001 billed
			n := first + spendAcmeUntilEither(t, a, 30) + spendAcmeUntilEither(t, b, 30)
			if spent := 1_000_000 + n*1_000_000; spent > 8_000_000 {
				t.Fatalf("after the loss: %d requests of $0.001 admitted beside the two settled at $0.0005: %d nano-USD of a $0.008 limit", n, spent)
			}
		})
	}
}

// keptGate is acmeGate with the limit and the breaker's cooldown (and so
// the catch-up loop's period).
func keptGate(t *testing.T, dsn string, srv *redistest.Server, limit, cooldown string) *Gate {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s, breaker_cooldown: %s}
ledger: {dsn: %q, peer_wait: 10s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {name: daily, scope: tenant, amount: "0.01"}
`, t.TempDir(), srv.URL, cooldown, dsn) + limit))
	if err != nil {
		t.Fatal(err)
	}
	return openConfig(t, cfg)
}
