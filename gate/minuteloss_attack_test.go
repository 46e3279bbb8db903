package gate

import (
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestLimitLossAtkLedgerDownAfterTheMinuteTurned: a fail-closed limit
// whose window moves with the clock (a sliding window or log, a token
// bucket, a GCRA) restored from the ledger while Redis answers, then, a
// minute later, Redis loses its data with the database down. The restore
// reads its window from a minute later than the read it made, which this
// node never read exactly; the read of a minute before covers it, so it
// is restored from that read and the spool (5 of 10 spent, 5 more
// admitted), not refused with 503 until the database answers. Before, a
// restore in the minute after its last read refused every request:
// whether CI's loss tests hit that depended on the second they ran.
//
// The gates are set up and read before t.Parallel, while the package's
// other tests wait: the minute turns while they run, and the test waits
// for it only when they took less than a minute (before, it slept up to a
// minute at the package's end, every other test done).
func TestLimitLossAtkLedgerDownAfterTheMinuteTurned(t *testing.T) {
	type loss struct {
		name string
		g    *Gate
		srv  *redistest.Server
		pg   *pgtest.Private
		b    groupRequest
	}
	var losses []loss
	for _, c := range []struct {
		algo, dims string
		a, b       groupRequest
	}{
		{"sliding_window", "[tenant]", groupRequest{key: "cg-acme"}, groupRequest{key: "cg-acme"}},
		{"token_bucket", "[tenant]", groupRequest{key: "cg-acme"}, groupRequest{key: "cg-acme"}},
		{"sliding_log", "[model]", groupRequest{key: "cg-acme", model: "gpt-4o"}, groupRequest{key: "cg-beta", model: "gpt-4o"}},
		{"gcra", "[model]", groupRequest{key: "cg-acme", model: "gpt-4o"}, groupRequest{key: "cg-beta", model: "gpt-4o"}},
	} {
		srv, pg := redistest.New(t), pgtest.NewPrivate(t)
		g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
  - {name: beta, plan: small, keys: [{id: beta-key, key: cg-beta}]}
limits:
  - {name: day, dimensions: %s, unit: requests, rate: 10, period: 24h, algorithm: %s, on_store_failure: fail_closed}
`, t.TempDir(), srv.URL, pg.URL(), c.dims, c.algo))
		t.Cleanup(func() { g.Close() })
		name := c.algo + c.dims
		if n := spendGroupUntil(t, g, c.a, 4, 429); n != 4 {
			t.Fatalf("%s before the loss: %d admitted of 4", name, n)
		}
		losses = append(losses, loss{name, g, srv, pg, c.b})
	}
	// The last read of each, while the database answers, then the
	// minute turns.
	for _, l := range losses {
		flushRedis(t, l.srv)
		if n := spendGroupUntil(t, l.g, l.b, 1, 429); n != 1 {
			t.Fatalf("%s after the first loss, the database up: %d admitted of 1", l.name, n)
		}
	}
	turn := time.Now().Truncate(time.Minute).Add(time.Minute)
	t.Parallel()
	if d := time.Until(turn); d > 0 {
		t.Logf("waiting %v for the minute to turn", d)
		time.Sleep(d + 100*time.Millisecond)
	}
	for _, l := range losses {
		l.pg.Stop()
		flushRedis(t, l.srv)
		if n := spendGroupUntil(t, l.g, l.b, 20, 429); n != 5 {
			t.Errorf("%s, the database down, a minute after the last read: %d admitted of the 5 left of 10", l.name, n)
		}
	}
}
