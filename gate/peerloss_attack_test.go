package gate

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestPeerLossAtkHeldOnAnotherReplicaCounts: two replicas, a and b, share
// one Redis and one PostgreSQL ledger. acme spends 6 of its budget of 10
// requests a day (and of a token bucket of 10 per user), b debits 3 more
// and holds them between debit and record (a policy's friction delay),
// Redis loses its data, and a's next request restores acme from the
// ledger, which lacks b's 3. Once b records and settles them, acme has 1
// left. Before, only the replica that restored charged its held requests
// again: b's 3 were counted by neither, and acme was admitted 4 (13 of
// 10).
func TestPeerLossAtkHeldOnAnotherReplicaCounts(t *testing.T) {
	for name, extra := range map[string]string{
		"budget": "",
		"bucket": `
limits:
  - {name: meter, dimensions: [user], unit: requests, rate: 10, period: 24h, algorithm: token_bucket}
`,
	} {
		t.Run(name, func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			dsn := pgtest.New(t)
			srv := redistest.New(t)
			a, b := acmeGate(t, dsn, srv, extra), acmeGate(t, dsn, srv, extra)
			ctx := context.Background()
			if n := spendAcme(t, a, 1) + spendAcme(t, b, 5); n != 6 {
				t.Fatalf("before the loss: %d admitted of 6", n)
			}
			c := b.Identify("cg-acme")
			var held []*Reservation
			for range 3 {
				res, d := b.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 1_000_000}})
				if res == nil {
					t.Fatalf("a held request refused: %+v", d)
				}
				held = append(held, res)
			}
			if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			// a's first request after the loss restores acme; b's held
			// ones are recorded and settled after it.
			first := spendAcme(t, a, 1)
			for _, res := range held {
				if d, ok := res.Record(ctx); !ok {
					t.Fatalf("record: %+v", d)
				}
				res.Settle(ctx, Charge{Cost: 1_000_000, HTTPStatus: 200})
			}
			// Budget and bucket run out together: either refuses.
			n := first + spendAcmeUntilEither(t, a, 10) + spendAcmeUntilEither(t, b, 10)
			if n != 1 {
				t.Fatalf("after the loss: %d admitted where 1 of 10 was left (6 spent, 3 debited on b before the loss and recorded after a restored)", n)
			}
		})
	}
}

// spendAcmeUntilEither is spendAcme refused by a budget (402) or a limit
// (429).
func spendAcmeUntilEither(t *testing.T, g *Gate, n int) (admitted int) {
	t.Helper()
	ctx := context.Background()
	c := g.Identify("cg-acme")
	for range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 1_000_000}})
		if res == nil {
			if d.Status != 402 && d.Status != 429 {
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
