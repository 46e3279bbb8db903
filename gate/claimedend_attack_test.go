package gate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// claimedSettlement is the settlement the killed replica claims in the
// claimed-end attacks: 300 tokens, $0.30.
var claimedSettlement = gate.Charge{Usage: costmodel.Usage{InputTokens: 300}, Cost: 300_000_000, Status: ledger.StatusSettled, HTTPStatus: 200}

// claimedEndGates opens n replicas sharing Redis, the reservation secret
// and, when shared, one PostgreSQL ledger (else each its embedded one),
// with the expiry pass run by the test.
func claimedEndGates(t *testing.T, n int, shared bool) []*gate.Gate {
	t.Helper()
	srv := redistest.New(t)
	ledgerYAML := "{}"
	if shared {
		ledgerYAML = fmt.Sprintf("{dsn: %q, peer_wait: 10s}", pgtest.New(t))
	}
	var gs []*gate.Gate
	for range n {
		gs = append(gs, openYAMLWith(t, claimedEndYAML(t.TempDir(), srv.URL, ledgerYAML), gate.ManualExpiry(gate.Options{})))
	}
	return gs
}

func claimedEndYAML(dir, redisURL, ledgerYAML string) string {
	return fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: %s
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000, period: 24h}
reservations: {secret: 0123456789abcdef0123}
`, dir, redisURL, ledgerYAML)
}

// holdFor makes one held reservation of 100 input tokens ($1.00) for
// acme on g, for ttl, and returns its id, its request id and its expiry.
func holdFor(t *testing.T, g *gate.Gate, ttl time.Duration) (id, req string, exp time.Time) {
	t.Helper()
	ctx := context.Background()
	res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/costgate/reserve",
		Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 100}, Cost: 1_000_000_000}})
	if res == nil {
		t.Fatalf("refused: %+v", d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatal(d)
	}
	id, exp = res.Hold(ttl)
	return id, res.ID(), exp
}

// checkBilledOnce flushes every replica's ledger and checks that the
// entry of request req is final with status, input tokens and cost, and
// that the tenant's spend today, as the ledger l counts it, is that cost:
// the end billed once, at what it claimed.
func checkBilledOnce(t *testing.T, gs []*gate.Gate, l *ledger.Ledger, req string, status ledger.Status, input int64, cost costmodel.NanoUSD) {
	t.Helper()
	ctx := context.Background()
	for _, g := range gs {
		if err := g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e, ok, err := l.Lookup(ctx, req)
	if err != nil || !ok {
		t.Fatalf("lookup %s: %v %v", req, ok, err)
	}
	if e.Status != status || e.Actual.InputTokens != input || e.ActualCost != cost {
		t.Errorf("ledger entry: %s, %d input tokens, %v; want %s, %d, %v, as claimed", e.Status, e.Actual.InputTokens, e.ActualCost, status, input, cost)
	}
	spend, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
	if err != nil {
		t.Fatal(err)
	}
	if spend != cost {
		t.Errorf("acme spent %v today, as the ledger counts; want %v", spend, cost)
	}
}

// TestClaimedEndAtkKilledBeforeItsBill: replica a settles (or releases)
// a reservation replica b made, claims the end in Redis, and is killed
// before it writes the end to its ledger; the caller never retries. The
// claim is then found by b's expiry pass, by another end of the
// reservation on b or c, or by a resume past its expiry: whichever
// replica adopts it must bill it, as claimed, once. Before, each adopted
// the claim and wrote nothing: the entry stayed reserved at its $1.00
// estimate (recovered at it by a restart) for a $0.30 settlement or a
// release, and a later different settle was answered "already settled,
// $0.30" with nothing billed. On a shared PostgreSQL ledger, and with each
// replica's own ledger, where b's holds the entry.
func TestClaimedEndAtkKilledBeforeItsBill(t *testing.T) {
	ctx := context.Background()
	other := gate.Charge{Usage: costmodel.Usage{InputTokens: 50}, Cost: 50_000_000, Status: ledger.StatusSettled, HTTPStatus: 200}
	resume := func(t *testing.T, g *gate.Gate, id string) *gate.Reservation {
		t.Helper()
		r, _, err := g.Resume(ctx, g.Identify("cg-acme"), id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cases := []struct {
		name     string
		released bool // a claimed a release, not a settlement
		onC      bool // then finds the claim on c, which needs a shared ledger
		pastExp  bool // then waits for the reservation's expiry (a hold of a second)
		then     func(t *testing.T, b, c *gate.Gate, id string)
	}{
		{name: "settled, then b's expiry pass", then: func(t *testing.T, b, _ *gate.Gate, _ string) {
			b.ExpireHolds(time.Now().Add(time.Minute))
		}},
		{name: "released, then b's expiry pass", released: true, then: func(t *testing.T, b, _ *gate.Gate, _ string) {
			b.ExpireHolds(time.Now().Add(time.Minute))
		}},
		{name: "settled, then another settlement on b", then: func(t *testing.T, b, _ *gate.Gate, id string) {
			if got, again, err := resume(t, b, id).SettleHeld(ctx, other); err != nil || !again || got.Cost != claimedSettlement.Cost {
				t.Errorf("settle on b: %+v again %v %v; want a's settlement again", got, again, err)
			}
		}},
		{name: "settled, then a release on b", then: func(t *testing.T, b, _ *gate.Gate, id string) {
			if err := resume(t, b, id).Release(ctx); !errors.Is(err, gate.ErrSettled) {
				t.Errorf("release on b: %v; want ErrSettled", err)
			}
		}},
		{name: "released, then a settlement on b", released: true, then: func(t *testing.T, b, _ *gate.Gate, id string) {
			if _, _, err := resume(t, b, id).SettleHeld(ctx, other); !errors.Is(err, gate.ErrReleased) {
				t.Errorf("settle on b: %v; want ErrReleased", err)
			}
		}},
		{name: "settled, then a resume on b past its expiry", pastExp: true, then: func(t *testing.T, b, _ *gate.Gate, id string) {
			if got, again, err := resume(t, b, id).SettleHeld(ctx, other); err != nil || !again || got.Cost != claimedSettlement.Cost {
				t.Errorf("settle on b: %+v again %v %v; want a's settlement again", got, again, err)
			}
		}},
		{name: "settled, then another settlement on c", onC: true, then: func(t *testing.T, _, c *gate.Gate, id string) {
			if got, again, err := resume(t, c, id).SettleHeld(ctx, other); err != nil || !again || got.Cost != claimedSettlement.Cost {
				t.Errorf("settle on c: %+v again %v %v; want a's settlement again", got, again, err)
			}
		}},
		{name: "settled, then a resume on c past its expiry", onC: true, pastExp: true, then: func(t *testing.T, _, c *gate.Gate, id string) {
			resume(t, c, id)
		}},
	}
	for _, shared := range []bool{true, false} {
		for _, tc := range cases {
			if tc.onC && !shared {
				continue // c's own ledger holds no entry of b's reservation
			}
			t.Run(fmt.Sprintf("%s/shared=%v", tc.name, shared), func(t *testing.T) {
				gs := claimedEndGates(t, 3, shared)
				a, b, c := gs[0], gs[1], gs[2]
				ttl := time.Minute
				if tc.pastExp {
					ttl = time.Second // the shortest the reserve API accepts
				}
				id, req, exp := holdFor(t, b, ttl)
				if err := b.Ledger().Flush(ctx); err != nil { // the reservation was made a while ago
					t.Fatal(err)
				}
				ra := resume(t, a, id)
				kill := ra.SettleKilledAfterClaim
				if tc.released {
					kill = func(ctx context.Context, _ gate.Charge) error { return ra.ReleaseKilledAfterClaim(ctx) }
				}
				if err := kill(ctx, claimedSettlement); err != nil {
					t.Fatal(err)
				}
				if tc.pastExp {
					time.Sleep(time.Until(exp) + 10*time.Millisecond)
				}
				tc.then(t, b, c, id)
				status, input, cost := claimedSettlement.Status, claimedSettlement.Usage.InputTokens, claimedSettlement.Cost
				if tc.released {
					status, input, cost = ledger.StatusFailed, 0, 0
				}
				// a is dead: b's ledger (shared or its own) tells.
				checkBilledOnce(t, []*gate.Gate{b, c}, b.Ledger(), req, status, input, cost)
			})
		}
	}
}

// TestClaimedEndAtkExpiryClaimedElsewhere: replica b makes a reservation
// and a settlement of it, resumed on b before its expiry, comes only
// after it, when a resume on c has claimed the expiry (c bills nothing:
// the replica that made the reservation settles it at its estimate).
// The settlement is told ErrExpired, and b's expiry pass must bill the
// expiry. Before, the settlement adopted the expiry claimed on c into
// b's hold, and b's expiry pass, finding the hold expired already, left
// the entry reserved for good.
func TestClaimedEndAtkExpiryClaimedElsewhere(t *testing.T) {
	ctx := context.Background()
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			gs := claimedEndGates(t, 2, shared)
			b, c := gs[0], gs[1]
			id, req, exp := holdFor(t, b, time.Second)
			late, _, err := b.Resume(ctx, b.Identify("cg-acme"), id)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(exp) + 10*time.Millisecond) // Resume reads the wall clock
			if _, _, err := c.Resume(ctx, c.Identify("cg-acme"), id); !errors.Is(err, gate.ErrExpired) {
				t.Fatalf("resume on c past the expiry: %v; want ErrExpired", err)
			}
			if got, again, err := late.SettleHeld(ctx, claimedSettlement); !errors.Is(err, gate.ErrExpired) {
				t.Errorf("the late settlement: %+v again %v %v; want ErrExpired", got, again, err)
			}
			b.ExpireHolds(time.Now())
			checkBilledOnce(t, gs, b.Ledger(), req, ledger.StatusExpired, 100, 1_000_000_000)
		})
	}
}

// TestClaimedEndAtkRetryBeforeTheReplay: replica a makes a reservation,
// settles it, claims the settlement in Redis and is killed before its
// ledger write, its reservation still in its spool (PostgreSQL holds its
// batches back). It restarts on its data directory and the caller
// retries the settlement at once, before the restarted ledger has
// replayed the spool (the database still holds the batches back, for
// 2.5 s: longer than the seconds a lookup on a request's path waits, as a
// loaded machine's replay took). The retry must be answered from the
// claim and the settlement billed once: before, the ledger's store had
// no entry when the retry asked, so the retry billed nothing, and the
// replay then recovered the entry at its $1.00 estimate for a $0.30
// settlement; then, the retry's bill gave up after a second.
func TestClaimedEndAtkRetryBeforeTheReplay(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	dsn := pgtest.New(t)
	ledgerYAML := fmt.Sprintf("{dsn: %q, peer_wait: 10s}", dsn)
	dir := t.TempDir()
	a := openYAMLWith(t, claimedEndYAML(dir, srv.URL, ledgerYAML), gate.ManualExpiry(gate.Options{}))
	release := holdLock(t, dsn, ledgerApplyLock)
	id, req, _ := holdFor(t, a, time.Minute)
	r, _, err := a.Resume(ctx, a.Identify("cg-acme"), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SettleKilledAfterClaim(ctx, claimedSettlement); err != nil {
		t.Fatal(err)
	}
	// The kill: the data directory as a left it (its spool in the
	// operating system) is where a restarts; a itself is used no more
	// (its flusher, left running, applies the same reservation once the
	// database lets it, which changes nothing).
	restarted := t.TempDir()
	if err := os.CopyFS(restarted, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	a2 := openYAMLWith(t, claimedEndYAML(restarted, srv.URL, ledgerYAML), gate.ManualExpiry(gate.Options{}))
	time.AfterFunc(2500*time.Millisecond, release)
	r2, _, err := a2.Resume(ctx, a2.Identify("cg-acme"), id)
	if err != nil {
		t.Fatal(err)
	}
	if got, again, err := r2.SettleHeld(ctx, claimedSettlement); err != nil || !again || got.Cost != claimedSettlement.Cost {
		t.Errorf("retried settle: %+v again %v %v; want the claimed settlement again", got, again, err)
	}
	release()
	checkBilledOnce(t, []*gate.Gate{a2}, a2.Ledger(), req, ledger.StatusSettled, claimedSettlement.Usage.InputTokens, claimedSettlement.Cost)
}
