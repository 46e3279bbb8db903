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

// spendFree makes up to n requests of c that cost nothing (a rate limit
// service's hits on a limit without a price), each recorded and settled
// at 0, until one is refused with 429, and returns how many were
// admitted.
func spendFree(t *testing.T, g *Gate, c *Caller, n int) (admitted int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{}})
		if res == nil {
			if d.Status != 429 {
				t.Fatalf("%s refused with %d: %+v", c.User+c.KeyID, d.Status, d)
			}
			return admitted
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, Charge{HTTPStatus: 200})
		admitted++
	}
	return admitted
}

// TestLimitCallersAtkFreeCallersRestored: the restore of a data loss
// finds the callers of a limit keyed by the caller in the ledger, and
// found only those whose entries in the window cost something. bob's
// requests cost nothing (hits of the rate limit service on a limit in
// requests, the usual Envoy setup): after eve's request found the loss,
// bob, who had spent his 10 requests a day, was admitted 10 more.
func TestLimitCallersAtkFreeCallersRestored(t *testing.T) {
	for _, tc := range []struct {
		name, ledger string
		dim          string
	}{
		{"postgres/user", "postgres", "user"},
		{"postgres/api_key", "postgres", "api_key"},
		{"embedded/user", "embedded", "user"},
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
			if n := spendFree(t, g, caller("bob"), 20); n != 10 {
				t.Fatalf("bob before the loss: %d admitted of 10", n)
			}
			ctx := context.Background()
			if err := g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if n := spendFree(t, g, caller("eve"), 1); n != 1 {
				t.Fatalf("eve after the loss: %d admitted of 1", n)
			}
			if n := spendFree(t, g, caller("bob"), 20); n != 0 {
				t.Errorf("bob after Redis lost its data: %d more admitted of the 10 requests a day he had spent", n)
			}
		})
	}
}
