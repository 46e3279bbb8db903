package gate

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// TestUnrecordedAtkDebitBeforeTheLossCounts: a request debited before
// Redis loses its data and recorded in the ledger after the restore
// that the loss caused (a policy's friction delay holds it between the
// two, up to 30 s) was counted by neither: its debit went with the data,
// and the restore read the ledger without its entry. acme spends 6 of
// its 10 requests a day, 3 more are debited and held, Redis is flushed,
// and a request after the loss restores acme; once the 3 are recorded,
// acme has 1 left, on a budget and a limit alike. Before, it was
// admitted 4: 13 of 10.
func TestUnrecordedAtkDebitBeforeTheLossCounts(t *testing.T) {
	for _, limit := range []string{
		`{name: daily, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}`,
		`{name: spend, dimensions: [tenant], unit: usd, rate_usd: "0.01", period: 24h, algorithm: sliding_window}`,
		`{name: meter, dimensions: [user], unit: requests, rate: 10, period: 24h, algorithm: token_bucket}`,
	} {
		t.Run(limit[7:12], func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := acmeRedisGate(t, limit)
			ctx := context.Background()
			if n := spendAcmeUntil(t, g, 6, 429); n != 6 {
				t.Fatalf("before the loss: %d admitted of 6", n)
			}
			c := g.Identify("cg-acme")
			var held []*Reservation
			for range 3 {
				res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 1_000_000}})
				if res == nil {
					t.Fatalf("a held request refused: %+v", d)
				}
				held = append(held, res)
			}
			if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			// The first request after the loss restores acme; the held
			// ones are recorded and settled after it.
			first := spendAcmeUntil(t, g, 1, 429)
			for _, res := range held {
				if d, ok := res.Record(ctx); !ok {
					t.Fatalf("record: %+v", d)
				}
				res.Settle(ctx, Charge{Cost: 1_000_000, HTTPStatus: 200})
			}
			if n := first + spendAcmeUntil(t, g, 20, 429); n != 1 {
				t.Fatalf("after the loss: %d admitted where 1 of 10 was left (6 spent, 3 debited before the loss and recorded after it)", n)
			}
		})
	}
}
