package gate

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestKeyCapAtkNamedTenantsFillTheReplica: a front door that trusts its
// caller's word for the tenant (the rate limit service's descriptors,
// whose values a client may send) lets one client name as many tenants as
// it likes, each holding store.max_keys_per_tenant counters of values it
// chose. Past the replica's bound on every tenant's counters together
// (maxKeyEntries, 2,097,152; here 12), a new counter is refused to any
// tenant: 512 names filled it, and acme, which the configuration declares,
// was refused (429, store.max_keys_per_tenant) every request with a new
// job, address or descriptor value until their counters expired, a day
// for a day's limit. Tenants the configuration and the control plane do
// not know now hold half the bound at most, all together: a configured
// tenant keeps the other half.
func TestKeyCapAtkNamedTenantsFillTheReplica(t *testing.T) {
	ctx := context.Background()
	g := openKeyCapGate(t, "")
	g.keys.max = 12
	reserve := func(c *Caller, job string) Decision {
		t.Helper()
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/v1/costgate/reserve", Attributes: map[string]string{"job": job}})
		if res != nil {
			res.Settle(ctx, Charge{HTTPStatus: http.StatusOK})
		}
		return d
	}
	// The client names tenants zz0, zz1, ..., 6 jobs each, until refused.
	made := 0
	for n := 0; n < 4; n++ {
		zz := g.Trusted(fmt.Sprint("zz", n), "", "", "small")
		for j := range 6 {
			if d := reserve(zz, fmt.Sprint("job", j)); d.Allowed() {
				made++
			}
		}
	}
	t.Logf("the named tenants made %d counters of the replica's 12", made)
	acme := g.Identify("cg-acme")
	for j := range 6 {
		if d := reserve(acme, fmt.Sprint("acme-job", j)); !d.Allowed() {
			t.Fatalf("acme's job %d, its own counter %d of 6, after other names made %d: %d %+v", j, j+1, made, d.Status, d.Error)
		}
	}
	// The replica's 12 are held now: globex, which holds none, is refused
	// a new one, and told so (not that it holds its 6).
	d := reserve(g.Identify("cg-globex"), "globex-job")
	if d.Allowed() || d.Error == nil || d.Error.Policy != keyCapPolicy || !strings.Contains(d.Error.Message, "this replica holds") {
		t.Fatalf("globex's first counter with the replica's 12 held: %d %+v; want refused, the replica's bound named", d.Status, d.Error)
	}
}
