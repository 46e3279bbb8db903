package rls_test

import (
	"testing"

	"github.com/costgate/costgate/rls"
)

// TestRLSAtkCheckWithTheStoreDownMeetsTheFallback: the first phase of
// token limiting is a check (hits 0), and the second a charge. While Redis
// is out, a charge is counted on the local fallback, where the budgets
// start from the ledger's spend; a check failed open without looking
// there, so that a tenant past its token limit, or whose budget was
// spent, had every request of the outage admitted: the bound of one
// fallback burst per outage held for debits, not for the two phases. A
// check with the store down is decided on the fallback, as a debit is.
func TestRLSAtkCheckWithTheStoreDownMeetsTheFallback(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tenant  string
		charges []uint64
	}{
		// open-tokens: 1,000 input tokens an hour, fail-open.
		{name: "token limit", tenant: "open", charges: []uint64{1100}},
		// spent-daily: $0.001 a day, spent before the outage.
		{name: "budget spent before the outage", tenant: "spent", charges: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, chargesConfig, true, rls.Options{})
			if tc.charges == nil {
				// $0.0011, on Redis and in the ledger.
				if got := codes_(e.ask(t, "charges", 0, input(tc.tenant, 1100))); got != "OK OK" {
					t.Fatalf("a charge before the outage: %s", got)
				}
			}
			e.redis.Stop(t)
			defer e.redis.Restart(t)
			for _, n := range tc.charges {
				if got := codes_(e.ask(t, "charges", 0, input(tc.tenant, n))); got != "OK OK" {
					t.Fatalf("a charge of %d with Redis down: %s", n, got)
				}
			}
			resp := e.ask(t, "charges", 0, input(tc.tenant, 0))
			if got := codes_(resp); got != "OVER_LIMIT OVER_LIMIT" || headerOf(resp, "Costgate-Degraded") != "fail-open" {
				t.Errorf("a check with Redis down after the limit was spent: %s, Costgate-Degraded %q; want OVER_LIMIT on the fallback, fail-open",
					got, headerOf(resp, "Costgate-Degraded"))
			}
			// Another tenant, of room left, is admitted.
			if got := codes_(e.ask(t, "charges", 0, input("debt", 0))); got != "OK OK" {
				t.Errorf("a check of a tenant with room left, Redis down: %s, want OK", got)
			}
		})
	}
}
