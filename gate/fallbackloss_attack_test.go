package gate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// TestFallbackLossAtkHeldBeforeTheOutage: acme records 6 of its 10
// requests a day, and 3 more are debited in Redis and held before their
// ledger entries (a policy's friction delay holds a request so for up to
// 30 s). Redis goes out: the first request of the outage restores the
// local fallback from the ledger, which counts 6, and is admitted; the 3
// are recorded after. The fallback must count them: acme has spent its
// 10. Before, it was admitted 3 more on the fallback, 13 of 10, on every
// algorithm (a Redis that loses its data charged such requests again
// already, TestUnrecordedAtkDebitBeforeTheLossCounts).
func TestFallbackLossAtkHeldBeforeTheOutage(t *testing.T) {
	for _, limit := range []string{
		`{name: daily, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}`,
		`{name: daily, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: sliding_window}`,
		`{name: daily, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: token_bucket}`,
		`{name: daily, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: gcra}`,
		`{name: daily, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: sliding_log}`,
		`{name: spend, dimensions: [user], unit: usd, rate_usd: "0.01", period: 24h, algorithm: token_bucket}`,
	} {
		t.Run(limit[strings.LastIndex(limit, " ")+1:len(limit)-1]+"/"+limit[7:12], func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := acmeRedisGate(t, limit)
			ctx := context.Background()
			if n := spendAcmeUntil(t, g, 6, 429); n != 6 {
				t.Fatalf("before the outage: %d admitted of 6", n)
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
			srv.Stop(t)
			// The first request of the outage restores the fallback, then
			// the held ones are recorded and settled.
			if n := spendAcmeUntil(t, g, 1, 429); n != 1 {
				t.Fatalf("the first request of the outage: %d admitted", n)
			}
			for _, res := range held {
				if d, ok := res.Record(ctx); !ok {
					t.Fatalf("record: %+v", d)
				}
				res.Settle(ctx, Charge{Cost: 1_000_000, HTTPStatus: 200})
			}
			if n := spendAcmeUntil(t, g, 20, 429); n > 0 {
				t.Fatalf("on the fallback: %d more admitted to acme, which had spent its 10 (6 recorded, 3 debited before the outage and recorded after it, 1 on the fallback)", n)
			}
		})
	}
}
