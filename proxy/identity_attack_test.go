package proxy_test

// Attacks on who a request is charged to: the caller's key and the
// tenant, user and plan it names, across reloads and the control plane;
// the admin plane's token.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/rls"
	"github.com/costgate/costgate/simulator"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// idAtk is a costgate in front of the simulator whose tenants a test
// changes by a reload.
type idAtk struct {
	srv   *proxy.Server
	data  http.Handler
	admin http.Handler
	yaml  func(tenants string) string
}

// idAtkLimits apply to the plan free: two requests an hour per tenant.
// The rate limit service's domain edge names the tenant.
const idAtkLimits = `
limits:
  - name: free-requests
    plans: [free]
    dimensions: [tenant]
    unit: requests
    rate: 2
    period: 1h
rls:
  domains:
    - domain: edge
      descriptors: [{key: tenant, as: tenant}]
`

// idAtkTenants declares acme and initech (plan free) and globex (plan
// pro).
const idAtkTenants = `
  - name: acme
    plan: free
    keys:
      - {id: acme-key, key: cg-test-acme, user: alice}
` + idAtkOthers

// idAtkOthers declares initech (plan free) and globex (plan pro).
const idAtkOthers = `
  - name: initech
    plan: free
    keys:
      - {id: initech-key, key: cg-test-initech}
  - name: globex
    plan: pro
    keys:
      - {id: globex-key, key: cg-test-globex}
`

// idAtkStack starts costgate with tenants, the in-memory store and the
// embedded ledger, the control plane on.
func idAtkStack(t *testing.T, tenants string) *idAtk {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := httptest.NewServer(simulator.New(simulator.Config{Estimator: est}))
	t.Cleanup(sim.Close)
	dir := t.TempDir()
	s := &idAtk{}
	s.yaml = func(tenants string) string {
		return fmt.Sprintf(`admin_token: test-admin
data_dir: %q
store:
  timeout: 2s
  queue_timeout: 2s
upstreams:
  - {name: openai, kind: openai, base_url: %s, api_key: sk-upstream}
tenants:%s%s`, dir, sim.URL, tenants, idAtkLimits)
	}
	srv, err := proxy.Open(context.Background(), s.parse(t, tenants), proxy.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	s.srv, s.data, s.admin = srv, srv.Handler(), srv.AdminHandler()
	return s
}

func (s *idAtk) parse(t *testing.T, tenants string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(s.yaml(tenants)))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	cfg.Store.Redis, cfg.Ledger.DSN = "", ""
	return cfg
}

// reload makes tenants the configuration's tenants, as a file change or
// SIGHUP does, and returns the reload's error.
func (s *idAtk) reload(t *testing.T, tenants string) error {
	t.Helper()
	cfg := s.parse(t, tenants)
	s.srv.SetLoader(func() (*config.Config, error) { return cfg, nil })
	return s.srv.Reload()
}

// adminCall calls the admin plane with the admin token and decodes its
// JSON answer into out (when not nil).
func (s *idAtk) adminCall(t *testing.T, method, path, body string, out any) int {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer test-admin")
	w := httptest.NewRecorder()
	s.admin.ServeHTTP(w, req)
	if out != nil {
		json.Unmarshal(w.Body.Bytes(), out)
	}
	return w.Code
}

// chat sends one small chat completion with key and returns its status
// and body.
func (s *idAtk) chat(t *testing.T, key string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	s.data.ServeHTTP(w, req)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(b)
}

// TestIdentityAttackRemovedTenantsAPIKey: a control-plane key of a tenant
// the config file declares identifies nobody once a reload removes that
// tenant from the file (or the reload is refused): the tenant exists
// nowhere, and its key must not go on being served with no plan, outside
// every limit and budget of the plan it had.
func TestIdentityAttackRemovedTenantsAPIKey(t *testing.T) {
	s := idAtkStack(t, idAtkTenants)
	var k struct {
		Key string `json:"key"`
	}
	if code := s.adminCall(t, "POST", "/admin/v1/keys", `{"tenant":"acme"}`, &k); code != http.StatusCreated || k.Key == "" {
		t.Fatalf("create a key of acme: %d", code)
	}
	var codes []int
	for range 3 {
		code, _ := s.chat(t, k.Key)
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Fatalf("acme's API key under the free plan: %v, want [200 200 429]", codes)
	}

	// The operator offboards acme: the file no longer declares it.
	err := s.reload(t, idAtkOthers)
	if code, _ := s.chat(t, "cg-test-acme"); err == nil && code != http.StatusUnauthorized {
		t.Fatalf("acme's config key after acme left the file: %d, want 401", code)
	}
	codes = codes[:0]
	for range 3 {
		code, _ := s.chat(t, k.Key)
		codes = append(codes, code)
	}
	for _, c := range codes {
		if c == http.StatusOK {
			t.Fatalf("reload: %v; acme's API key after acme left the config file: %v, want no 200 (acme is no tenant; its free plan allowed 2 an hour, spent)", err, codes)
		}
	}
}

// idAtkAnthropicBody is a small Anthropic messages request.
const idAtkAnthropicBody = `{"model":"claude-3-5-haiku-latest","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`

// TestIdentityAttackHopByHopCredential: a client that names its credential
// headers in Connection, so that the reverse proxy strips them as
// hop-by-hop, is still identified by them, charged, and the upstream sees
// costgate's credential, once, in the header its API reads: the client's
// Connection list can neither remove the injected credential nor keep its
// own.
func TestIdentityAttackHopByHopCredential(t *testing.T) {
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
	host := strings.TrimPrefix(s.url, "http://")
	cases := []struct {
		name, path, body, header string
		tenant                   string
	}{
		{"openai, bearer listed", "/v1/chat/completions", routeAtkChatBody,
			"Authorization: Bearer cg-test-acme\nConnection: Authorization\n", "acme"},
		{"openai, x-api-key listed", "/v1/chat/completions", routeAtkChatBody,
			"x-api-key: cg-test-globex\nConnection: X-Api-Key, Authorization, X-Request-Id\n", "globex"},
		{"openai, both listed, keep-alive", "/v1/chat/completions", routeAtkChatBody,
			"x-api-key: cg-test-acme\nAuthorization: Bearer cg-test-globex\nConnection: keep-alive, x-api-key, authorization\n", "acme"},
		{"anthropic, x-api-key listed", "/v1/messages", idAtkAnthropicBody,
			"x-api-key: cg-test-acme\nanthropic-version: 2023-06-01\nConnection: X-Api-Key\n", "acme"},
		{"anthropic, bearer listed", "/v1/messages", idAtkAnthropicBody,
			"Authorization: Bearer cg-test-globex\nanthropic-version: 2023-06-01\nConnection: Authorization, X-Api-Key\n", "globex"},
	}
	want := map[string]int{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The Connection header closes nothing here: the raw request
			// ends the exchange by its own Content-Length and read.
			req := fmt.Sprintf("POST %s HTTP/1.1\nHost: %s\nContent-Type: application/json\nContent-Length: %d\n%s\n%s",
				c.path, host, len(c.body), c.header, c.body)
			got := sendRaw(t, s.url, req)
			if got.status != http.StatusOK {
				t.Fatalf("%d %s", got.status, got.body)
			}
			seen := up.take()
			if len(seen) != 1 {
				t.Fatalf("reached the upstream %d times", len(seen))
			}
			want[c.tenant]++
			h := seen[0].header
			wantAuth, wantKey := []string{"Bearer sk-upstream-secret"}, []string(nil)
			if c.path == "/v1/messages" {
				wantAuth, wantKey = nil, []string{"sk-ant-upstream-secret"}
			}
			if v := h.Values("Authorization"); fmt.Sprint(v) != fmt.Sprint(wantAuth) {
				t.Errorf("the upstream saw Authorization %q, want %q", v, wantAuth)
			}
			if v := h.Values("X-Api-Key"); fmt.Sprint(v) != fmt.Sprint(wantKey) {
				t.Errorf("the upstream saw X-Api-Key %q, want %q", v, wantKey)
			}
			if v := h.Values("X-Request-Id"); len(v) != 1 || v[0] != got.header.Get("X-Request-Id") {
				t.Errorf("the upstream saw X-Request-Id %q, want costgate's %q", v, got.header.Get("X-Request-Id"))
			}
		})
	}
	for _, tenant := range []string{"acme", "globex"} {
		if n := len(routeAtkEntries(t, s, tenant)); n != want[tenant] {
			t.Errorf("tenant %s has %d ledger entries, want %d", tenant, n, want[tenant])
		}
	}
}

// TestIdentityAttackUpstreamAccountHeaders: the upstream acts as the
// credential costgate injects and nothing the tenant chooses. OpenAI reads
// OpenAI-Organization and OpenAI-Project beside the key to pick the
// organization and project a request runs and is billed under (with a key
// of several organizations, any of them): a tenant must not pick them, in
// any spelling of the header a server may take for it (any case, '_' for
// '-', as Go keeps openai_organization apart from its canonical form).
func TestIdentityAttackUpstreamAccountHeaders(t *testing.T) {
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
	host := strings.TrimPrefix(s.url, "http://")
	for _, names := range [][2]string{
		{"OpenAI-Organization", "OpenAI-Project"},
		{"openai-organization", "OPENAI-PROJECT"},
		{"openai_organization", "openai_project"},
		{"OPENAI_ORGANIZATION", "OpenAI_Project"},
		{"OpenAI_organization", "openai_Project"},
	} {
		t.Run(names[0]+","+names[1], func(t *testing.T) {
			got := sendRaw(t, s.url, routeAtkChat("/v1/chat/completions", host,
				"Authorization: Bearer cg-test-acme\n"+names[0]+": org-someone-else\n"+names[1]+": proj_someone_else\n"))
			if got.status != http.StatusOK {
				t.Fatalf("%d %s", got.status, got.body)
			}
			seen := up.take()
			if len(seen) != 1 {
				t.Fatalf("reached the upstream %d times", len(seen))
			}
			for name, v := range seen[0].header {
				if n := strings.ReplaceAll(strings.ToLower(name), "_", "-"); n == "openai-organization" || n == "openai-project" {
					t.Errorf("the upstream saw the tenant's %s %q beside costgate's credential", name, v)
				}
			}
		})
	}
}

// TestIdentityAttackRLSTenantOfTheControlPlane: a tenant created through
// the admin API has its plan there; the rate limit service, which names
// tenants as Envoy's descriptors say, applies that plan's limits to it as
// the proxy does, on the same counters. A tenant whose plan's requests
// are spent through the proxy is not admitted through Envoy.
func TestIdentityAttackRLSTenantOfTheControlPlane(t *testing.T) {
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
	var codes []int
	for range 3 {
		code, _ := s.chat(t, k.Key)
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Fatalf("beta's key under the free plan: %v, want [200 200 429]", codes)
	}
	r := rls.New(s.srv.Gate(), rls.Options{})
	ask := func(tenant string) string { return idAtkAsk(t, r, tenant) }
	// The config file's tenant acme, for comparison: its plan applies.
	for range 2 {
		if got := ask("acme"); got != "OK" {
			t.Fatalf("acme through the rate limit service: %s", got)
		}
	}
	if got := ask("acme"); got != "OVER_LIMIT" {
		t.Fatalf("acme's third request through the rate limit service: %s, want OVER_LIMIT", got)
	}
	var got []string
	for range 3 {
		got = append(got, ask("beta"))
	}
	if fmt.Sprint(got) != "[OVER_LIMIT OVER_LIMIT OVER_LIMIT]" {
		t.Errorf("beta, its free plan's requests spent, through the rate limit service: %v, want OVER_LIMIT each time", got)
	}
}

// TestIdentityAttackUserComesFromTheKey: a request's user is its key's,
// whatever its body or headers name: OpenAI's "user", Anthropic's
// metadata.user_id and user-naming headers neither give it a per-user
// allowance of its own nor charge another user's, and the ledger records
// the key's user and id.
func TestIdentityAttackUserComesFromTheKey(t *testing.T) {
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{upstream: up, extra: `
limits:
  - name: per-user
    dimensions: [tenant, user]
    unit: requests
    rate: 1
    period: 1h
`})
	host := strings.TrimPrefix(s.url, "http://")
	send := func(path, body, header string) int {
		t.Helper()
		req := fmt.Sprintf("POST %s HTTP/1.1\nHost: %s\nContent-Type: application/json\nContent-Length: %d\nConnection: close\nAuthorization: Bearer cg-test-acme\n%s\n%s",
			path, host, len(body), header, body)
		return sendRaw(t, s.url, req).status
	}
	if code := send("/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":4,"user":"bob","messages":[{"role":"user","content":"hi"}]}`,
		"X-Costgate-User: bob\nOpenAI-User: bob\n"); code != http.StatusOK {
		t.Fatalf("first request: %d", code)
	}
	attempts := []struct{ path, body, header string }{
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":4,"user":"carol","messages":[{"role":"user","content":"hi"}]}`, ""},
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":4,"safety_identifier":"dave","messages":[{"role":"user","content":"hi"}]}`, "X-Costgate-User: dave\nX-User-Id: dave\n"},
		{"/v1/messages", `{"model":"claude-3-5-haiku-latest","max_tokens":4,"metadata":{"user_id":"erin"},"messages":[{"role":"user","content":"hi"}]}`, "anthropic-version: 2023-06-01\n"},
		{"/v1/responses", `{"model":"gpt-4o-mini","max_output_tokens":16,"user":"frank","input":"hi"}`, "X-Costgate-Tenant: globex\n"},
	}
	for _, a := range attempts {
		if code := send(a.path, a.body, a.header); code != http.StatusTooManyRequests {
			t.Errorf("%s %s naming another user, alice's one request spent: %d, want 429", a.path, a.body, code)
		}
	}
	if n := len(up.take()); n != 1 {
		t.Errorf("the upstream served %d requests, want 1", n)
	}
	entries := routeAtkEntries(t, s, "acme")
	if len(entries) != 1 || entries[0].User != "alice" || entries[0].KeyID != "acme-key" {
		t.Fatalf("acme's ledger: %+v, want one entry of user alice, key acme-key", entries)
	}
	if n := len(routeAtkEntries(t, s, "globex")); n != 0 {
		t.Errorf("globex has %d ledger entries, want 0", n)
	}
}

// idAtkAsk asks r, in domain edge, for one request of tenant (a
// descriptor [tenant=...]) and returns its overall code.
func idAtkAsk(t *testing.T, r *rls.Server, tenant string) string {
	t.Helper()
	resp, err := r.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1,
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}}}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetOverallCode().String()
}
