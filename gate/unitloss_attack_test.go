package gate

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// unitCases are the limits in units other than dollars that the loss
// tests configure, each at a rate that admits ten of unitUsage's
// requests (3 input tokens, 2 output tokens, one request).
var unitCases = []struct{ unit, rate string }{
	{"requests", "10"},
	{"tokens", "50"},
	{"input_tokens", "30"},
	{"output_tokens", "20"},
}

// unitUsage is the usage of each request of spendUsageUntil.
var unitUsage = costmodel.Usage{InputTokens: 3, OutputTokens: 2}

// spendUsageUntil makes up to n requests of unitUsage (and $0.000001) as
// the caller of key, each recorded and settled at its estimate, until one
// is refused with status, and returns how many were admitted.
func spendUsageUntil(t *testing.T, g *Gate, key string, n, status int) (admitted int) {
	t.Helper()
	ctx := context.Background()
	c := g.Identify(key)
	for range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Usage: unitUsage, Cost: 1_000}})
		if res == nil {
			if d.Status != status {
				t.Fatalf("refused with %d: %+v", d.Status, d)
			}
			return admitted
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, Charge{Usage: unitUsage, Cost: 1_000, HTTPStatus: 200})
		admitted++
	}
	return admitted
}

// TestLimitLossAtkUnitLimitsHold: a limit in requests or tokens keyed by
// the caller is an allowance over a window of its own, as a dollar limit
// is. acme spends 4 of its 10 requests' worth, and Redis then loses its
// data (FLUSHALL): the first request after the loss finds the tenant's
// counters gone, and must find the limit at what the ledger says acme
// counted in it, no more (6 more admitted, not 10, nor fewer), in every
// unit, caller dimension and amount-counting algorithm. Before, only the
// dollar limits were restored, and acme spent a day's requests or tokens
// again after each loss.
func TestLimitLossAtkUnitLimitsHold(t *testing.T) {
	for _, u := range unitCases {
		for _, algo := range sharedAlgorithms {
			for _, dims := range []string{"[tenant]", "[user]", "[api_key]", "[tenant, user]"} {
				t.Run(u.unit+"/"+algo+dims, func(t *testing.T) {
					t.Parallel()
					awayFromWindowEdge(t, 24*time.Hour)
					g, srv := acmeRedisGate(t, fmt.Sprintf("{name: allowance, dimensions: %s, unit: %s, rate: %s, period: 24h, algorithm: %s}", dims, u.unit, u.rate, algo))
					if n := spendUsageUntil(t, g, "cg-acme", 4, 429); n != 4 {
						t.Fatalf("before the first loss: %d admitted of 4", n)
					}
					if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
					if n := spendUsageUntil(t, g, "cg-acme", 20, 429); n != 6 {
						t.Fatalf("after Redis lost its data: %d admitted of the 6 requests' worth left of 10", n)
					}
					if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
					if n := spendUsageUntil(t, g, "cg-acme", 20, 429); n > 0 {
						t.Fatalf("after Redis lost its data again: %d more admitted of a limit acme had spent", n)
					}
				})
			}
		}
	}
}

// TestLimitLossAtkUncountedEntriesDoNotCount: what the limiter did not
// count must not count after a restore either, or an honest tenant is
// refused what it did not spend. acme spends 4 of 10, then has 3
// reservations recorded and cancelled (failed, no HTTP status: the
// limiter gave them back), 2 requests that never reached the upstream
// (their request returned, their usage none), and the ledger holds 5
// entries of acme's refused by a decision ("hard", "blocked") that no
// limiter counted. After the loss acme is admitted 6, as before it.
func TestLimitLossAtkUncountedEntriesDoNotCount(t *testing.T) {
	for _, u := range unitCases {
		t.Run(u.unit, func(t *testing.T) {
			t.Parallel()
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := acmeRedisGate(t, fmt.Sprintf("{name: allowance, dimensions: [tenant], unit: %s, rate: %s, period: 24h, algorithm: fixed_window}", u.unit, u.rate))
			ctx := context.Background()
			if n := spendUsageUntil(t, g, "cg-acme", 4, 429); n != 4 {
				t.Fatalf("before the loss: %d admitted of 4", n)
			}
			c := g.Identify("cg-acme")
			for i := range 5 {
				res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Usage: unitUsage, Cost: 1_000}})
				if res == nil {
					t.Fatalf("refused: %+v", d)
				}
				if d, ok := res.Record(ctx); !ok {
					t.Fatalf("record: %+v", d)
				}
				if i < 3 {
					res.Cancel(ctx)
				} else {
					res.Settle(ctx, Charge{Status: ledger.StatusFailed, Unreached: true})
				}
			}
			for i, decision := range []string{"hard", "hard", "blocked", "blocked", "hard_limit"} {
				e := ledger.Entry{RequestID: fmt.Sprintf("refused-%d", i), Tenant: "acme", User: "ann", KeyID: "acme-key",
					Route: "/x", Decision: decision, Status: ledger.StatusReserved, Estimated: unitUsage, EstimatedCost: 1_000,
					CreatedAt: time.Now()}
				if err := g.ledger.Reserve(ctx, e); err != nil {
					t.Fatal(err)
				}
				e.Status, e.Actual, e.ActualCost, e.HTTPStatus = ledger.StatusSettled, unitUsage, 1_000, 429
				if err := g.ledger.Settle(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if n := spendUsageUntil(t, g, "cg-acme", 20, 429); n != 6 {
				t.Fatalf("after Redis lost its data: %d admitted of the 6 requests' worth acme had left", n)
			}
		})
	}
}

// TestLimitLossAtkUnitLimitsLedgerDown: acme spends 4 of 10 on one
// process, which stops; another process on the same Redis and ledger
// database takes over, and Redis loses its data while the ledger's
// PostgreSQL is down: the new process never read what acme counted, so it
// is unknown. A fail-closed limit in requests or tokens then refuses with
// 503 (ErrSpendUnknown), as one in dollars does, until the database
// answers, and is then restored to what acme counted (6 more of 10
// admitted); a fail-open one keeps serving.
func TestLimitLossAtkUnitLimitsLedgerDown(t *testing.T) {
	for _, posture := range []string{"fail_closed", "fail_open"} {
		for _, u := range []struct{ unit, rate string }{
			{"usd", `rate_usd: "0.00001"`}, {"requests", "rate: 10"}, {"tokens", "rate: 50"},
		} {
			t.Run(posture+"/"+u.unit, func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				srv, pg := redistest.New(t), pgtest.NewPrivate(t)
				open := func() *Gate {
					return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
limits:
  - {name: allowance, dimensions: [tenant], unit: %s, %s, period: 24h, algorithm: fixed_window, on_store_failure: %s}
`, t.TempDir(), srv.URL, pg.URL(), u.unit, u.rate, posture))
				}
				ctx := context.Background()
				g := open()
				if n := spendUsageUntil(t, g, "cg-acme", 4, 429); n != 4 {
					t.Fatalf("before the loss: %d admitted of 4", n)
				}
				if err := g.Close(); err != nil {
					t.Fatal(err)
				}
				g = open()
				t.Cleanup(func() { g.Close() })
				pg.Stop()
				if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				c := g.Identify("cg-acme")
				res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Usage: unitUsage, Cost: 1_000}})
				if posture == "fail_open" {
					if res == nil {
						t.Fatalf("fail-open, the ledger down: refused with %d", d.Status)
					}
					res.Cancel(ctx)
					return
				}
				if res != nil || d.Status != http.StatusServiceUnavailable {
					t.Fatalf("fail-closed, the ledger down and acme's count unknown: admitted %v, status %d; want 503", res != nil, d.Status)
				}
				pg.Start()
				for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
					res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Usage: unitUsage, Cost: 1_000}, Check: true})
					if res == nil && d.Status != http.StatusServiceUnavailable {
						break // decided: restored
					}
					if time.Now().After(end) {
						t.Fatalf("the database back for 20 s: still answered %d", d.Status)
					}
				}
				if n := spendUsageUntil(t, g, "cg-acme", 20, 429); n != 6 {
					t.Fatalf("the database back: %d admitted of the 6 requests' worth acme had left", n)
				}
			})
		}
	}
}

// TestLimitLossAtkUnitLimitsRestartOnMemory: the embedded default (the
// in-memory store, the embedded ledger) restarted: the new process's
// store starts empty, and a limit in requests or tokens acme spent this
// hour must stay spent.
func TestLimitLossAtkUnitLimitsRestartOnMemory(t *testing.T) {
	for _, u := range unitCases {
		t.Run(u.unit, func(t *testing.T) {
			t.Parallel()
			open := onDataDir(t, fmt.Sprintf(`tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: allowance, dimensions: [tenant], unit: %s, rate: %s, period: 1h, algorithm: sliding_window}
`, u.unit, u.rate))
			g := open()
			if n := spendUsageUntil(t, g, "cg-acme", 20, 429); n != 10 {
				t.Fatalf("before the restart: %d admitted of 10", n)
			}
			if err := g.Close(); err != nil {
				t.Fatal(err)
			}
			g = open()
			defer g.Close()
			if n := spendUsageUntil(t, g, "cg-acme", 20, 429); n > 0 {
				t.Fatalf("after a restart: %d more admitted of a limit acme had spent this hour", n)
			}
		})
	}
}
