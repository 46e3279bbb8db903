package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// rlsDebit debits n hits on acme's limits as the rate limit service does
// a descriptor's hits_addend in requests (a final debit that counts n
// requests, priced $0.000001 so that it is recorded), and settles it.
func rlsDebit(t *testing.T, g *Gate, n int64) {
	t.Helper()
	ctx := context.Background()
	res, d := g.Reserve(ctx, &Request{Caller: g.Identify("cg-acme"), Route: "rls:envoy", NoRequests: true, Requests: n,
		Final: true, States: true, Estimate: costmodel.Estimate{Cost: 1_000}})
	if res == nil {
		t.Fatalf("a debit of %d hits refused: %+v", n, d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatalf("record: %+v", d)
	}
	res.Settle(ctx, Charge{Cost: 1_000, HTTPStatus: 200})
}

// rlsCharge charges acme unitUsage already served, as the rate limit
// service does a stream's tokens reported at its end (Envoy's
// apply_on_stream_done): no request.
func rlsCharge(t *testing.T, g *Gate) {
	t.Helper()
	ctx := context.Background()
	res, d := g.Reserve(ctx, &Request{Caller: g.Identify("cg-acme"), Route: "rls:envoy", NoRequests: true, Served: true, States: true})
	if res == nil {
		t.Fatalf("a charge refused: %+v", d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatalf("record: %+v", d)
	}
	res.Settle(ctx, Charge{Usage: unitUsage, Cost: 1_000, HTTPStatus: 200})
}

// TestLimitLossAtkHitsAsCounted: the ledger restores a limit in requests
// to the requests the limiter counted, not to one per entry. acme has
// 100 requests a day and spends 60 in one debit of the rate limit
// service (hits_addend 60); Redis then loses its data (FLUSHALL), or the
// in-memory store its process: acme must get 40 more, not 99. Usage
// charges (a stream's tokens reported after it) count no request: 4 of
// 10 requests spent and 3 charges leave 6, not 3. A tokens limit counts
// the charges' tokens and a debit's none, as the limiter did. On Redis
// with the embedded ledger and with PostgreSQL's, and on the in-memory
// store restarted. Before, every recorded entry counted one request.
func TestLimitLossAtkHitsAsCounted(t *testing.T) {
	scenarios := []struct {
		name, limit string
		spend       func(t *testing.T, g *Gate)
		left        int
	}{
		{"debit of 60 hits", "unit: requests, rate: 100", func(t *testing.T, g *Gate) { rlsDebit(t, g, 60) }, 40},
		{"usage charges", "unit: requests, rate: 10", func(t *testing.T, g *Gate) {
			if n := spendUsageUntil(t, g, "cg-acme", 4, 429); n != 4 {
				t.Fatalf("%d admitted of 4", n)
			}
			for range 3 {
				rlsCharge(t, g)
			}
		}, 6},
		{"usage charges on tokens", "unit: tokens, rate: 50", func(t *testing.T, g *Gate) {
			if n := spendUsageUntil(t, g, "cg-acme", 4, 429); n != 4 {
				t.Fatalf("%d admitted of 4", n)
			}
			rlsCharge(t, g)
			rlsCharge(t, g) // 30 of 50 tokens
		}, 4},
		{"debit on tokens", "unit: tokens, rate: 50", func(t *testing.T, g *Gate) { rlsDebit(t, g, 60) }, 10},
	}
	for _, backend := range []string{"redis", "redis+postgres", "memory"} {
		for _, sc := range scenarios {
			t.Run(backend+"/"+sc.name, func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				dir, store, ledgerDSN := t.TempDir(), "", ""
				var srv *redistest.Server
				if backend != "memory" {
					srv = redistest.New(t)
					store = fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}", srv.URL)
				}
				if backend == "redis+postgres" {
					ledgerDSN = fmt.Sprintf("ledger: {dsn: %q}", pgtest.New(t))
				}
				open := func() *Gate {
					g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
%s
%s
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
limits:
  - {name: allowance, dimensions: [tenant], %s, period: 24h, algorithm: fixed_window}
`, dir, store, ledgerDSN, sc.limit))
					t.Cleanup(func() { g.Close() })
					return g
				}
				g := open()
				sc.spend(t, g)
				if srv != nil {
					if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := g.Close(); err != nil {
						t.Fatal(err)
					}
					g = open()
				}
				if n := spendUsageUntil(t, g, "cg-acme", 200, 429); n != sc.left {
					t.Fatalf("after the store lost its data: %d admitted of the %d requests' worth acme had left", n, sc.left)
				}
			})
		}
	}
}
