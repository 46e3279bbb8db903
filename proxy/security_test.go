package proxy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/proxy"
)

// upstreamSecret is the credential costgate injects for the generic
// upstream "gen" of the security tests.
const upstreamSecret = "gen-upstream-secret"

// recorder is a generic upstream that records what reaches it and, like a
// careless server, echoes a TRACE request's header back.
type recorder struct {
	mu   sync.Mutex
	seen []string // "METHOD path" of every request that reached it
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.mu.Lock()
	rec.seen = append(rec.seen, r.Method+" "+r.URL.Path)
	rec.mu.Unlock()
	if r.Method == http.MethodTrace {
		r.Header.Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path})
}

func (rec *recorder) take() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	s := rec.seen
	rec.seen = nil
	return s
}

// genericYAML configures the generic upstream gen at base (whose path,
// /api, is the prefix every forwarded path must stay under): a call costs
// $0.001, and a call under /expensive $1.
func genericYAML(base string) string {
	return `
  - name: gen
    kind: generic
    base_url: ` + base + `/api
    api_key: ` + upstreamSecret + `
    auth_header: X-Gen-Key
    cost: {per_call: "0.001"}
    paths:
      - prefix: /expensive
        cost: {per_call: "1.00"}
limits:
  - name: acme-requests
    dimensions: [tenant, route]
    unit: requests
    rate: 1000
    period: 1m
`
}

// rawResponse is what a raw request got.
type rawResponse struct {
	status int
	header http.Header
	body   string
}

// rawRequest sends one request line exactly as written (Go's client would
// clean the path first) to addr, with the tenant acme's key.
func rawRequest(t *testing.T, base, method, target string) rawResponse {
	t.Helper()
	return sendRaw(t, base, fmt.Sprintf("%s %s HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nContent-Length: 0\nConnection: close\n\n",
		method, target, strings.TrimPrefix(base, "http://")))
}

// errorCode is the code of an OpenAI-shaped error body, or "".
func errorCode(body string) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

// TestGenericPathIsReadOnce: a path that could be read two ways is
// refused before anything reaches the upstream; a path with dot-segments
// or empty segments that stays under /u/gen is forwarded cleaned, priced
// by the rule of its cleaned path, and the upstream receives exactly that
// path under its base_url's.
func TestGenericPathIsReadOnce(t *testing.T) {
	rec := &recorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	s := newStack(t, "", genericYAML(up.URL))

	// Go's server refuses an invalid escape itself, before costgate sees it.
	byGo := map[string]bool{"invalid escape": true}
	refused := []struct{ name, target string }{
		{"raw dot-dot climbs out", "/u/gen/../../admin"},
		{"raw dot-dot after a segment climbs out", "/u/gen/x/../../admin"},
		{"dot-dot alone", "/u/gen/.."},
		{"encoded dot-dot", "/u/gen/%2e%2e/%2e%2e/admin"},
		{"encoded dot-dot, mixed case", "/u/gen/%2E%2e/admin"},
		{"half-encoded dot-dot", "/u/gen/.%2e/admin"},
		{"dot-dot and encoded slash", "/u/gen/..%2f..%2fadmin"},
		{"encoded slash", "/u/gen/a%2fb"},
		{"encoded slash, upper case", "/u/gen/a%2Fb"},
		{"encoded backslash", "/u/gen/..%5c..%5cadmin"},
		{"raw backslash", `/u/gen/..\..\admin`},
		{"NUL", "/u/gen/a%00b"},
		{"newline", "/u/gen/a%0ab"},
		{"DEL", "/u/gen/a%7fb"},
		{"double-encoded dot-dot", "/u/gen/%252e%252e/admin"},
		{"dot-dot with parameters", "/u/gen/..;/admin"},
		{"invalid escape", "/u/gen/a%zz"},
		{"mixed: cleaned then climbs", "/u/gen/x/./%2e%2e//../admin"},
	}
	for _, c := range refused {
		t.Run("refused/"+c.name, func(t *testing.T) {
			got := rawRequest(t, s.url, "GET", c.target)
			if got.status != http.StatusBadRequest {
				t.Fatalf("GET %s: %d %s, want 400", c.target, got.status, got.body)
			}
			if code := errorCode(got.body); code != "invalid_path" && !byGo[c.name] {
				t.Errorf("GET %s: error code %q, want invalid_path (body %s)", c.target, code, got.body)
			}
			if seen := rec.take(); len(seen) > 0 {
				t.Errorf("GET %s reached the upstream as %v", c.target, seen)
			}
		})
	}

	served := []struct {
		name, target, want string // want: the path the upstream receives
		cost               costmodel.NanoUSD
	}{
		{"plain", "/u/gen/expensive", "/api/expensive", 1_000_000_000},
		{"dot-dot inside the prefix", "/u/gen/x/../expensive", "/api/expensive", 1_000_000_000},
		{"encoded dot-dot inside the prefix", "/u/gen/x/%2e%2E/expensive", "/api/expensive", 1_000_000_000},
		{"double slash", "/u/gen//expensive", "/api/expensive", 1_000_000_000},
		{"dot", "/u/gen/./expensive", "/api/expensive", 1_000_000_000},
		{"encoded letters", "/u/gen/%65xpensive", "/api/expensive", 1_000_000_000},
		{"mixed", "/u/gen/a/.//b/%2e%2e/../expensive/", "/api/expensive/", 1_000_000_000},
		{"cheap", "/u/gen/cheap", "/api/cheap", 1_000_000},
		{"cheap with a trailing dot-dot", "/u/gen/cheap/x/..", "/api/cheap/", 1_000_000},
		{"root", "/u/gen/", "/api/", 1_000_000},
	}
	ids := map[string]string{} // request id -> case
	for _, c := range served {
		t.Run("served/"+c.name, func(t *testing.T) {
			got := rawRequest(t, s.url, "GET", c.target)
			if got.status != http.StatusOK {
				t.Fatalf("GET %s: %d %s", c.target, got.status, got.body)
			}
			if seen := rec.take(); len(seen) != 1 || seen[0] != "GET "+c.want {
				t.Errorf("GET %s reached the upstream as %v, want [GET %s]", c.target, seen, c.want)
			}
			ids[got.header.Get("X-Request-Id")] = c.name
		})
	}
	// The ledger prices each request by the rule of the path the upstream
	// received, and keys it by the route /u/gen.
	want := map[string]costmodel.NanoUSD{}
	for _, c := range served {
		want[c.name] = c.cost
	}
	for _, e := range s.entries(t) {
		name, ok := ids[e.RequestID]
		if !ok {
			continue
		}
		delete(ids, e.RequestID)
		if e.EstimatedCost != want[name] || e.ActualCost != want[name] {
			t.Errorf("%s: estimated %d, actual %d; want %d", name, e.EstimatedCost, e.ActualCost, want[name])
		}
		if e.Route != "/u/gen" {
			t.Errorf("%s: route %q, want /u/gen", name, e.Route)
		}
	}
	if len(ids) > 0 {
		t.Errorf("no ledger entry for %v", ids)
	}
}

// TestGenericMethods: TRACE and CONNECT never reach a generic upstream, nor
// does a method outside the upstream's methods; each is a 405 with an
// Allow header and a JSON body.
func TestGenericMethods(t *testing.T) {
	rec := &recorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	yaml := genericYAML(up.URL)
	yaml = strings.Replace(yaml, "\nlimits:", `
  - name: readonly
    kind: generic
    base_url: `+up.URL+`
    api_key: ro-secret
    methods: [get, HEAD]
    cost: {per_call: "0.001"}
limits:`, 1)
	s := newStack(t, "", yaml)

	cases := []struct {
		name, method, target, allow string
		status                      int
	}{
		{"GET is forwarded", "GET", "/u/gen/x", "", http.StatusOK},
		{"DELETE is forwarded", "DELETE", "/u/gen/x", "", http.StatusOK},
		{"TRACE", "TRACE", "/u/gen/x", "GET, HEAD, POST, PUT, PATCH, DELETE", http.StatusMethodNotAllowed},
		{"CONNECT", "CONNECT", "/u/gen/x", "GET, HEAD, POST, PUT, PATCH, DELETE", http.StatusMethodNotAllowed},
		{"OPTIONS is not a default", "OPTIONS", "/u/gen/x", "GET, HEAD, POST, PUT, PATCH, DELETE", http.StatusMethodNotAllowed},
		{"an unknown method", "PROPFIND", "/u/gen/x", "GET, HEAD, POST, PUT, PATCH, DELETE", http.StatusMethodNotAllowed},
		{"POST to a read-only upstream", "POST", "/u/readonly/x", "GET, HEAD", http.StatusMethodNotAllowed},
		{"TRACE to a read-only upstream", "TRACE", "/u/readonly/x", "GET, HEAD", http.StatusMethodNotAllowed},
		{"GET to a read-only upstream", "GET", "/u/readonly/x", "", http.StatusOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := rawRequest(t, s.url, c.method, c.target)
			if got.status != c.status {
				t.Fatalf("%s %s: %d %s, want %d", c.method, c.target, got.status, got.body, c.status)
			}
			seen := rec.take()
			if c.status != http.StatusMethodNotAllowed {
				if len(seen) != 1 {
					t.Errorf("%s %s reached the upstream %d times", c.method, c.target, len(seen))
				}
				return
			}
			if len(seen) > 0 {
				t.Errorf("%s %s reached the upstream as %v", c.method, c.target, seen)
			}
			if a := got.header.Get("Allow"); a != c.allow {
				t.Errorf("Allow %q, want %q", a, c.allow)
			}
			if code := errorCode(got.body); code != "method_not_allowed" {
				t.Errorf("body %s, want a JSON error with code method_not_allowed", got.body)
			}
			if strings.Contains(got.body, upstreamSecret) || strings.Contains(got.body, "ro-secret") {
				t.Errorf("the body shows the upstream's credential: %s", got.body)
			}
		})
	}
}

// TestNoLeaks: an unreachable upstream's 502 names neither its address nor
// its credential (the log has the detail, redacted, with the request id),
// and a base_url's userinfo and query never show in what the server
// describes or logs.
func TestNoLeaks(t *testing.T) {
	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	var logs bytes.Buffer
	var logMu sync.Mutex
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: test-admin
data_dir: %q
upstreams:
  - name: gone
    kind: generic
    base_url: http://user:hunter2@%s/api?token=qsecret
    api_key: query-credential
    auth_query: key
    cost: {per_call: "0.001"}
tenants:
  - name: acme
    plan: free
    keys: [{key: cg-test-acme}]
`, t.TempDir(), dead)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store.Redis, cfg.Ledger.DSN = "", ""
	log := slog.New(slog.NewJSONHandler(lockedWriter{&logs, &logMu}, nil))
	srv, err := proxy.Open(t.Context(), cfg, proxy.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	secrets := []string{dead, "hunter2", "qsecret", "query-credential"}
	got := rawRequest(t, ts.URL, "GET", "/u/gone/x")
	if got.status != http.StatusBadGateway {
		t.Fatalf("status %d %s, want 502", got.status, got.body)
	}
	for _, sec := range secrets {
		if strings.Contains(got.body, sec) {
			t.Errorf("the 502 body shows %q: %s", sec, got.body)
		}
	}
	srv.WaitIdle(t.Context())
	describe := strings.Join(srv.Describe(), "\n")
	logMu.Lock()
	logged := logs.String()
	logMu.Unlock()
	for _, sec := range []string{"hunter2", "qsecret", "query-credential"} {
		if strings.Contains(describe, sec) {
			t.Errorf("Describe shows %q:\n%s", sec, describe)
		}
		if strings.Contains(logged, sec) {
			t.Errorf("the log shows %q:\n%s", sec, logged)
		}
	}
	if !strings.Contains(logged, got.header.Get("X-Request-Id")) || !strings.Contains(logged, "upstream request failed") {
		t.Errorf("the log does not record the failure with its request id:\n%s", logged)
	}
}

// TestStoreURLErrorIsRedacted: a Redis URL that does not parse is
// reported without its password.
func TestStoreURLErrorIsRedacted(t *testing.T) {
	cfg, err := config.Parse([]byte("admin_token: t\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = t.TempDir()
	cfg.Store.Redis, cfg.Ledger.DSN = "redis://user:hunter2@127.0.0.1:6379/%zz", ""
	srv, err := proxy.Open(t.Context(), cfg, proxy.Options{})
	if err == nil {
		srv.Close()
		t.Fatal("a Redis URL that does not parse was accepted")
	}
	if !strings.Contains(err.Error(), "store.redis") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %q: want it to name store.redis and not the password", err)
	}
}

// lockedWriter serializes writes to a buffer shared with the test.
type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
