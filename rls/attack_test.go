package rls_test

import (
	"testing"

	"github.com/costgate/costgate/rls"
)

// rlsAtkIPConfig has two tenants on one plan each and a configured
// per-IP abuse limit (two requests a minute per client address), the
// usual guard of the proxy, beside a domain whose descriptors name the
// tenant only.
const rlsAtkIPConfig = `
admin_token: t
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
  - {name: globex, plan: pro, keys: [{key: k-globex}]}
limits:
  - {name: per-ip, dimensions: [ip], unit: requests, rate: 2, period: 1m, algorithm: fixed_window}
  - {name: pro-requests, plans: [pro], dimensions: [tenant], unit: requests, rate: 100, period: 1m}
rls:
  domains:
    - domain: edge
      descriptors: [{key: tenant, as: tenant}]
`

// TestRLSAttackIPLimitSharedAcrossTenants: a rate limit service request
// carries no client address, and a configured limit keyed by ip alone
// would key every RLS request of every tenant on one counter, ":ip=": such
// a limit does not apply to it. Tenant acme spending two requests leaves
// tenant globex, which sent nothing, admitted.
func TestRLSAttackIPLimitSharedAcrossTenants(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, rlsAtkIPConfig, redis, rls.Options{})
		for range 3 { // the third is refused: acme spent the per-ip limit
			e.ask(t, "edge", 1, d("tenant", "acme"))
		}
		if got := codes_(e.ask(t, "edge", 1, d("tenant", "globex"))); got != "OK OK" {
			t.Fatalf("globex's first request after acme spent the per-ip limit: %s, want OK OK (globex has no address in common with acme)", got)
		}
	})
}

// TestRLSAttackUserValuesCollapse: a user value the ledger cannot store
// (a NUL) is read one to one (%00), and that reading keys the tenant's
// per-user limits: user "a\x00" spending its counter leaves user
// "a\uFFFD", another user of the same tenant, admitted.
func TestRLSAttackUserValuesCollapse(t *testing.T) {
	const cfg = `
admin_token: t
tenants: [{name: acme, plan: free, keys: [{key: k-acme}]}]
limits: [{name: per-user, plans: [free], dimensions: [user], unit: requests, rate: 1, period: 1m}]
rls:
  domains:
    - domain: x
      descriptors:
        - key: tenant
          as: tenant
          descriptors: [{key: user, as: user}]
`
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, cfg, redis, rls.Options{})
		if got := codes_(e.ask(t, "x", 1, d("tenant", "acme", "user", "a\x00"))); got != "OK OK" {
			t.Fatalf("user a\\x00: %s", got)
		}
		if got := codes_(e.ask(t, "x", 1, d("tenant", "acme", "user", "a\uFFFD"))); got != "OK OK" {
			t.Errorf("user a\\uFFFD after user a\\x00 spent its own limit: %s, want OK OK on a counter of its own", got)
		}
	})
}
