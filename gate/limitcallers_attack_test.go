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
	ctx := context.Background()
	for range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 1_000_000}})
		if res == nil {
			if d.Status != status {
				t.Fatalf("%s refused with %d: %+v", c.User+c.KeyID, d.Status, d)
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

// TestLimitCallersAtkOthersRestored: a limit keyed by the caller (10
// requests a day per user, or per key) is restored from the ledger after
// a data loss, for every caller: the rate limit service and the reserve
// API name users and keys no list holds, and the first request after
// the loss, of another caller, restored only its own counter and marked
// the tenant fresh. bob, who had spent his 10, was admitted 10 more.
func TestLimitCallersAtkOthersRestored(t *testing.T) {
	for _, tc := range []struct {
		dim      string
		bob, eve func(g *Gate) *Caller
	}{
		{"user", func(g *Gate) *Caller { return g.Trusted("acme", "bob", "", "small") },
			func(g *Gate) *Caller { return g.Trusted("acme", "eve", "", "small") }},
		{"api_key", func(g *Gate) *Caller { return g.Trusted("acme", "", "key-bob", "small") },
			func(g *Gate) *Caller { return g.Trusted("acme", "", "key-eve", "small") }},
	} {
		t.Run(tc.dim, func(t *testing.T) {
			awayFromWindowEdge(t, 24*time.Hour)
			dsn, srv := pgtest.New(t), redistest.New(t)
			g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: dave-key, key: cg-dave, user: dave}]}
limits:
  - {name: per-caller, dimensions: [%s], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}
`, t.TempDir(), srv.URL, dsn, tc.dim))
			t.Cleanup(func() { g.Close() })
			if n := spendTrusted(t, g, tc.bob(g), 20, 429); n != 10 {
				t.Fatalf("bob before the loss: %d admitted of 10", n)
			}
			ctx := context.Background()
			if err := g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if n := spendTrusted(t, g, tc.eve(g), 1, 429); n != 1 {
				t.Fatalf("eve after the loss: %d admitted of 1", n)
			}
			if n := spendTrusted(t, g, tc.bob(g), 20, 429); n != 0 {
				t.Errorf("bob after Redis lost its data: %d more admitted of the 10 requests a day he had spent", n)
			}
		})
	}
}
