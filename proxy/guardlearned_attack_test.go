package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/simulator"
)

// TestGuardLearnedAttackStreamPastLearnedReservation: under output_reserve
// p95 a stream is admitted on the learned quantile of its key's output, not
// on its output limit. A tenant teaches its key short answers, then streams
// answers of their whole output limit against a budget that holds one and
// a fifth of them: the stream guard must debit the output beyond what the
// gate reserved, and stop the second stream at the budget, on each route
// and store, as it does under a percentage.
func TestGuardLearnedAttackStreamPastLearnedReservation(t *testing.T) {
	const inc = 16
	est := estimator(t)
	short := simulator.New(simulator.Config{Estimator: est, ReplyTokens: 8})
	long := simulator.New(simulator.Config{Estimator: est, ReplyTokens: 5000})
	for _, store := range []string{"memory", "redis"} {
		for _, rt := range guardedRoutes {
			t.Run(store+"/"+rt.name, func(t *testing.T) {
				// A budget that admits a cold key's whole reservation (1,500
				// tokens), and holds the short answers and 1.2 long ones.
				const teach = 40 // so that one long answer leaves the p95 short
				budget := est.Cost(rt.model, costmodel.Usage{InputTokens: 16 * (teach + 2), OutputTokens: 10*teach + 1800})
				var attack atomic.Bool
				up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if attack.Load() {
						long.ServeHTTP(w, r)
						return
					}
					short.ServeHTTP(w, r)
				})
				o := stackOptions{policies: allowAll, upstream: up,
					extra: guardConfigCosts("  output_reserve: p95\n  learned: {min_samples: 5, interval: 1h}\n", budget.String(), inc)}
				if store == "redis" {
					o.redisURL = redistest.New(t).URL
				}
				s := newStackWith(t, o)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				for range teach {
					if got := rt.stream(ctx, s, rt.model, 1500); got.err != nil {
						t.Fatalf("a short answer: %v", got.err)
					}
					if err := s.srv.WaitIdle(ctx); err != nil { // settled, so learned, before the next reserves
						t.Fatal(err)
					}
				}
				attack.Store(true)
				if got := rt.stream(ctx, s, rt.model, 1500); got.err != nil {
					t.Fatalf("the first long answer, which the budget holds: %v", got.err)
				}
				got := rt.stream(ctx, s, rt.model, 1500)
				entries := s.entries(t)
				if len(entries) != teach+2 {
					t.Fatalf("%d ledger entries, want %d; the stream's error: %v", len(entries), teach+2, got.err)
				}
				last := entries[len(entries)-1]
				if last.Estimated.OutputTokens >= 1500 {
					t.Fatalf("the stream reserved %d output tokens: the learned estimate was not applied", last.Estimated.OutputTokens)
				}
				var spent costmodel.NanoUSD
				for _, e := range entries {
					spent += e.ActualCost
				}
				bound := est.Cost(rt.model, costmodel.Usage{OutputTokens: inc})
				t.Logf("reserved and extended %d output tokens, billed %d; spent %v of a %v budget",
					last.Estimated.OutputTokens, last.Actual.OutputTokens, spent, budget)
				if spent > budget+bound {
					t.Errorf("spent %v of a %v budget: over by more than one increment (%v); the stream's error: %v", spent, budget, bound, got.err)
				}
				stoppedByBudget(t, rt.kind, got.err)
			})
		}
	}
}
