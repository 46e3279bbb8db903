package gate

// SharesInflightStripe tells whether tenants a and b count their
// reservations in flight in one stripe (see inflight): a restore of
// either after a reload that moved budgets waits for the other's
// requests too.
func SharesInflightStripe(a, b string) bool {
	var n inflight
	return n.of(a) == n.of(b)
}
