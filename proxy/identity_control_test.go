package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/costgate/costgate/rls"
)

// TestIdentityControlTenantRLS: over the rate limit service, a tenant the
// control plane holds but has deactivated is refused, as its keys are
// (401 at the proxy, OVER_LIMIT at the rate limit service), and nothing
// is debited; active again, it is held to its plan's limits, on the same
// counters.
func TestIdentityControlTenantRLS(t *testing.T) {
	s := idAtkStack(t, idAtkTenants)
	if code := s.adminCall(t, "POST", "/admin/v1/tenants", `{"name":"beta","plan":"free"}`, nil); code != http.StatusCreated {
		t.Fatalf("create tenant beta: %d", code)
	}
	var k struct {
		Key string `json:"key"`
	}
	if code := s.adminCall(t, "POST", "/admin/v1/keys", `{"tenant":"beta"}`, &k); code != http.StatusCreated {
		t.Fatalf("create a key of beta: %d", code)
	}
	r := rls.New(s.srv.Gate(), rls.Options{})
	ask := func(tenant string) string { return idAtkAsk(t, r, tenant) }
	active := func(on bool) {
		t.Helper()
		if code := s.adminCall(t, "PATCH", "/admin/v1/tenants/beta", fmt.Sprintf(`{"active":%t}`, on), nil); code != http.StatusOK {
			t.Fatalf("set beta active %t: %d", on, code)
		}
	}
	if got := ask("beta"); got != "OK" {
		t.Fatalf("beta's first request through the rate limit service: %s", got)
	}
	active(false)
	if code, _ := s.chat(t, k.Key); code != http.StatusUnauthorized {
		t.Errorf("beta's key, beta inactive: %d, want 401", code)
	}
	if got := ask("beta"); got != "OVER_LIMIT" {
		t.Errorf("beta inactive, one of its plan's two requests left, through the rate limit service: %s, want OVER_LIMIT", got)
	}
	if got := ask("nobody"); got != "OK" {
		t.Errorf("a tenant nothing declares through the rate limit service: %s, want OK (Envoy is trusted)", got)
	}
	active(true)
	var got []string
	for range 2 {
		got = append(got, ask("beta"))
	}
	if fmt.Sprint(got) != "[OK OVER_LIMIT]" {
		t.Errorf("beta active again, one of its free plan's two requests left: %v, want [OK OVER_LIMIT]", got)
	}
}

// TestIdentityControlConfigTenantBack: a control-plane key of a tenant
// the config file declares identifies nobody while the file does not
// declare it, and serves again, under the plan the file then gives the
// tenant, once a reload declares it again.
func TestIdentityControlConfigTenantBack(t *testing.T) {
	s := idAtkStack(t, idAtkTenants)
	var k struct {
		Key string `json:"key"`
	}
	if code := s.adminCall(t, "POST", "/admin/v1/keys", `{"tenant":"acme"}`, &k); code != http.StatusCreated || k.Key == "" {
		t.Fatalf("create a key of acme: %d", code)
	}
	if err := s.reload(t, idAtkOthers); err != nil {
		t.Fatalf("reload without acme: %v", err)
	}
	if code, _ := s.chat(t, k.Key); code != http.StatusUnauthorized {
		t.Fatalf("acme's API key, acme out of the file: %d, want 401", code)
	}
	// acme comes back under globex's plan pro, which no limit names.
	back := `
  - name: acme
    plan: pro
` + idAtkOthers
	if err := s.reload(t, back); err != nil {
		t.Fatalf("reload with acme: %v", err)
	}
	var codes []int
	for range 3 {
		code, _ := s.chat(t, k.Key)
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 200 200]" {
		t.Errorf("acme's API key, acme back on plan pro: %v, want [200 200 200]", codes)
	}
}

// TestIdentityControlTenantLevelRLS: a control-plane tenant's own limits
// hold over the rate limit service as they hold for its keys: the tenant's
// limit of three requests an hour answers OVER_LIMIT on the fourth
// decision, and the proxy, counting on the same counter, refuses its key
// then. Before, a tenant named by a trusted front door got its plan but
// not its level: its own budgets and limits did not apply there.
func TestIdentityControlTenantLevelRLS(t *testing.T) {
	s := idAtkStack(t, idAtkTenants)
	if code := s.adminCall(t, "POST", "/admin/v1/tenants", `{"name":"delta","plan":"pro","limits":[{"name":"hourly","rate":3,"period":"1h"}]}`, nil); code != http.StatusCreated {
		t.Fatalf("create tenant delta: %d", code)
	}
	var k struct {
		Key string `json:"key"`
	}
	if code := s.adminCall(t, "POST", "/admin/v1/keys", `{"tenant":"delta"}`, &k); code != http.StatusCreated {
		t.Fatalf("create a key of delta: %d", code)
	}
	r := rls.New(s.srv.Gate(), rls.Options{})
	var got []string
	for range 4 {
		got = append(got, idAtkAsk(t, r, "delta"))
	}
	if fmt.Sprint(got) != "[OK OK OK OVER_LIMIT]" {
		t.Errorf("delta's decisions under its own limit of 3 an hour: %v, want [OK OK OK OVER_LIMIT]", got)
	}
	if code, body := s.chat(t, k.Key); code != http.StatusTooManyRequests {
		t.Errorf("delta's key after three decisions of its three: %d %s, want 429", code, body)
	}
}
