package gate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// ledgerApplyLock is the advisory lock every ledger batch on PostgreSQL
// takes (ledger's applyLock, "costgate" + 1).
const ledgerApplyLock = 0x636f737467617465 + 1

// TestHeldLossAtkSettledThenReleasedElsewhere: replica b holds a
// reservation it made, replica a settles it (300 tokens, its claim in
// Redis), and Redis loses its data before a's settlement reaches
// PostgreSQL (the database holds its batches back). b is asked to
// release it: its hold is open, the ledger has it open, and Redis has
// no claim. The reservation was settled: b
// must answer ErrSettled, the ledger must bill the 300 tokens, and the
// limit must count them. Before, b won a claim that the loss had erased:
// it answered released, and the ledger kept whichever end reached it
// first, at times the release (0 tokens billed and counted).
// The release on a third replica, c, which holds no hold of it, must be
// refused too.
func TestHeldLossAtkSettledThenReleasedElsewhere(t *testing.T) {
	for _, on := range []string{"b", "c"} {
		t.Run(on, func(t *testing.T) {
			heldLossAtk(t, func(a, b, c *gate.Gate, id string) {
				g := map[string]*gate.Gate{"b": b, "c": c}[on]
				r, _, err := g.Resume(context.Background(), g.Identify("cg-acme"), id)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Release(context.Background()); !errors.Is(err, gate.ErrSettled) {
					t.Errorf("%s's release of a reservation a settled: %v, want ErrSettled", on, err)
				}
			})
		})
	}
}

// TestHeldLossAtkSettledElsewhereThenExpired: the same loss, and b's
// expiry pass finds the reservation open in its hold: it must not settle
// it again at its estimate, and a later settle on b is answered with a's
// settlement. Before, it won the erased claim and settled the reservation
// as expired (a later settle was told ErrExpired), and the ledger kept
// whichever end reached it first, at times the expiry at the estimate.
func TestHeldLossAtkSettledElsewhereThenExpired(t *testing.T) {
	heldLossAtk(t, func(a, b, _ *gate.Gate, id string) {
		b.ExpireHolds(time.Now().Add(2 * time.Minute))
		rb, _, err := b.Resume(context.Background(), b.Identify("cg-acme"), id)
		if err != nil {
			t.Fatal(err)
		}
		got, again, err := rb.SettleHeld(context.Background(), gate.Charge{Usage: costmodel.Usage{InputTokens: 50}, HTTPStatus: 200})
		if err != nil || !again {
			t.Errorf("a settle on b after its expiry pass: %+v, again %v, %v; want a's settlement again", got, again, err)
		}
	})
}

// heldLossAtk has b hold a reservation of 100 tokens, a settle it at 300
// (c, a third replica, standing by),
// Redis lose its data while the database holds every ledger batch back
// (released 500 ms later), and then end it again with second, and checks
// that the ledger bills 300 tokens and the limit counts them.
func heldLossAtk(t *testing.T, second func(a, b, c *gate.Gate, id string)) {
	ctx := context.Background()
	srv := redistest.New(t)
	dsn := pgtest.New(t)
	open := func() *gate.Gate {
		return openYAMLWith(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q, peer_wait: 10s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000, period: 24h}
reservations: {secret: 0123456789abcdef0123}
`, t.TempDir(), srv.URL, dsn), gate.ManualExpiry(gate.Options{}))
	}
	awayFromTheDayEdge(t)
	a, b, c := open(), open(), open()
	ids, reqs := hold(t, b, b.Identify("cg-acme"), 1)
	ra, _, err := a.Resume(ctx, a.Identify("cg-acme"), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	release := holdLock(t, dsn, ledgerApplyLock)
	if _, again, err := ra.SettleHeld(ctx, gate.Charge{Usage: costmodel.Usage{InputTokens: 300}, HTTPStatus: 200}); err != nil || again {
		t.Fatalf("settle on a: again %v, %v", again, err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(500*time.Millisecond, release)
	second(a, b, c, ids[0])
	release()
	for _, g := range []*gate.Gate{a, b, c} {
		if err := g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e, ok, err := a.Ledger().Lookup(ctx, reqs[0])
	if err != nil || !ok {
		t.Fatalf("lookup: %v %v", ok, err)
	}
	// What the limit holds once a request finds it (restored from the
	// ledger if need be).
	res, d := b.Reserve(ctx, &gate.Request{Caller: b.Identify("cg-acme"), Route: "/x", States: true,
		Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
	if res != nil {
		res.Cancel(ctx)
	}
	if len(d.Limits) != 1 {
		t.Fatalf("decision: %+v", d)
	}
	used := 1000 - d.Limits[0].Remaining - 1
	if e.Actual.InputTokens != 300 || used < 300 {
		t.Fatalf("a settled 300 tokens, then Redis lost its data and b ended the reservation again: the ledger has it %s with %d tokens; the limit counts %d",
			e.Status, e.Actual.InputTokens, used)
	}
}

// holdLock takes PostgreSQL advisory lock key on dsn until the returned
// function is called (or the test ends).
func holdLock(t *testing.T, dsn string, key int64) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	release = sync.OnceFunc(func() {
		tx.Rollback(ctx)
		conn.Close(ctx)
	})
	t.Cleanup(release)
	return release
}

// awayFromTheDayEdge waits out the last minute of a UTC day, when a day's
// window would turn under the test.
func awayFromTheDayEdge(t *testing.T) {
	t.Helper()
	if d := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)); d < time.Minute {
		time.Sleep(d + time.Second)
	}
}
