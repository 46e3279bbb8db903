package control_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/proxy"
)

// TestNewCtrAtkTwoChangesQuickly: a key's spent day budget b is changed
// twice in quick succession, the second before the first's restore can
// have run (it waits for a ledger batch), while 24 callers hammer the key
// on two replicas: renamed then renamed back, renamed then given another
// amount, made weekly then monthly. The spend is the budget's whole
// amount in each shape, so nothing may be admitted.
func TestNewCtrAtkTwoChangesQuickly(t *testing.T) {
	a, b := cpraceTwo(t)
	for _, c := range []struct{ name, first, second string }{
		{"renamed and back", `{"id":"c","amount_usd":"0.0002","period":"day"}`, `{"id":"b","amount_usd":"0.0002","period":"day"}`},
		{"renamed then amount", `{"id":"c","amount_usd":"0.0002","period":"day"}`, `{"id":"c","amount_usd":"0.00021","period":"day"}`},
		{"week then month", `{"id":"b","amount_usd":"0.0002","period":"week"}`, `{"id":"b","amount_usd":"0.0002","period":"month"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			for round := range 2 {
				const budget = `{"budgets":[{"id":"b","amount_usd":"0.0002","period":"day"}]`
				var k created
				a.must(t, 201, "POST", "/admin/v1/keys", budget+`,"tenant":"t1"}`, &k)
				if n, st := ctlAtkSpend(t, a, k.Key, 100); st != 402 || n == 0 {
					t.Fatalf("spending the budget: %d admitted, then %d", n, st)
				}
				within(t, "the key on b", 5*time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 402 })
				h := cpraceHammer(t, a, b, k.Key, 4)
				a.must(t, 200, "PATCH", "/admin/v1/keys/"+k.ID, `{"budgets":[`+c.first+`]}`, nil)
				a.must(t, 200, "PATCH", "/admin/v1/keys/"+k.ID, `{"budgets":[`+c.second+`]}`, nil)
				n := h.sent.Load()
				within(t, "the callers after the changes", 10*time.Second, func() bool { return h.sent.Load() > n+200 })
				time.Sleep(150 * time.Millisecond)
				if got := h.halt(); got > 0 {
					t.Fatalf("round %d: %d requests admitted after two changes, on a budget whose spend is its whole amount", round, got)
				}
			}
		})
	}
}

// TestNewCtrAtkTenantPlanMoved: a control-plane tenant on plan small
// spends the configured tenant budget of plan small ($0.0002 a day); a
// PATCH moves it to plan big, whose budget of the same amount it has
// never debited, while 24 callers hammer a key of it on two replicas. The
// ledger says the tenant spent $0.0002 today, so big's budget (counted
// from the ledger's spend of the tenant) must refuse every request.
func TestNewCtrAtkTenantPlanMoved(t *testing.T) {
	dsn, rd, up := pgtest.New(t), redistest.New(t), simulatorURL(t)
	a, b := newCtrAtkPlansReplica(t, up, dsn, rd.URL), newCtrAtkPlansReplica(t, up, dsn, rd.URL)
	var ten, k created
	a.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"pm","plan":"small"}`, &ten)
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"pm"}`, &k)
	within(t, "the key on b", 5*time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 200 || st == 402 })
	if n, st := ctlAtkSpend(t, a, k.Key, 100); st != 402 || n == 0 {
		t.Fatalf("spending plan small's budget: %d admitted, then %d", n, st)
	}
	within(t, "the key spent on b", 5*time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 402 })
	h := cpraceHammer(t, a, b, k.Key, 4)
	a.must(t, 200, "PATCH", "/admin/v1/tenants/"+ten.ID, `{"plan":"big"}`, nil)
	n := h.sent.Load()
	within(t, "the callers after the change", 10*time.Second, func() bool { return h.sent.Load() > n+200 })
	time.Sleep(150 * time.Millisecond)
	if got := h.halt(); got > 0 {
		t.Errorf("a tenant that spent $0.0002 today moved to plan big ($0.0002 a day): %d requests admitted", got)
	}
}

// newCtrAtkPlansReplica is newReplica with configured tenants on plans
// small and big, and a $0.0002 day tenant budget for each plan.
func newCtrAtkPlansReplica(t *testing.T, upstream, dsn, redis string) *replica {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: test-admin
data_dir: %q
store: {timeout: 2s, queue_timeout: 2s}
control: {read_token: test-read, poll: 100ms}
upstreams:
  - {name: openai, kind: openai, base_url: %s, api_key: sk-upstream}
tenants:
  - {name: yamlsmall, plan: small, keys: [{id: ys-key, key: cg-test-ys}]}
  - {name: yamlbig, plan: big, keys: [{id: yb-key, key: cg-test-yb}]}
budgets:
  - {name: small-day, scope: tenant, plans: [small], amount: "0.0002"}
  - {name: big-day, scope: tenant, plans: [big], amount: "0.0002"}
`, t.TempDir(), upstream)))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	cfg.Store.Redis, cfg.Ledger.DSN = redis, dsn
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	data := httptest.NewServer(srv.Handler())
	t.Cleanup(data.Close)
	admin := httptest.NewServer(srv.AdminHandler())
	t.Cleanup(admin.Close)
	return &replica{srv: srv, data: data.URL, admin: admin.URL}
}
