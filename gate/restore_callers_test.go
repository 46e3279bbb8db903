package gate

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// twoUserDir is a control plane of one tenant, cpco on plan small, with a
// key per user, ann (cg-ann) and bob (cg-bob), and a key of the config's
// tenant acme for user cara (cg-cara).
type twoUserDir struct{}

var twoUserKeys = []Principal{{Tenant: "cpco", User: "ann", KeyID: "key_ann"}, {Tenant: "cpco", User: "bob", KeyID: "key_bob"},
	{Tenant: "acme", User: "cara", KeyID: "key_cara", ConfigTenant: true}}

func (twoUserDir) Lookup(sum [sha256.Size]byte, _ time.Time) (Principal, bool) {
	for _, p := range twoUserKeys {
		if sum == sha256.Sum256([]byte("cg-"+p.User)) {
			if !p.ConfigTenant {
				p.Plan = "small"
			}
			return p, true
		}
	}
	return Principal{}, false
}
func (twoUserDir) Budgets(string) []LevelBudget { return nil }
func (twoUserDir) BudgetTenants() []string      { return []string{"cpco"} }
func (twoUserDir) HasTenant(name string) bool   { return name == "cpco" }
func (twoUserDir) TenantPlan(name string, _ time.Time) (string, *Level, bool, bool) {
	return "small", nil, name == "cpco", name == "cpco"
}
func (twoUserDir) TenantKeys(tenant string) (out []Principal) {
	for _, p := range twoUserKeys {
		if p.Tenant == tenant {
			out = append(out, p)
		}
	}
	return out
}

// TestRestoreCountsControlPlaneUsers: a budget per user of plan small
// counts on the users of the control plane's keys (of its own tenant
// cpco, and of the config's tenant acme). Each user spends the $0.01; the
// store loses its data; the first request after it (ann's, cara's)
// restores the tenant's counters and marks it fresh. Every other user's
// counter must come back at the ledger's spend too: before, the restore
// counted the configuration's keys alone, and bob's counter, never asked,
// started at 0 under the fresh mark (a second budget spent).
func TestRestoreCountsControlPlaneUsers(t *testing.T) {
	dsn, srv := pgtest.New(t), redistest.New(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: dave-key, key: cg-dave, user: dave}]}
budgets:
  - {name: per-user, scope: user, amount: "0.01"}
`, t.TempDir(), srv.URL, dsn)))
	if err != nil {
		t.Fatal(err)
	}
	g := openConfig(t, cfg)
	g.SetDirectory(twoUserDir{})
	keys := []string{"cg-ann", "cg-bob", "cg-cara", "cg-dave"}
	var callers []*Caller
	for _, k := range keys {
		callers = append(callers, g.Identify(k))
	}
	for i, n := range spentThenLost(t, g, srv, callers...) {
		if n != 0 {
			t.Errorf("after Redis lost its data: %d more of $0.001 admitted to %s, whose $0.01 budget the ledger says is spent", n, keys[i])
		}
	}
}
