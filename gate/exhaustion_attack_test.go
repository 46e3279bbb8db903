package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/weighted"
)

// openTwoTenants opens a gate on the memory store with tenants acme (plan
// small) and globex (plan big), and the limits given.
func openTwoTenants(tb testing.TB, limits string) *Gate {
	tb.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
tenants:
  - {name: acme, plan: small, keys: [{id: ka, key: cg-acme}]}
  - {name: globex, plan: big, keys: [{id: kg, key: cg-globex}]}
reservations: {secret: 0123456789abcdef0123}
limits:
%s
`, tb.TempDir(), limits)))
	if err != nil {
		tb.Fatal(err)
	}
	g, err := Open(context.Background(), cfg, Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g
}

// spend admits one request of req, then has the next one refused by the
// store, as a caller that spends a key does.
func spend(tb testing.TB, g *Gate, req *Request) {
	tb.Helper()
	ctx := context.Background()
	res, d := g.Reserve(ctx, req)
	if res == nil {
		tb.Fatalf("first request of %v refused: %+v", req.Attributes, d)
	}
	res.Settle(ctx, Charge{HTTPStatus: 200})
	if res, d := g.Reserve(ctx, req); res != nil || d.Status != 429 {
		tb.Fatalf("second request of %v: %+v", req.Attributes, d)
	}
}

// fillPrefilter has acme spend as many keys of a limit keyed by a
// reserve attribute (one request a day each) as the prefilter holds: the
// first keys through the store, as requests, the rest as remember records
// a denial, without the store's round trips. It returns deny, which
// records the store's denial of acme's project i, as debit does.
func fillPrefilter(t *testing.T) (*Gate, func(i int)) {
	t.Helper()
	g := openTwoTenants(t, `  - {name: per-project, dimensions: [tenant, attr.project], unit: requests, algorithm: fixed_window, rate: 1, period: 24h, plans: [small]}
  - {name: per-tenant, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 1, period: 24h, plans: [big]}`)
	acme := g.Identify("cg-acme")
	st := g.state.Load()
	project := func(i int) map[string]string { return map[string]string{"project": fmt.Sprintf("p%d", i)} }
	const real = 50
	for i := range real {
		spend(t, g, &Request{Caller: acme, Route: "/x", Attributes: project(i)})
	}
	if n := st.prefilter.n.Load(); n != real {
		t.Fatalf("the prefilter holds %d keys after %d spent", n, real)
	}
	var pl *compiledLimit
	for _, l := range st.limits {
		if l.limit.Name == "per-project" {
			pl = l
		}
	}
	deny := func(i int) {
		r := &Reservation{g: g, st: st, req: Request{Caller: acme, Route: "/x", Attributes: project(i)}}
		r.limits = []*compiledLimit{pl}
		r.items = []weighted.Item{{Limit: pl.limit, Key: pl.key(r), Cost: 1}}
		r.result = weighted.Result{Decider: 0, RetryAfter: 24 * time.Hour}
		r.remember()
	}
	for i := real; i < maxRefusals; i++ {
		deny(i)
	}
	if n := st.prefilter.n.Load(); n > maxRefusals {
		t.Fatalf("the prefilter holds %d keys, past its bound of %d", n, maxRefusals)
	}
	return g, deny
}

// TestExhaustionAttackPrefilterFullByOneTenant: the prefilter is bounded
// (maxRefusals keys), and one tenant's keys filling it must not take it
// from the other tenants: once acme has spent as many keys as the bound
// holds, globex's spent limit is still remembered, its requests refused
// before their bodies are read.
func TestExhaustionAttackPrefilterFullByOneTenant(t *testing.T) {
	g, _ := fillPrefilter(t)
	globex := g.Identify("cg-globex")
	spend(t, g, &Request{Caller: globex, Route: "/x"})
	if n := g.state.Load().prefilter.n.Load(); n > maxRefusals {
		t.Fatalf("the prefilter holds %d keys, past its bound of %d", n, maxRefusals)
	}
	if d, refused := g.Prefilter(&Request{Caller: globex, Route: "/x"}); !refused {
		t.Fatalf("globex's spent limit is not remembered once acme filled the prefilter: %+v", d)
	}
}

// TestExhaustionAttackPrefilterFullCostsEachDenial: a denial recorded
// into a full prefilter costs what one below the bound does, not a walk
// of the whole table: the denials of every tenant run remember on their
// request's goroutine. 200 of them take well under 100 ms, under the race
// detector on a loaded machine too (a walk of 65536 entries each takes
// 0.5 to several ms: 100 ms to a second).
func TestExhaustionAttackPrefilterFullCostsEachDenial(t *testing.T) {
	g, deny := fillPrefilter(t)
	p := g.state.Load().prefilter
	t0 := time.Now()
	for i := maxRefusals; i < maxRefusals+200; i++ {
		deny(i)
	}
	el := time.Since(t0)
	t.Logf("200 denials recorded into a full prefilter took %s", el)
	if el > 100*time.Millisecond {
		t.Errorf("200 denials recorded into a full prefilter took %s", el)
	}
	if n := p.n.Load(); n > maxRefusals {
		t.Fatalf("the prefilter holds %d keys, past its bound of %d", n, maxRefusals)
	}
}

// TestExhaustionAttackPrefilterForgetsTenants: the prefilter counts each
// tenant's keys, and a tenant whose keys all expired is no longer counted:
// tenants named by requests (an RLS tenant is any string Envoy sends) do
// not pile up.
func TestExhaustionAttackPrefilterForgetsTenants(t *testing.T) {
	var r prefilter
	l := &compiledLimit{}
	now := time.Now()
	for i := range 5000 {
		r.add(fmt.Sprintf("tenant-%d", i), l, fmt.Sprintf("key-%d", i), 1, now.Add(time.Second), now.Add(time.Second), now)
	}
	later := now.Add(2 * time.Second)
	if !r.expire(later) {
		t.Fatal("the sweep did not run")
	}
	n := 0
	r.tenants.Range(func(any, any) bool { n++; return true })
	if n != 0 || r.n.Load() != 0 {
		t.Errorf("after every key expired: %d tenants and %d keys still counted", n, r.n.Load())
	}
}
