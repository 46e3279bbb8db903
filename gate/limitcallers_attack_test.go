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

// spendTrusted makes up to n requests of $0.001 as c, each recorded and
// settled, until one is refused (with status), and returns how many were
// admitted.
func spendTrusted(t *testing.T, g *Gate, c *Caller, n, status int) (admitted int) {
	t.Helper()
	return spendEach(t, g, c, n, status, 1_000_000)
}

// spendEach is spendTrusted with requests of cost each: 0 for a rate
// limit service's hits on a limit without a price.
func spendEach(t *testing.T, g *Gate, c *Caller, n, status int, cost costmodel.NanoUSD) (admitted int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: cost}})
		if res == nil {
			if d.Status != status {
				t.Fatalf("%s refused with %d: %+v", c.User+c.KeyID, d.Status, d)
			}
			return admitted
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, Charge{Cost: cost, HTTPStatus: 200})
		admitted++
	}
	return admitted
}

// TestLimitCallersAtkOthersRestored: a limit keyed by the caller (10
// requests a day per user, or per key) is restored from the ledger after
// a data loss, for every caller: the rate limit service and the reserve
// API name users and keys no list holds, and the first request after
// the loss, of another caller, restored only its own counter and marked
// the tenant fresh. bob, who had spent his 10, was admitted 10 more. The
// callers were then found by their spend alone, and bob was again when
// his requests cost nothing (a rate limit service's hits on a limit in
// requests without a price, the usual Envoy setup), on PostgreSQL and on
// the embedded ledger.
func TestLimitCallersAtkOthersRestored(t *testing.T) {
	for _, tc := range []struct {
		name, dim, ledger string
		cost              costmodel.NanoUSD
	}{
		{"user", "user", "postgres", 1_000_000},
		{"api_key", "api_key", "postgres", 1_000_000},
		{"user/free", "user", "postgres", 0},
		{"api_key/free", "api_key", "postgres", 0},
		{"user/free/embedded", "user", "embedded", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			srv := redistest.New(t)
			led := "{}"
			if tc.ledger == "postgres" {
				led = fmt.Sprintf("{dsn: %q}", pgtest.New(t))
			}
			g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: %s
tenants:
  - {name: acme, plan: small, keys: [{id: dave-key, key: cg-dave, user: dave}]}
limits:
  - {name: per-caller, dimensions: [%s], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}
`, t.TempDir(), srv.URL, led, tc.dim))
			t.Cleanup(func() { g.Close() })
			caller := func(name string) *Caller {
				if tc.dim == "user" {
					return g.Trusted("acme", name, "", "small")
				}
				return g.Trusted("acme", "", "key-"+name, "small")
			}
			if n := spendEach(t, g, caller("bob"), 20, 429, tc.cost); n != 10 {
				t.Fatalf("bob before the loss: %d admitted of 10", n)
			}
			ctx := context.Background()
			if err := g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if n := spendEach(t, g, caller("eve"), 1, 429, tc.cost); n != 1 {
				t.Fatalf("eve after the loss: %d admitted of 1", n)
			}
			if n := spendEach(t, g, caller("bob"), 20, 429, tc.cost); n != 0 {
				t.Errorf("bob after Redis lost its data: %d more admitted of the 10 requests a day he had spent", n)
			}
		})
	}
}
