package gate

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/weighted"
)

// keyInjectConfig parses a config of two tenants on the Redis srv and the
// ledger dsn, each with a daily budget of $0.01 (ten requests of $0.001).
func keyInjectConfig(t *testing.T, dsn string, srv *redistest.Server, victim, attacker string) (*config.Config, error) {
	t.Helper()
	return config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: %q, plan: small, keys: [{id: victim-key, key: cg-victim}]}
  - {name: %q, plan: small, keys: [{id: attacker-key, key: cg-attacker}]}
budgets:
  - {name: daily, scope: tenant, amount: "0.01"}
`, t.TempDir(), srv.URL, dsn, victim, attacker)))
}

// openConfig opens a gate on cfg, closed when t ends.
func openConfig(t *testing.T, cfg *config.Config) *Gate {
	t.Helper()
	g, err := Open(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// spendAs makes up to n requests of $0.001 with key on g (see
// spendCaller).
func spendAs(t *testing.T, g *Gate, key string, n int) (admitted int) {
	t.Helper()
	c := g.Identify(key)
	if c == nil {
		t.Fatalf("key %s identifies nobody", key)
	}
	return spendCaller(t, g, c, n)
}

// spendCaller makes up to n requests of $0.001 as c on g, each recorded
// and settled at its estimate, and returns how many were admitted before
// the first refusal (a 402).
func spendCaller(t *testing.T, g *Gate, c *Caller, n int) (admitted int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 1_000_000}})
		if res == nil {
			if d.Status != 402 {
				t.Fatalf("refused with %d: %+v", d.Status, d)
			}
			return admitted
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, Charge{Cost: 1_000_000, HTTPStatus: 200})
		admitted++
	}
	return admitted
}

// spentThenLost spends the $0.01 daily budget of each of callers on g
// (ten requests of $0.001 admitted), has Redis srv lose its data once the
// ledger has every entry, and returns, per caller, how many more of
// $0.001 it is admitted: 0 when its budget survived the loss.
func spentThenLost(t *testing.T, g *Gate, srv *redistest.Server, callers ...*Caller) []int {
	t.Helper()
	ctx := context.Background()
	for _, c := range callers {
		if n := spendCaller(t, g, c, 20); n != 10 {
			t.Fatalf("%s/%s before the loss: %d of $0.001 admitted under a $0.01 budget, want 10", c.Tenant, c.KeyID, n)
		}
	}
	if err := g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	after := make([]int, len(callers))
	for i, c := range callers {
		after[i] = spendCaller(t, g, c, 20)
	}
	return after
}

// TestKeyInjectAttackConfigTenantBraceTakesAnotherTag: a configured tenant
// whose name holds a '}' ("beta}") gets keys "{beta}}:tenant=beta%7D": their
// Redis Cluster hash tag is "beta", another tenant's. The tenant's counters
// then live under beta's generation marker; when Redis loses its data, the
// stale answer names the tag "beta", the gate restores tenant beta's
// budgets from the ledger and writes the marker, and the "beta}" budget,
// restored "as it is" (0), is spent anew: the tenant passes its daily
// budget a second time. What must hold: either the configuration refuses
// such a name (as it does for an RLS node's tenant, and the control plane
// for its names), with an error naming the field, or the tenant's budget
// survives the loss as every other tenant's does.
func TestKeyInjectAttackConfigTenantBraceTakesAnotherTag(t *testing.T) {
	dsn, srv := pgtest.New(t), redistest.New(t)
	cfg, err := keyInjectConfig(t, dsn, srv, "beta", "beta}")
	if err != nil {
		if !strings.Contains(err.Error(), "tenants[1].name") {
			t.Fatalf("the name is refused, but the error names no field: %v", err)
		}
		return // refused, with a clear error: the attack has no door
	}
	g := openConfig(t, cfg)

	c := g.Identify("cg-attacker")
	for _, l := range g.state.Load().limits {
		if l.budget {
			if tag := weighted.HashTag(l.callerKey(c)); tag == "beta" {
				t.Logf("tenant %q's budget key %q has tenant beta's hash tag", c.Tenant, l.callerKey(c))
			}
		}
	}
	if n := spentThenLost(t, g, srv, g.Identify("cg-attacker"))[0]; n != 0 {
		t.Errorf("after Redis lost its data: %d more of $0.001 admitted to tenant %q, whose $0.01 budget the ledger says is spent", n, c.Tenant)
	}
}

// TestKeyInjectAttackConfigTenantLossControl: the same loss with a plain
// tenant name: its budget is restored from the ledger and holds. (The
// reference the attack above is measured against.)
func TestKeyInjectAttackConfigTenantLossControl(t *testing.T) {
	dsn, srv := pgtest.New(t), redistest.New(t)
	cfg, err := keyInjectConfig(t, dsn, srv, "beta", "gamma")
	if err != nil {
		t.Fatal(err)
	}
	g := openConfig(t, cfg)
	if n := spentThenLost(t, g, srv, g.Identify("cg-attacker"))[0]; n != 0 {
		t.Errorf("after Redis lost its data: %d more admitted past a spent budget", n)
	}
}

// TestKeyInjectAttackUnlistedTenantBudgetAfterLoss: the rate limit
// service names tenants the configuration does not list (a descriptor
// "as: tenant" with a plan), through Gate.Trusted; the plan's budgets
// apply to them, keyed "{newco}:tenant=newco", and the ledger records
// their spend. When Redis loses its data, the stale answer names the tag
// "newco", and the restore reads the ledger's spend for the budgets of
// the configuration's tenants only: newco's budget is written back at 0,
// and newco spends its daily budget a second time. What must hold: a
// budget the ledger says is spent stays spent after a loss, whoever's it
// is (as it does for a listed tenant, TestKeyInjectAttackConfigTenantLossControl).
func TestKeyInjectAttackUnlistedTenantBudgetAfterLoss(t *testing.T) {
	dsn, srv := pgtest.New(t), redistest.New(t)
	cfg, err := keyInjectConfig(t, dsn, srv, "beta", "gamma")
	if err != nil {
		t.Fatal(err)
	}
	g := openConfig(t, cfg)
	if n := spentThenLost(t, g, srv, g.Trusted("newco", "", "", "small"))[0]; n != 0 {
		t.Errorf("after Redis lost its data: %d more of $0.001 admitted to tenant newco, whose $0.01 budget the ledger says is spent", n)
	}
}

// keyInjectDir is a control plane of one tenant, cpco on plan small,
// with one key (cg-cpco) and no budgets of its own.
type keyInjectDir struct{}

func (keyInjectDir) Lookup(sum [sha256.Size]byte, _ time.Time) (Principal, bool) {
	if sum != sha256.Sum256([]byte("cg-cpco")) {
		return Principal{}, false
	}
	return Principal{Tenant: "cpco", KeyID: "key_cpco", Plan: "small"}, true
}
func (keyInjectDir) Budgets(string) []LevelBudget { return nil }
func (keyInjectDir) BudgetTenants() []string      { return []string{"cpco"} }
func (keyInjectDir) HasTenant(name string) bool   { return name == "cpco" }
func (keyInjectDir) TenantPlan(name string, _ time.Time) (string, *Level, bool, bool) {
	return "small", nil, name == "cpco", name == "cpco"
}

// TestKeyInjectAttackControlPlaneTenantPlanBudgetAfterLoss: a tenant of
// the control plane, on plan small, falls under the configured budgets of
// that plan (keyed "{cpco}:tenant=cpco"). When Redis loses its data, the
// restore reads the ledger's spend for the configured budgets of the
// configuration's tenants only: the control-plane tenant's plan budget
// is written back at 0 and spent a second time. What must hold: a budget
// the ledger says is spent stays spent after a loss, whatever the
// tenant's source.
func TestKeyInjectAttackControlPlaneTenantPlanBudgetAfterLoss(t *testing.T) {
	dsn, srv := pgtest.New(t), redistest.New(t)
	cfg, err := keyInjectConfig(t, dsn, srv, "beta", "gamma")
	if err != nil {
		t.Fatal(err)
	}
	g := openConfig(t, cfg)
	g.SetDirectory(keyInjectDir{})
	if n := spentThenLost(t, g, srv, g.Identify("cg-cpco"))[0]; n != 0 {
		t.Errorf("after Redis lost its data: %d more of $0.001 admitted to the control plane's tenant cpco, whose $0.01 plan budget the ledger says is spent", n)
	}
}

// TestKeyInjectAttackUserlessKeyTakesEveryUsersSpend: a budget per user
// keys a caller without a user (a key the configuration gives no user)
// "{acme}:user=", its own counter; but the reconciliation reads that
// counter's spend from the ledger with an empty user, which the ledger
// takes for "every user": the user-less key's counter is raised to what
// every user of the tenant spent. Bob, who spends 9 of his 10 cents,
// leaves the user-less key 1 cent of its 10 although it spent nothing
// (and the reconciliation runs at start and every interval). What must
// hold: one caller's spend never counts on another caller's counter.
func TestKeyInjectAttackUserlessKeyTakesEveryUsersSpend(t *testing.T) {
	ctx := context.Background()
	dsn, srv := pgtest.New(t), redistest.New(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - name: acme
    plan: small
    keys:
      - {id: bob-key, key: cg-bob, user: bob}
      - {id: anon-key, key: cg-anon}
budgets:
  - {name: per-user, scope: user, amount: "0.01"}
`, t.TempDir(), srv.URL, dsn)))
	if err != nil {
		t.Fatal(err)
	}
	g := openConfig(t, cfg)
	if n := spendAs(t, g, "cg-bob", 9); n != 9 {
		t.Fatalf("bob: %d of 9 admitted", n)
	}
	if err := g.ReconcileBudgets(ctx); err != nil {
		t.Fatal(err)
	}
	if n := spendAs(t, g, "cg-anon", 10); n != 10 {
		t.Errorf("the user-less key, which spent nothing, was admitted %d of $0.001 of its $0.01 after a reconciliation: bob's spend counted on its counter", n)
	}
}

// TestKeyInjectAttackKeysAreOneToOne: every value of a key's dimensions
// is the caller's to spell (a user, a key id, a model, a route, an
// attribute), with the characters that build keys (':', '=', '%', '{',
// '}') and the escapes' own digits. Over every short spelling of those,
// for a limit keyed by tenant, user and two attributes, two different
// callers never get one key, and the key's hash tag is always the
// caller's own tenant. (A tenant holds no brace: see
// TestKeyInjectAttackConfigTenantBraceTakesAnotherTag.)
func TestKeyInjectAttackKeysAreOneToOne(t *testing.T) {
	alphabet := []byte{'a', ':', '=', '%', '{', '}', '3', 'A'}
	var values []string
	var grow func(prefix string)
	grow = func(prefix string) {
		values = append(values, prefix)
		if len(prefix) == 3 {
			return
		}
		for _, c := range alphabet {
			grow(prefix + string(c))
		}
	}
	grow("")
	l := &compiledLimit{dims: []string{"tenant", "user", "attr.x", "attr.y"}, tagged: true}
	seen := make(map[string][4]string, len(values)*8)
	check := func(v [4]string) {
		r := &Reservation{req: Request{Caller: &Caller{Tenant: v[0], User: v[1]}, Attributes: map[string]string{"x": v[2], "y": v[3]}}}
		key := l.key(r)
		if tag := weighted.HashTag(key); tag != v[0] {
			t.Fatalf("%q: key %q has the hash tag %q, not its tenant's", v, key, tag)
		}
		if o, dup := seen[key]; dup && o != v {
			t.Fatalf("%q and %q share the key %q", o, v, key)
		}
		seen[key] = v
	}
	// A value that spells the next dimension, against the values that
	// would join to the same text unescaped.
	check([4]string{"a", "b:attr.x=c", "d", ""})
	check([4]string{"a", "b", "c:attr.x=d", ""})
	check([4]string{"a", "b", "c:attr.y=d", "e"})
	check([4]string{"a", "b", "c", "d:attr.y=e"})
	for _, tenant := range []string{"a", "a:", "a:user=", "a%3A", ":"} {
		for _, u := range values {
			check([4]string{tenant, u, "", ""})
			check([4]string{tenant, "", u, ""})
			check([4]string{tenant, "a", u, "=y"})
		}
		for _, x := range values[:min(len(values), 600)] {
			for _, y := range []string{"", ":", "%", "=", "a:attr.y=b"} {
				check([4]string{tenant, x, y, x})
			}
		}
	}
}

// TestKeyInjectAttackControlPlaneTenantPlanBudgetAfterRestart: the
// in-memory store starts empty at every start, and the budgets are then
// raised to the ledger's spend (README, "Budgets survive restarts and
// data loss"): the control plane's tenant's plan budget must be too,
// as with Redis (TestKeyInjectAttackControlPlaneTenantPlanBudgetAfterLoss).
func TestKeyInjectAttackControlPlaneTenantPlanBudgetAfterRestart(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
ledger: {dsn: %q}
tenants:
  - {name: beta, plan: small, keys: [{id: beta-key, key: cg-beta}]}
budgets:
  - {name: daily, scope: tenant, amount: "0.01"}
`, t.TempDir(), dsn)))
	if err != nil {
		t.Fatal(err)
	}
	open := func() *Gate {
		g, err := Open(ctx, cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		g.SetDirectory(keyInjectDir{})
		return g
	}
	g := open()
	if n := spendAs(t, g, "cg-cpco", 20); n != 10 {
		t.Fatalf("before the restart: %d of $0.001 admitted under a $0.01 budget, want 10", n)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	g = open()
	t.Cleanup(func() { g.Close() })
	if n := spendAs(t, g, "cg-cpco", 20); n != 0 {
		t.Errorf("after a restart on the in-memory store: %d more of $0.001 admitted to the control plane's tenant cpco, whose $0.01 plan budget the ledger says is spent", n)
	}
}
