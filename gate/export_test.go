package gate

import "time"

// SharesInflightStripe tells whether tenants a and b count their
// reservations in flight in one stripe (see inflight): a restore of
// either after a reload that moved budgets waits for the other's
// requests too.
func SharesInflightStripe(a, b string) bool {
	var n inflight
	return n.of(a) == n.of(b)
}

// ManualExpiry is opts with the gate's own expiry pass off: a test runs
// it with ExpireHolds when it means to, not once a second whenever the
// machine gets to it.
func ManualExpiry(opts Options) Options {
	opts.expireEvery = -1
	return opts
}

// ExpireHolds runs the expiry pass as of now (see Gate.expireHolds).
func (g *Gate) ExpireHolds(now time.Time) { g.expireHolds(now) }
