package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const testToken = "cg-test-admin-7f3a"

// readToken is a read-only admin token (control.read_token).
const readToken = "cg-test-read-51c0"

// mount serves h the way the proxy does, under /admin/.
func mount(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	return mux
}

func get(t *testing.T, h http.Handler, path string, header http.Header) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func bearer(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

func TestDataAuth(t *testing.T) {
	var calls atomic.Int64
	src := func(context.Context) (Data, error) {
		calls.Add(1)
		return sampleData(sampleNow), nil
	}
	tests := []struct {
		name       string
		configured []string
		header     http.Header
		want       int
	}{
		{"no header", []string{testToken}, nil, http.StatusUnauthorized},
		{"wrong token", []string{testToken}, bearer("cg-test-admin-7f3b"), http.StatusUnauthorized},
		{"prefix of the token", []string{testToken}, bearer(testToken[:len(testToken)-1]), http.StatusUnauthorized},
		{"token with a suffix", []string{testToken}, bearer(testToken + "x"), http.StatusUnauthorized},
		{"basic scheme", []string{testToken}, http.Header{"Authorization": {"Basic " + testToken}}, http.StatusUnauthorized},
		{"token without scheme", []string{testToken}, http.Header{"Authorization": {testToken}}, http.StatusUnauthorized},
		{"empty bearer", []string{testToken}, bearer(""), http.StatusUnauthorized},
		{"no token configured", []string{""}, bearer(""), http.StatusUnauthorized},
		{"right token", []string{testToken}, bearer(testToken), http.StatusOK},
		{"scheme in lower case", []string{testToken}, http.Header{"Authorization": {"bearer " + testToken}}, http.StatusOK},
		{"the read-only token", []string{testToken, readToken}, bearer(readToken), http.StatusOK},
		{"the admin token beside a read-only one", []string{testToken, readToken}, bearer(testToken), http.StatusOK},
		{"another token beside both", []string{testToken, readToken}, bearer("cg-test-admin-7f3b"), http.StatusUnauthorized},
		{"no read-only token configured", []string{testToken, ""}, bearer(""), http.StatusUnauthorized},
		{"no token at all", nil, bearer(""), http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls.Store(0)
			h := mount(Handler(func() []string { return tc.configured }, src))
			res := get(t, h, "/admin/data.json", tc.header)
			if res.StatusCode != tc.want {
				t.Fatalf("status = %d, want %d", res.StatusCode, tc.want)
			}
			if got := res.Header.Get("Cache-Control"); got != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", got)
			}
			if tc.want == http.StatusUnauthorized {
				if got := res.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Errorf("WWW-Authenticate = %q, want a Bearer challenge", got)
				}
				if calls.Load() != 0 {
					t.Errorf("the source was called %d times for an unauthorized request", calls.Load())
				}
				body, _ := io.ReadAll(res.Body)
				if strings.Contains(string(body), "acme") {
					t.Errorf("an unauthorized answer carries data: %s", body)
				}
			}
		})
	}
}

func TestDataTokenReload(t *testing.T) {
	var current atomic.Value
	current.Store("first-token")
	h := mount(Handler(func() []string { return []string{current.Load().(string)} }, func(context.Context) (Data, error) {
		return Data{GeneratedAt: sampleNow}, nil
	}))
	if res := get(t, h, "/admin/data.json", bearer("first-token")); res.StatusCode != http.StatusOK {
		t.Fatalf("first token: status %d", res.StatusCode)
	}
	current.Store("second-token")
	if res := get(t, h, "/admin/data.json", bearer("first-token")); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("old token after reload: status %d, want 401", res.StatusCode)
	}
	if res := get(t, h, "/admin/data.json", bearer("second-token")); res.StatusCode != http.StatusOK {
		t.Fatalf("new token after reload: status %d", res.StatusCode)
	}
}

func TestDataJSONShape(t *testing.T) {
	d := sampleData(sampleNow)
	d.Spend = append(d.Spend, TenantSeries{Tenant: "whale", Points: []Point{{T: sampleNow.Truncate(time.Minute), NanoUSD: 9_007_199_254_740_993}}})
	h := mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) { return d, nil }))
	res := get(t, h, "/admin/data.json", bearer(testToken))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	body, _ := io.ReadAll(res.Body)

	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("decode: %v\n%s", err, body)
	}
	for _, k := range []string{"generated_at", "store", "spend", "decisions", "top_throttled", "shadow"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("data.json has no %q: %s", k, body)
		}
	}
	// Nano-dollars travel as strings so that JavaScript reads them exactly,
	// even past 2^53.
	if !strings.Contains(string(body), `"nano_usd":"9007199254740993"`) {
		t.Errorf("nano_usd is not an exact decimal string: %s", body)
	}
	var store map[string]any
	json.Unmarshal(raw["store"], &store)
	want := map[string]any{"kind": "redis", "healthy": true, "breaker": "half_open", "fail_open_total": 1742.0}
	for k, v := range want {
		if store[k] != v {
			t.Errorf("store.%s = %v, want %v", k, store[k], v)
		}
	}
	var shadow []map[string]any
	json.Unmarshal(raw["shadow"], &shadow)
	if len(shadow) != 2 || shadow[1]["share"] != 0.4 || shadow[1]["would_block"] != 5312.0 || shadow[1]["tenant"] != "globex" {
		t.Errorf("shadow = %v", shadow)
	}
	var decisions []map[string]any
	json.Unmarshal(raw["decisions"], &decisions)
	for _, k := range []string{"policy", "allow", "soft", "hard", "shadow", "points"} {
		if _, ok := decisions[0][k]; !ok {
			t.Errorf("decisions[0] has no %q: %v", k, decisions[0])
		}
	}

	// The round trip gives back what the source said.
	var back Data
	if err := json.Unmarshal(body, &back); err != nil {
		t.Fatal(err)
	}
	if !back.GeneratedAt.Equal(d.GeneratedAt) || len(back.Spend) != 4 || back.Spend[3].Points[0].NanoUSD != 9_007_199_254_740_993 ||
		back.Decisions[0].Hard != d.Decisions[0].Hard || back.TopThrottled[1].Key != topKey || back.Shadow[1].Share != 0.4 {
		t.Errorf("round trip lost data: %+v", back)
	}
}

func TestDataEmpty(t *testing.T) {
	before := time.Now()
	var shared = []TenantSeries{{Tenant: "a"}}
	h := mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
		return Data{Spend: shared}, nil
	}))
	res := get(t, h, "/admin/data.json", bearer(testToken))
	body, _ := io.ReadAll(res.Body)
	for _, want := range []string{`"decisions":[]`, `"top_throttled":[]`, `"shadow":[]`, `"points":[]`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("empty data lacks %s: %s", want, body)
		}
	}
	if shared[0].Points != nil {
		t.Error("the handler wrote into the source's slice")
	}
	var d Data
	json.Unmarshal(body, &d)
	if d.GeneratedAt.Before(before.Add(-time.Second)) || d.GeneratedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("zero GeneratedAt was not filled with the request time: %v", d.GeneratedAt)
	}
}

func TestDataSourceError(t *testing.T) {
	h := mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
		return Data{}, errors.New("ledger unreachable")
	}))
	res := get(t, h, "/admin/data.json", bearer(testToken))
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", res.StatusCode)
	}
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	json.NewDecoder(res.Body).Decode(&e)
	if !strings.Contains(e.Error.Message, "ledger unreachable") {
		t.Errorf("error message %q does not say why", e.Error.Message)
	}
}

func TestAssets(t *testing.T) {
	h := mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
		t.Error("the source was called for a static asset")
		return Data{}, nil
	}))
	tests := []struct {
		path, ctype, contains string
	}{
		{"/admin/", "text/html; charset=utf-8", "<h1>"},
		{"/admin/index.html", "text/html; charset=utf-8", `src="app.js"`},
		{"/admin/app.js", "text/javascript; charset=utf-8", "data.json"},
		{"/admin/style.css", "text/css; charset=utf-8", ".card"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			res := get(t, h, tc.path, nil) // no token: assets are public
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d", res.StatusCode)
			}
			if got := res.Header.Get("Content-Type"); got != tc.ctype {
				t.Errorf("Content-Type = %q, want %q", got, tc.ctype)
			}
			if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options = %q", got)
			}
			if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe-inline") {
				t.Errorf("Content-Security-Policy = %q", csp)
			}
			body, _ := io.ReadAll(res.Body)
			if !strings.Contains(string(body), tc.contains) {
				t.Errorf("%s does not contain %q", tc.path, tc.contains)
			}
		})
	}
}

// TestAssetsSelfContained checks that no embedded file names a URL outside
// the page, and that the page refers to its own files relatively, so that
// it works under whatever prefix it is mounted at.
func TestAssetsSelfContained(t *testing.T) {
	n := 0
	err := fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		b, err := assets.ReadFile(path)
		if err != nil {
			return err
		}
		s := strings.ToLower(string(b))
		for _, bad := range []string{"http://", "https://", "//cdn", "@import", "url("} {
			if strings.Contains(s, bad) {
				t.Errorf("%s contains %q", path, bad)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("walked %d assets, want 3", n)
	}
	index, _ := assets.ReadFile("assets/index.html")
	for _, ref := range []string{`href="style.css"`, `src="app.js"`} {
		if !strings.Contains(string(index), ref) {
			t.Errorf("index.html does not refer to %s relatively", ref)
		}
	}
}

func TestRouting(t *testing.T) {
	h := mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) { return Data{}, nil }))
	if res := get(t, h, "/admin/secrets.txt", nil); res.StatusCode != http.StatusNotFound {
		t.Errorf("unknown file: status %d, want 404", res.StatusCode)
	}
	if res := get(t, h, "/admin", nil); res.StatusCode/100 != 3 || res.Header.Get("Location") != "/admin/" {
		t.Errorf("/admin: status %d to %q, want a redirect to /admin/", res.StatusCode, res.Header.Get("Location"))
	}
	for _, path := range []string{"/admin/", "/admin/data.json"} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+testToken)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("POST %s: status %d, Allow %q", path, rec.Code, rec.Header().Get("Allow"))
		}
	}
	req := httptest.NewRequest(http.MethodHead, "/admin/app.js", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Header().Get("Content-Type") == "" {
		t.Errorf("HEAD app.js: status %d, %d body bytes, type %q", rec.Code, rec.Body.Len(), rec.Header().Get("Content-Type"))
	}
}

func TestFormatUSDReference(t *testing.T) {
	// The test's reference formatter, against hand-worked values.
	tests := []struct {
		n        int64
		decimals int
		want     string
	}{
		{0, 2, "$0.00"},
		{4_999_999, 2, "$0.00"},
		{5_000_000, 2, "$0.01"},
		{1_234_567_890_123, 2, "$1,234.57"},
		{9_007_199_254_740_993, 9, "$9,007,199.254740993"},
		{-1_500_000_000, 2, "-$1.50"},
		{-1, 2, "$0.00"},
		{123_456, 6, "$0.000123"},
	}
	for _, tc := range tests {
		if got := formatUSD(tc.n, tc.decimals); got != tc.want {
			t.Errorf("formatUSD(%d, %d) = %q, want %q", tc.n, tc.decimals, got, tc.want)
		}
	}
	for n, want := range map[int64]string{0: "$0.00", 12_180_000_000: "$12.18", 152_000_000: "$0.1520", 4_090_000: "$0.004090", 999: "$0.000000999"} {
		if got := formatMoney(n); got != want {
			t.Errorf("formatMoney(%d) = %q, want %q", n, got, want)
		}
	}
}

// FuzzAuthorization checks the bearer parsing on any header: it never
// panics, and it accepts a header only if it is the Bearer scheme (in any
// case) followed by exactly the token, give or take surrounding spaces.
func FuzzAuthorization(f *testing.F) {
	for _, s := range []string{"Bearer " + testToken, "bearer " + testToken, "Bearer", "Bearer ", "Basic x", "", " Bearer " + testToken, "Bearer  " + testToken + " ", "Bearer \x00"} {
		f.Add(s)
	}
	h := &handler{tokens: func() []string { return []string{testToken} }, src: func(context.Context) (Data, error) { return Data{}, nil }}
	f.Fuzz(func(t *testing.T, header string) {
		req := httptest.NewRequest(http.MethodGet, "/data.json", nil)
		req.Header.Set("Authorization", header)
		got := h.authorized(req)
		want := len(header) >= 7 && strings.EqualFold(header[:7], "Bearer ") && strings.TrimSpace(header[7:]) == testToken
		if got != want {
			t.Fatalf("authorized(%q) = %v, want %v", header, got, want)
		}
	})
}
