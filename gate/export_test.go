package gate

import (
	"context"
	"fmt"
	"time"
)

// SharesInflightStripe tells whether tenants a and b count their
// reservations in flight in one stripe (see inflight): a restore of
// either after a reload that moved budgets waits for the other's
// requests too.
func SharesInflightStripe(a, b string) bool {
	var n inflight
	return n.of(a) == n.of(b)
}

func init() {
	// A gate closed with its database down or held waits 2 s for its
	// spool, not 10, at the end of each test that leaves it so.
	defaultCloseTimeout = 2 * time.Second
}

// ManualExpiry is opts with the gate's own expiry pass off: a test runs
// it with ExpireHolds when it means to, not once a second whenever the
// machine gets to it.
func ManualExpiry(opts Options) Options {
	opts.expireEvery = -1
	return opts
}

// WaitCaughtUp waits, up to within, until the gate has no tenant behind
// the limiter store (see freshStore.catchUp): what its fallback admitted
// is in the store's counters. It fails when within passes first.
func (g *Gate) WaitCaughtUp(within time.Duration) error {
	for end := time.Now().Add(within); g.behindN.Load() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			return fmt.Errorf("gate: %d tenants still behind the store after %v", g.behindN.Load(), within)
		}
	}
	return nil
}

// ExpireHolds runs the expiry pass as of now (see Gate.expireHolds).
func (g *Gate) ExpireHolds(now time.Time) { g.expireHolds(now) }

// SettleKilledAfterClaim is SettleHeld on a replica killed between the
// claim of its settlement c in Redis (with the limits' settlement, in the
// same script call) and its ledger entry: it claims, and writes nothing
// to the ledger. The replica is dead from then on: the test uses it no
// more.
func (r *Reservation) SettleKilledAfterClaim(ctx context.Context, c Charge) error {
	return r.killedAfterClaim(ctx, settledClaim(c), r.actual(c))
}

// ReleaseKilledAfterClaim is Release as SettleKilledAfterClaim is
// SettleHeld.
func (r *Reservation) ReleaseKilledAfterClaim(ctx context.Context) error {
	return r.killedAfterClaim(ctx, claim{state: holdReleased}, nil)
}

func (r *Reservation) killedAfterClaim(ctx context.Context, c claim, actual []int64) error {
	won, prior, _, err := r.g.end(ctx, r, c, actual)
	if err != nil || !won {
		return fmt.Errorf("claim: won %v, prior %+v, %v", won, prior, err)
	}
	return nil
}
