package rls_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/rls"
)

// edgeDomain is a config whose RLS domain "edge" has descriptors, each
// line of them a descriptor at the domain's top level.
func edgeDomain(descriptors ...string) string {
	return `
admin_token: t
upstreams: [{name: openai, kind: openai, simulate: always}]
rls:
  domains:
    - domain: edge
      descriptors:
        - ` + strings.Join(descriptors, "\n        - ") + "\n"
}

// leasedConfig is a domain whose per-client limit is leased: 200 hits an
// hour in a fixed window (a minute's would let a test that crosses its
// end admit more), a replica holding at most 20 of a client's hits
// unspent.
var leasedConfig = edgeDomain(`{key: client, rate_limit: {name: per-client, unit: hour, requests_per_unit: 200, algorithm: fixed_window, lease: {max_share: 0.1}}}`)

// TestLeasedDescriptors: two RLS replicas on one Redis, a leased
// descriptor limit, hits of 1 to 5 sent to either at random. A window
// leased admits nothing beyond its limit, and refuses only what neither
// the replica's leases nor Redis hold; most decisions are taken in
// process. A check (hits_addend 0) on the spent limit answers
// OVER_LIMIT, and the admin listing shows the limit leased.
func TestLeasedDescriptors(t *testing.T) {
	r := redistest.New(t)
	yaml := leasedConfig + "store: {redis: '" + r.URL + "'}\n"
	replicas := make([]*env, 2)
	for i := range replicas {
		cfg, err := config.Parse([]byte(yaml + "data_dir: " + t.TempDir() + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		replicas[i] = &env{}
		replicas[i].open(t, cfg, rls.Options{})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	admitted, decisions := int64(0), 0
	for refused := 0; refused < 20; decisions++ {
		e := replicas[rng.IntN(2)]
		n := 1 + rng.IntN(5)
		resp := e.ask(t, "edge", uint32(n), d("client", "c1"))
		switch resp.GetOverallCode() {
		case OK:
			admitted += int64(n)
		case OVER:
			refused++
		default:
			t.Fatalf("decision %d: %s", decisions, codes_(resp))
		}
		if decisions > 1000 {
			t.Fatal("the limit never ran out")
		}
	}
	// Whatever a replica refused, its own leases and Redis together did
	// not hold; the other replica's leases (at most 20 units) and the
	// largest request (5) are what a refusal may leave unspent.
	if admitted > 200 || admitted < 200-20-5 {
		t.Fatalf("admitted %d hits of 200 in %d decisions, want within [175, 200]", admitted, decisions)
	}
	for i, e := range replicas {
		if resp := e.ask(t, "edge", 0, d("client", "c1")); resp.GetOverallCode() != OVER && admitted == 200 {
			t.Errorf("replica %d: a check on the spent limit: %s, want OVER_LIMIT", i, codes_(resp))
		}
		limits, stats := e.g.Leases()
		var found bool
		for _, l := range limits {
			if l.Name == "per-client" {
				found = true
				if l.Mode != "leased" || l.MaxUnits != 20 {
					t.Errorf("replica %d lists per-client as %s with %d units at most, want leased, 20", i, l.Mode, l.MaxUnits)
				}
			}
		}
		if !found {
			t.Errorf("replica %d does not list the RLS limit per-client: %+v", i, limits)
		}
		// Leases of up to 20 hits for requests of 3 on average: far fewer
		// store calls than decisions.
		if stats.Local == 0 || stats.Calls*2 > int64(decisions) {
			t.Errorf("replica %d: %d decisions in process, %d store calls for %d decisions in all", i, stats.Local, stats.Calls, decisions)
		}
		// An RLS decision is settled at once, at its estimate: nothing of
		// it stays remembered.
		if stats.Pending != 0 {
			t.Errorf("replica %d remembers %d reservations after every decision ended", i, stats.Pending)
		}
	}
}

// TestLeasedDescriptorsInMemory: with the in-memory store a leased
// descriptor limit stays strict, exactly its limit.
func TestLeasedDescriptorsInMemory(t *testing.T) {
	e := newEnv(t, leasedConfig, false, rls.Options{})
	admitted := 0
	for range 250 {
		if e.ask(t, "edge", 1, d("client", "c1")).GetOverallCode() == OK {
			admitted++
		}
	}
	if admitted != 200 {
		t.Fatalf("admitted %d, want 200", admitted)
	}
	limits, _ := e.g.Leases()
	for _, l := range limits {
		if l.Name == "per-client" && l.Mode != "strict" {
			t.Fatalf("in memory, per-client is %s, want strict", l.Mode)
		}
	}
}

// TestLeasedDescriptorsNewTag: on a fresh Redis every hash tag is
// restored from the ledger on its first use. A request whose leased
// descriptors span two tags, one already in use and one new (a tenant's
// limit and the domain's), must be decided, not shed as overloaded: the
// new tag's restore must be of the request's items under it. Before, the
// restore read the index of the item within its lease call (0, the
// other tag's), wrote no marker, and the request was refused with
// UNAVAILABLE after every retry.
func TestLeasedDescriptorsNewTag(t *testing.T) {
	e := newEnv(t, edgeDomain(
		`{key: tenant, as: tenant, rate_limit: {name: per-tenant, unit: minute, requests_per_unit: 1000, lease: {max_share: 0.1}}}`,
		`{key: client, rate_limit: {name: per-client, unit: minute, requests_per_unit: 1000, lease: {max_share: 0.1}}}`,
	), true, rls.Options{})
	if resp := e.ask(t, "edge", 1, d("tenant", "acme")); resp.GetOverallCode() != OK {
		t.Fatalf("the tenant's first request: %s", codes_(resp))
	}
	for i := range 3 {
		resp := e.ask(t, "edge", 1, d("tenant", "acme"), d("client", fmt.Sprint("c", i)))
		if resp.GetOverallCode() != OK {
			t.Fatalf("request %d with a new tag: %s", i, codes_(resp))
		}
	}
}

// TestLeasedDescriptorLowered: a reload lowers a leased descriptor limit
// while the replica holds leases of its key. The leases taken under the
// old limit are not spent under the new one: they go back, and the key
// admits no more than the new limit in its window, the hits admitted
// before the reload included.
func TestLeasedDescriptorLowered(t *testing.T) {
	limit := func(rate int) string {
		return edgeDomain(fmt.Sprintf(`{key: client, rate_limit: {name: per-client, unit: hour, requests_per_unit: %d, algorithm: fixed_window, lease: {max_share: 0.5}}}`, rate))
	}
	e := newEnv(t, limit(100), true, rls.Options{})
	admitted := 0
	for range 10 {
		if e.ask(t, "edge", 1, d("client", "c1")).GetOverallCode() == OK {
			admitted++
		}
	}
	if _, st := e.g.Leases(); admitted != 10 || st.Acquired == 0 {
		t.Fatalf("admitted %d of 10 under the first limit, lease stats %+v: want 10, from a lease", admitted, st)
	}
	cfg, err := config.Parse([]byte(limit(20) + "data_dir: " + e.g.Config().DataDir + "\nstore: {redis: '" + e.redis.URL + "'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if e.ask(t, "edge", 1, d("client", "c1")).GetOverallCode() == OK {
			admitted++
		}
	}
	if admitted != 20 {
		t.Fatalf("admitted %d in the window across the reload, want the new limit, 20", admitted)
	}
}
