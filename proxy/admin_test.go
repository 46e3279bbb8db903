package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/costgate/costgate/config"
)

// adminGet calls the admin plane with the test's admin token.
func adminDo(t *testing.T, h http.Handler, method, path, token string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func TestAdminAuth(t *testing.T) {
	s := newStack(t, "", roomyLimits)
	h := s.srv.AdminHandler()
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := adminDo(t, h, "GET", path, ""); code != 200 {
			t.Errorf("%s without a token: %d %s", path, code, body)
		}
	}
	for _, path := range []string{"/metrics", "/admin/v1/shadow", "/admin/v1/top-throttled", "/admin/v1/limits?key=x", "/admin/v1/tenants/acme/spend", "/admin/v1/ledger"} {
		if code, _ := adminDo(t, h, "GET", path, ""); code != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d, want 401", path, code)
		}
		if code, _ := adminDo(t, h, "GET", path, "wrong"); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d, want 401", path, code)
		}
		if code, body := adminDo(t, h, "GET", path, "test-admin"); code != 200 {
			t.Errorf("%s with the token: %d %s", path, code, body)
		}
	}
}

// TestAdminAuthSchemeSpellings: the admin listener reads the
// Authorization field's scheme without regard to case (RFC 9110 11.1), as
// the data plane and the dashboard do, and never takes a token that only
// begins or ends like the admin token.
func TestAdminAuthSchemeSpellings(t *testing.T) {
	s := newStack(t, "", roomyLimits)
	h := s.srv.AdminHandler()
	for _, tc := range []struct {
		auth string
		code int
	}{
		{"Bearer test-admin", 200},
		{"bearer test-admin", 200},
		{"BEARER test-admin", 200},
		{"Bearer  test-admin ", 200},
		{"Bearer test-admi", http.StatusUnauthorized},
		{"Bearer test-admin2", http.StatusUnauthorized},
		{"Basic test-admin", http.StatusUnauthorized},
		{"Bearertest-admin", http.StatusUnauthorized},
		{"test-admin", http.StatusUnauthorized},
	} {
		req := httptest.NewRequest("GET", "/admin/v1/shadow", nil)
		req.Header.Set("Authorization", tc.auth)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.code {
			t.Errorf("Authorization %q: %d, want %d", tc.auth, rec.Code, tc.code)
		}
	}
}

// TestAdminErrorsOneShape: on the admin listener every 401, 404 and 405,
// of every route family (health, metrics, the admin API, the dashboard), is
// one JSON shape, {"error":{"type":...,"message":...}}.
func TestAdminErrorsOneShape(t *testing.T) {
	s := newStack(t, "", roomyLimits)
	h := s.srv.AdminHandler()
	cases := []struct {
		name, method, path, token string
		status                    int
	}{
		{"metrics without a token", "GET", "/metrics", "", 401},
		{"admin API without a token", "GET", "/admin/v1/shadow", "", 401},
		{"admin API with a wrong token", "GET", "/admin/v1/tenants/acme/spend", "wrong", 401},
		{"reload without a token", "POST", "/admin/v1/reload", "", 401},
		{"dashboard data without a token", "GET", "/admin/data.json", "", 401},
		{"unknown top path", "GET", "/nope", "", 404},
		{"unknown admin API path", "GET", "/admin/v1/nope", "test-admin", 404},
		{"unknown dashboard file", "GET", "/admin/nope.css", "", 404},
		{"health with POST", "POST", "/healthz", "", 405},
		{"readiness with DELETE", "DELETE", "/readyz", "", 405},
		{"metrics with POST", "POST", "/metrics", "test-admin", 405},
		{"admin API with DELETE", "DELETE", "/admin/v1/shadow", "test-admin", 405},
		{"reload with GET", "GET", "/admin/v1/reload", "test-admin", 405},
		{"dashboard with POST", "POST", "/admin/", "", 405},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, c.path, nil)
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, c.status, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			var body map[string]map[string]string
			dec := json.NewDecoder(rec.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&body); err != nil {
				t.Fatalf("not the error shape: %v", err)
			}
			e, ok := body["error"]
			if len(body) != 1 || !ok || len(e) != 2 || e["message"] == "" {
				t.Fatalf("body %v, want exactly {\"error\":{\"type\":...,\"message\":...}}", body)
			}
			want := map[int]string{401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}[c.status]
			if e["type"] != want {
				t.Errorf("type %q, want %q", e["type"], want)
			}
			if c.status == 405 && rec.Header().Get("Allow") == "" {
				t.Errorf("a 405 without an Allow header")
			}
		})
	}
}

// TestOperatorViews: after traffic that hits a limit, the metrics, the
// top-throttled keys, the spend and the tenant's own usage say so.
func TestOperatorViews(t *testing.T) {
	s := newStack(t, "", `
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 2
    period: 1m
`)
	client := s.client("cg-test-acme")
	for range 5 {
		client.Chat.Completions.New(context.Background(), chatParams("count me", 8))
	}
	// Decisions are recorded after the answer is sent.
	if err := s.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := s.srv.AdminHandler()

	_, metrics := adminDo(t, h, "GET", "/metrics", "test-admin")
	for _, want := range []string{
		`costgate_requests_total{`,
		`costgate_decisions_blocked_total{`,
		`limit="acme-requests"`,
		`costgate_decision_duration_seconds_bucket{`,
		`stage="debit"`,
		`costgate_spend_nano_usd_total{`,
		`gen_ai_client_token_usage_bucket{`,
		`costgate_ledger_lag_seconds `,
		`costgate_ledger_spool_size_bytes `,
		`costgate_config_last_reload_success 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var blocked float64
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "costgate_decisions_blocked_total{") && strings.Contains(line, `limit="acme-requests"`) {
			f := strings.Fields(line)
			json.Unmarshal([]byte(f[len(f)-1]), &blocked)
		}
	}
	if blocked != 3 {
		t.Errorf("costgate_decisions_blocked_total for acme-requests = %v, want 3", blocked)
	}

	// The dashboard shows the three refusals under the limit that decided
	// them, not under the policy "none".
	code, data := adminDo(t, h, "GET", "/admin/data.json", "test-admin")
	if code != 200 {
		t.Fatalf("/admin/data.json: %d %s", code, data)
	}
	var dash struct {
		Decisions []struct {
			Policy            string
			Allow, Soft, Hard int64
			Points            []struct{ Count int64 }
		}
		Limits []struct{ Name, Mode string }
	}
	if err := json.Unmarshal([]byte(data), &dash); err != nil {
		t.Fatal(err)
	}
	// Every limit of the config is listed with its mode (the in-memory
	// store leases nothing).
	modes := map[string]string{}
	for _, l := range dash.Limits {
		modes[l.Name] = l.Mode
	}
	if modes["acme-requests"] != "strict" {
		t.Errorf("dashboard limits %v: want acme-requests, strict", dash.Limits)
	}
	rows := map[string]int64{}
	for _, d := range dash.Decisions {
		rows[d.Policy] = d.Hard
		var points int64
		for _, p := range d.Points {
			points += p.Count
		}
		if points != d.Hard {
			t.Errorf("dashboard row %q: %d hard, but its points add up to %d", d.Policy, d.Hard, points)
		}
	}
	if rows["limit acme-requests"] != 3 || rows["none"] != 0 {
		t.Errorf("dashboard decisions %+v: want 3 refusals under \"limit acme-requests\" and none under \"none\"", dash.Decisions)
	}

	_, top := adminDo(t, h, "GET", "/admin/v1/top-throttled?n=5", "test-admin")
	if !strings.Contains(top, `acme-requests`) || !strings.Contains(top, `tenant=acme`) {
		t.Errorf("top-throttled does not name the throttled key: %s", top)
	}
	if err := s.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.srv.Ledger().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, spend := adminDo(t, h, "GET", "/admin/v1/tenants/acme/spend?period=day", "test-admin")
	var sp struct {
		Spent int64 `json:"spent_nano_usd"`
	}
	if err := json.Unmarshal([]byte(spend), &sp); err != nil || sp.Spent <= 0 {
		t.Errorf("spend: %s", spend)
	}
	_, lim := adminDo(t, h, "GET", "/admin/v1/limits?key="+`{acme}:tenant=acme`, "test-admin")
	if !strings.Contains(lim, `"remaining":0`) {
		t.Errorf("limits view does not show the spent limit: %s", lim)
	}

	// The tenant's own usage, and nobody else's.
	req, _ := http.NewRequest("GET", s.url+"/v1/costgate/usage", nil)
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"tenant":"acme"`) || !strings.Contains(string(b), `"acme-requests"`) {
		t.Errorf("usage: %d %s", resp.StatusCode, b)
	}
	req.Header.Set("Authorization", "Bearer not-a-key")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("usage with a wrong key: %d", resp.StatusCode)
	}
}

// TestReloadKeepsTheLastGoodConfig: a bad config is refused with its
// reason and the running one stays; a good one takes effect at once.
func TestReloadKeepsTheLastGoodConfig(t *testing.T) {
	s := newStack(t, "", roomyLimits)
	base := s.srv.Config()
	next := func() (*config.Config, error) {
		return nil, errors.New("limits[0].algorithm: unknown algorithm \"leaky\"")
	}
	s.srv.SetLoader(func() (*config.Config, error) { return next() })
	h := s.srv.AdminHandler()

	code, body := adminDo(t, h, "POST", "/admin/v1/reload", "test-admin")
	if code != http.StatusBadRequest || !strings.Contains(body, "leaky") {
		t.Fatalf("bad reload: %d %s", code, body)
	}
	if _, err := s.client("cg-test-acme").Chat.Completions.New(context.Background(), chatParams("still here?", 8)); err != nil {
		t.Fatalf("the last good config is gone: %v", err)
	}

	// A new key, added by reload.
	added := *base
	added.Tenants = append(append([]config.TenantConfig(nil), base.Tenants...), config.TenantConfig{
		Name: "initech", Plan: "free", Keys: []config.KeyConfig{{ID: "initech-key", Key: "cg-test-initech"}},
	})
	next = func() (*config.Config, error) { return &added, nil }
	if code, body := adminDo(t, h, "POST", "/admin/v1/reload", "test-admin"); code != 200 {
		t.Fatalf("good reload: %d %s", code, body)
	}
	if _, err := s.client("cg-test-initech").Chat.Completions.New(context.Background(), chatParams("new here", 8)); err != nil {
		t.Fatalf("the reloaded key does not work: %v", err)
	}
	_, metrics := adminDo(t, h, "GET", "/metrics", "test-admin")
	if !strings.Contains(metrics, `costgate_config_reloads_total{`) || !strings.Contains(metrics, "costgate_config_last_reload_success 1") {
		t.Errorf("reload metrics missing:\n%s", grep(metrics, "reload"))
	}
}

func grep(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestShadowDrill is the misconfiguration drill: a new policy that would
// block 40% of one tenant's traffic runs in shadow first. Nothing is
// blocked, and the metrics, the shadow view and the dashboard's data all
// show the 40% before anyone enforces it.
func TestShadowDrill(t *testing.T) {
	pols := fstest.MapFS{
		"allow.rego": allowAll["allow.rego"],
		"no_gpt4o.rego": {Data: []byte(`# METADATA
# custom:
#   shadow: true
package costgate.policies.no_gpt4o

decision := {"outcome": "hard", "status": 403, "reason": "gpt-4o is being retired"} if input.request.model == "gpt-4o"
`)},
	}
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: pols})
	client := s.client("cg-test-acme")
	for i := range 10 {
		p := chatParams("drill", 4)
		if i%5 < 2 {
			p.Model = "gpt-4o"
		}
		if _, err := client.Chat.Completions.New(context.Background(), p); err != nil {
			t.Fatalf("request %d was blocked by a shadow policy: %v", i, err)
		}
	}
	if err := s.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := s.srv.AdminHandler()
	_, metrics := adminDo(t, h, "GET", "/metrics", "test-admin")
	if !strings.Contains(metrics, `costgate_shadow_would_block_total{limit="none",policy="no_gpt4o",tenant="acme"} 4`) {
		t.Errorf("shadow metric:\n%s", grep(metrics, "shadow"))
	}
	_, shadow := adminDo(t, h, "GET", "/admin/v1/shadow", "test-admin")
	var sv struct {
		Shadow []struct {
			Policy  string `json:"policy"`
			Tenants []struct {
				Tenant           string `json:"tenant"`
				WouldBlockRecent int64  `json:"would_block_recent"`
				RequestsRecent   int64  `json:"requests_recent"`
			} `json:"tenants"`
		} `json:"shadow"`
	}
	if err := json.Unmarshal([]byte(shadow), &sv); err != nil || len(sv.Shadow) != 1 || len(sv.Shadow[0].Tenants) != 1 ||
		sv.Shadow[0].Tenants[0].WouldBlockRecent != 4 || sv.Shadow[0].Tenants[0].RequestsRecent != 10 {
		t.Errorf("shadow view: %s", shadow)
	}
	code, data := adminDo(t, h, "GET", "/admin/data.json", "test-admin")
	var dv struct {
		Shadow []struct {
			Policy string  `json:"policy"`
			Tenant string  `json:"tenant"`
			Share  float64 `json:"share"`
		} `json:"shadow"`
	}
	if err := json.Unmarshal([]byte(data), &dv); code != 200 || err != nil || len(dv.Shadow) != 1 || dv.Shadow[0].Share != 0.4 || dv.Shadow[0].Tenant != "acme" {
		t.Errorf("dashboard data: %d %s", code, data)
	}
}
