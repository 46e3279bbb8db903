package proxy_test

// Attacks of a tenant on its limits and on other tenants through the
// request's spelling: its path, its method, its credential headers, the
// headers a limit key could be read from, and the query and headers a
// generic upstream's cost rule reads. Each test checks what reached the
// stub upstream against what was debited and billed.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/simulator"
	"github.com/redis/go-redis/v9"
)

// routeAtkSeen is what one request that reached a stub upstream looked
// like there.
type routeAtkSeen struct {
	method, path, rawQuery, host string
	header, trailer              http.Header
	body                         string
}

// routeAtkSpy records every request that reaches the upstream, then lets next
// answer it (nil: a small JSON answer).
type routeAtkSpy struct {
	next http.Handler
	mu   sync.Mutex
	seen []routeAtkSeen
}

func (s *routeAtkSpy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	s.mu.Lock()
	s.seen = append(s.seen, routeAtkSeen{method: r.Method, path: r.URL.EscapedPath(), rawQuery: r.URL.RawQuery,
		host: r.Host, header: r.Header.Clone(), trailer: r.Trailer.Clone(), body: string(b)})
	s.mu.Unlock()
	if s.next != nil {
		s.next.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"ok":true}`))
}

func (s *routeAtkSpy) take() []routeAtkSeen {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.seen
	s.seen = nil
	return out
}

// routeAtkSimSpy is a spy in front of the simulator.
func routeAtkSimSpy(t *testing.T) *routeAtkSpy {
	t.Helper()
	return &routeAtkSpy{next: simulator.New(simulator.Config{Estimator: estimator(t)})}
}

// sendRaw writes req, a whole HTTP/1.x request with its header and body
// exactly as given ("\n" line ends are made "\r\n" in the header), to the
// server at base and reads one response.
func sendRaw(t *testing.T, base, req string) rawResponse {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	head, body, _ := strings.Cut(req, "\n\n")
	head = strings.ReplaceAll(head, "\n", "\r\n")
	if _, err := io.WriteString(conn, head+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	method, _, _ := strings.Cut(req, " ")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 {
		resp, err = http.ReadResponse(br, &http.Request{Method: method}) // an interim answer
	}
	if err != nil {
		t.Fatalf("%q: %v", strings.SplitN(req, "\n", 2)[0], err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawResponse{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// routeAtkChatBody is a small chat completion request.
const routeAtkChatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`

// routeAtkChat is a raw POST of routeAtkChatBody to target with the extra header
// lines given (each ending in "\n").
func routeAtkChat(target, host, header string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\nHost: %s\nContent-Type: application/json\nContent-Length: %d\nConnection: close\n%s\n%s",
		target, host, len(routeAtkChatBody), header, routeAtkChatBody)
}

// routeAtkEntries is the ledger's entries of tenant, flushed.
func routeAtkEntries(t *testing.T, s *stack, tenant string) []ledger.Entry {
	t.Helper()
	ctx := t.Context()
	if err := s.srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.srv.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := s.srv.Ledger().Entries(ctx, ledger.Query{Tenant: tenant, From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return page.Entries
}

// TestRouteAttackLLMRouteSpellings: a spelling of an API path either is served
// as that route (debited, billed under the route, and forwarded to the
// route's path on the upstream's own host) or reaches nothing. No spelling
// reaches the upstream unbilled or at another path than the one priced,
// and a method an API path does not take never reaches it.
func TestRouteAttackLLMRouteSpellings(t *testing.T) {
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
	host := strings.TrimPrefix(s.url, "http://")
	auth := "Authorization: Bearer cg-test-acme\n"

	served := []struct{ name, target, host string }{
		{"plain", "/v1/chat/completions", host},
		{"query string", "/v1/chat/completions?api-version=1&x=%2F..%2F", host},
		{"encoded slash", "/v1/chat%2Fcompletions", host},
		{"encoded letters", "/v1/%63hat/completions", host},
		{"absolute form elsewhere", "http://evil.example/v1/chat/completions", "evil.example"},
		{"Host elsewhere", "/v1/chat/completions", "evil.example:8080"},
	}
	for _, c := range served {
		t.Run("served/"+c.name, func(t *testing.T) {
			got := sendRaw(t, s.url, routeAtkChat(c.target, c.host, auth))
			if got.status != http.StatusOK {
				t.Fatalf("POST %s: %d %s", c.target, got.status, got.body)
			}
			seen := up.take()
			if len(seen) != 1 || seen[0].path != "/v1/chat/completions" || seen[0].method != "POST" {
				t.Fatalf("POST %s reached the upstream as %+v, want one POST /v1/chat/completions", c.target, seen)
			}
			if seen[0].host == "evil.example" || strings.HasPrefix(seen[0].host, "evil.example:") {
				t.Errorf("POST %s reached the upstream with the client's Host %q", c.target, seen[0].host)
			}
		})
	}

	refused := []struct {
		name, method, target string
		status               int
	}{
		{"double slash", "POST", "/v1//chat/completions", 404},
		{"leading double slash", "POST", "//v1/chat/completions", 404},
		{"trailing slash", "POST", "/v1/chat/completions/", 307},
		{"upper case", "POST", "/V1/chat/completions", 404},
		{"dot segment", "POST", "/v1/./chat/completions", 404},
		{"dot-dot from a cheaper route", "POST", "/v1/embeddings/../chat/completions", 404},
		{"encoded dot-dot from a cheaper route", "POST", "/v1/embeddings/%2e%2e/chat/completions", 404},
		{"path parameter", "POST", "/v1/chat/completions;x=1", 404},
		{"encoded NUL", "POST", "/v1/chat/completions%00", 404},
		{"GET on a POST route", "GET", "/v1/chat/completions", 405},
		{"HEAD on a POST route", "HEAD", "/v1/chat/completions", 405},
		{"OPTIONS on a POST route", "OPTIONS", "/v1/chat/completions", 405},
		{"PUT on a POST route", "PUT", "/v1/messages", 405},
		{"an LLM upstream as a generic one", "POST", "/u/openai/v1/chat/completions", 404},
		{"an LLM upstream as a generic one, encoded", "POST", "/u/%6fpenai/v1/chat/completions", 404},
	}
	for _, c := range refused {
		t.Run("refused/"+c.name, func(t *testing.T) {
			req := strings.Replace(routeAtkChat(c.target, host, auth), "POST", c.method, 1)
			got := sendRaw(t, s.url, req)
			if got.status != c.status {
				t.Errorf("%s %s: %d %s, want %d", c.method, c.target, got.status, got.body, c.status)
			}
			if seen := up.take(); len(seen) > 0 {
				t.Errorf("%s %s reached the upstream as %+v", c.method, c.target, seen)
			}
		})
	}

	// Every request that reached the upstream has its entry, under the
	// route it reached.
	es := routeAtkEntries(t, s, "acme")
	if len(es) != len(served) {
		t.Errorf("%d ledger entries, want one per served request (%d)", len(es), len(served))
	}
	for _, e := range es {
		if e.Route != "/v1/chat/completions" || e.ActualCost <= 0 {
			t.Errorf("entry %s: route %q, cost %d", e.RequestID, e.Route, e.ActualCost)
		}
	}
}

// TestRouteAttackCredentialHeaders: the key a request is identified by is the
// one it is charged to, whichever spelling and however many credential
// headers it carries; a spelling costgate does not read is a 401 that
// reaches nothing; and the upstream never sees any of the client's
// credential headers, only the one costgate injects.
func TestRouteAttackCredentialHeaders(t *testing.T) {
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
	host := strings.TrimPrefix(s.url, "http://")

	cases := []struct {
		name, header string
		tenant       string // "" for a 401
	}{
		{"bearer, lower case scheme", "authorization: bearer cg-test-acme\n", "acme"},
		{"bearer, extra spaces", "Authorization: Bearer    cg-test-acme  \n", "acme"},
		{"x-api-key", "x-api-key: cg-test-globex\n", "globex"},
		{"X-API-KEY upper case", "X-API-KEY: cg-test-globex\n", "globex"},
		// x-api-key is read first: the bearer token of another tenant is
		// ignored, and the request is charged to the x-api-key's tenant.
		{"x-api-key and another tenant's bearer", "Authorization: Bearer cg-test-acme\nx-api-key: cg-test-globex\n", "globex"},
		{"bearer and another tenant's x-api-key", "x-api-key: cg-test-acme\nAuthorization: Bearer cg-test-globex\n", "acme"},
		// A wrong x-api-key is not excused by a right bearer token.
		{"unknown x-api-key, valid bearer", "x-api-key: cg-wrong\nAuthorization: Bearer cg-test-acme\n", ""},
		{"empty x-api-key, valid bearer", "x-api-key: \nAuthorization: Bearer cg-test-acme\n", "acme"},
		// Of two headers of one name, the first is read.
		{"two bearer headers", "Authorization: Bearer cg-test-globex\nAuthorization: Bearer cg-test-acme\n", "globex"},
		{"two x-api-key headers", "x-api-key: cg-test-acme\nx-api-key: cg-test-globex\n", "acme"},
		{"bearer without a space", "Authorization: Bearercg-test-acme\n", ""},
		{"bearer with a tab", "Authorization: Bearer\tcg-test-acme\n", ""},
		{"basic scheme", "Authorization: Basic cg-test-acme\n", ""},
		{"token as the whole header", "Authorization: cg-test-acme\n", ""},
		{"bearer with nothing", "Authorization: Bearer \n", ""},
		{"key in the query only", "", ""},
		{"api-key header (Azure's)", "api-key: cg-test-acme\n", ""},
	}
	want := map[string]int{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			target := "/v1/chat/completions"
			if c.name == "key in the query only" {
				target += "?api_key=cg-test-acme&key=cg-test-acme"
			}
			got := sendRaw(t, s.url, routeAtkChat(target, host, c.header))
			seen := up.take()
			if c.tenant == "" {
				if got.status != http.StatusUnauthorized {
					t.Errorf("%d %s, want 401", got.status, got.body)
				}
				if len(seen) > 0 {
					t.Errorf("a refused request reached the upstream: %+v", seen)
				}
				return
			}
			if got.status != http.StatusOK {
				t.Fatalf("%d %s", got.status, got.body)
			}
			if len(seen) != 1 {
				t.Fatalf("reached the upstream %d times", len(seen))
			}
			want[c.tenant]++
			h := seen[0].header
			if v := h.Values("Authorization"); len(v) != 1 || v[0] != "Bearer sk-upstream-secret" {
				t.Errorf("the upstream saw Authorization %q, want only the injected credential", v)
			}
			if v := h.Values("X-Api-Key"); len(v) != 0 {
				t.Errorf("the upstream saw the client's x-api-key %q", v)
			}
		})
	}
	for _, tenant := range []string{"acme", "globex"} {
		if n := len(routeAtkEntries(t, s, tenant)); n != want[tenant] {
			t.Errorf("tenant %s has %d ledger entries, want %d", tenant, n, want[tenant])
		}
	}
}

// TestRouteAttackForwardedHeadersDoNotMoveTheIPKey: an ip limit is keyed by the
// connection's address; X-Forwarded-For, Forwarded, X-Real-IP and
// True-Client-IP, which a caller writes as it likes, neither give it a
// fresh key nor charge another address's; and they are not passed on.
func TestRouteAttackForwardedHeadersDoNotMoveTheIPKey(t *testing.T) {
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{redisURL: redistest.New(t).URL, upstream: up, extra: `
limits:
  - name: per-ip
    dimensions: [ip]
    unit: requests
    rate: 3
    period: 1h
`})
	host := strings.TrimPrefix(s.url, "http://")
	spoof := []string{
		"X-Forwarded-For: 203.0.113.1\n",
		"X-Forwarded-For: 203.0.113.2, 127.0.0.1\nForwarded: for=203.0.113.2\n",
		"X-Real-IP: 203.0.113.3\nTrue-Client-IP: 203.0.113.3\nCF-Connecting-IP: 203.0.113.3\n",
		"X-Forwarded-For: 203.0.113.4\n",
		"X-Forwarded-For: 203.0.113.5\n",
	}
	var codes []int
	for _, h := range spoof {
		got := sendRaw(t, s.url, routeAtkChat("/v1/chat/completions", host, "Authorization: Bearer cg-test-acme\n"+h))
		codes = append(codes, got.status)
	}
	if fmt.Sprint(codes) != "[200 200 200 429 429]" {
		t.Errorf("statuses %v, want [200 200 200 429 429]: the per-ip limit is keyed by the connection", codes)
	}
	for _, r := range up.take() {
		for _, name := range []string{"Forwarded", "X-Forwarded-For"} {
			if v := r.header.Values(name); len(v) > 0 {
				t.Errorf("the upstream saw the client's %s %q", name, v)
			}
		}
	}
}

// TestRouteAttackAdminPathSpellings: no spelling of an admin or operator path
// reaches its data without the admin token: a cleaned or redirected
// spelling still asks for it, and an encoded slash does not make the
// dashboard's static handler serve an admin route.
func TestRouteAttackAdminPathSpellings(t *testing.T) {
	s := newStack(t, "", roomyLimits)
	ts := httptest.NewServer(s.srv.AdminHandler())
	t.Cleanup(ts.Close)
	host := strings.TrimPrefix(ts.URL, "http://")
	targets := []string{
		"/admin/v1/tenants/acme/spend",
		"/admin/v1%2Ftenants/acme/spend",
		"/admin%2Fv1/tenants/acme/spend",
		"/admin/./v1/tenants/acme/spend",
		"/admin//v1/tenants/acme/spend",
		"/admin/x/../v1/tenants/acme/spend",
		"/admin/%2e%2e/admin/v1/ledger",
		"/admin/v1/%2e%2e/v1/ledger",
		"/ADMIN/v1/ledger",
		"/admin/v1/ledger;x",
		"/admin/v1/ledger?token=test-admin",
		"http://" + host + "/admin/v1/ledger",
		"/metrics",
		"/metrics/",
		"//metrics",
		"/./metrics",
		"/admin/../metrics",
		"/admin/%2e%2e/metrics",
		"/admin/data.json",
		"/admin//data.json",
		"/admin/v1/../data.json",
		"/admin/v1/keys",
		"/admin/v1/audit",
	}
	for _, method := range []string{"GET", "HEAD", "POST"} {
		for _, target := range targets {
			got := sendRaw(t, ts.URL, fmt.Sprintf("%s %s HTTP/1.1\nHost: %s\nAuthorization: Bearer wrong\nContent-Length: 0\nConnection: close\n\n", method, target, host))
			switch got.status {
			case http.StatusUnauthorized, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusBadRequest:
			case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
				// A redirect shows nothing; where it points asks for the token.
				loc := got.header.Get("Location")
				u, err := url.Parse(loc)
				if err != nil || (u.Host != "" && u.Host != host) {
					t.Errorf("%s %s: redirected off the admin listener to %q", method, target, loc)
					continue
				}
				again := sendRaw(t, ts.URL, fmt.Sprintf("GET %s HTTP/1.1\nHost: %s\nContent-Length: 0\nConnection: close\n\n", u.RequestURI(), host))
				if again.status == http.StatusOK {
					t.Errorf("%s %s: redirected to %s, which answers 200 without the token", method, target, loc)
				}
			default:
				t.Errorf("%s %s without the token: %d %.200s", method, target, got.status, got.body)
			}
		}
	}
}

// routeAtkGenericYAML is a generic upstream gen at base/api whose call costs
// $0.001, whose calls under /v1/premium cost $1, and a second upstream
// units whose calls cost $0.01 per result, the results read from the query
// parameter num or the header X-Num (default 1, at most 100).
func routeAtkGenericYAML(base string) string {
	return `
  - name: gen
    kind: generic
    base_url: ` + base + `/api
    api_key: gen-secret
    auth_header: X-Gen-Key
    cost: {per_call: "0.001"}
    paths:
      - prefix: /v1/premium
        cost: {per_call: "1.00"}
  - name: units
    kind: generic
    base_url: ` + base + `/units
    api_key: units-secret
    auth_header: X-Units-Key
    cost:
      per_unit: "0.01"
      units: {query: num, header: X-Num, default: 1, max: 100}
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 1000
    period: 1m
`
}

// routeAtkStripParams is the path as servers that drop a segment's parameters
// (";name=value", as Tomcat, Jetty and Spring do) read it.
func routeAtkStripParams(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i], _, _ = strings.Cut(s, ";")
	}
	return strings.Join(segs, "/")
}

// TestRouteAttackPathParametersEscapePrefixRule: a path parameter (";x") on a
// segment of a price rule's prefix must not move a request out of its rule
// while the upstream, as servers that drop path parameters read it, serves
// the rule's path: either the spelling is refused (it reads two ways, as
// "..;" is refused) or it is priced by the rule.
func TestRouteAttackPathParametersEscapePrefixRule(t *testing.T) {
	up := &routeAtkSpy{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	s := newStack(t, "", routeAtkGenericYAML(srv.URL))
	const premium = costmodel.NanoUSD(1_000_000_000)

	for _, target := range []string{
		"/u/gen/v1;x/premium/search",
		"/u/gen/v1;/premium",
		"/u/gen/v1%3Bx/premium/search",
	} {
		t.Run(target, func(t *testing.T) {
			got := rawRequest(t, s.url, "GET", target)
			seen := up.take()
			if got.status == http.StatusBadRequest && len(seen) == 0 {
				return // refused: reads one way only
			}
			if got.status != http.StatusOK || len(seen) != 1 {
				t.Fatalf("GET %s: %d %s; reached the upstream %d times", target, got.status, got.body, len(seen))
			}
			served := routeAtkStripParams(seen[0].path)
			id := got.header.Get("X-Request-Id")
			for _, e := range s.entries(t) {
				if e.RequestID != id {
					continue
				}
				if strings.HasPrefix(served, "/api/v1/premium") && e.ActualCost != premium {
					t.Errorf("GET %s reached the upstream as %s (%s without its parameters), the premium rule's path, and was billed %d nano-USD, want %d",
						target, seen[0].path, served, e.ActualCost, premium)
				}
				return
			}
			t.Errorf("GET %s: no ledger entry", target)
		})
	}
}

// TestRouteAttackRepeatedPricedParameter: a priced query parameter or header
// given twice is read two ways: costgate reads the first value, an
// upstream may read the last (PHP, Rails, many routers) or all of them.
// Such a request must be refused, as a priced JSON field given twice is,
// or priced by its largest value; never served at the cheapest.
func TestRouteAttackRepeatedPricedParameter(t *testing.T) {
	up := &routeAtkSpy{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	s := newStack(t, "", routeAtkGenericYAML(srv.URL))
	host := strings.TrimPrefix(s.url, "http://")
	const perUnit = costmodel.NanoUSD(10_000_000)

	cases := []struct {
		name, target, header string
		most                 int64 // the most units a reading of the request asks for
	}{
		{"query given twice", "/u/units/search?q=x&num=1&num=100", "", 100},
		{"query given three times", "/u/units/search?num=1&q=x&num=50&num=100", "", 100},
		{"header given twice", "/u/units/search?q=x", "X-Num: 1\nX-Num: 100\n", 100},
		{"header in two spellings", "/u/units/search?q=x", "X-Num: 1\nx-num: 100\n", 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sendRaw(t, s.url, fmt.Sprintf("GET %s HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\n%sContent-Length: 0\nConnection: close\n\n", c.target, host, c.header))
			seen := up.take()
			if got.status == http.StatusBadRequest && len(seen) == 0 {
				return // refused
			}
			if got.status != http.StatusOK || len(seen) != 1 {
				t.Fatalf("GET %s: %d %s; reached the upstream %d times", c.target, got.status, got.body, len(seen))
			}
			id := got.header.Get("X-Request-Id")
			for _, e := range s.entries(t) {
				if e.RequestID != id {
					continue
				}
				if want := perUnit * costmodel.NanoUSD(c.most); e.ActualCost < want {
					t.Errorf("GET %s (%q) reached the upstream as ?%s %v and was billed %d nano-USD; a reading of it asks for %d units, %d nano-USD",
						c.target, c.header, seen[0].rawQuery, seen[0].header.Values("X-Num"), e.ActualCost, c.most, want)
				}
				return
			}
			t.Errorf("GET %s: no ledger entry", c.target)
		})
	}
}

// TestRouteAttackBodyFraming: the body costgate prices is the body the
// upstream receives, however the client frames it (chunked, chunked with
// trailers, HTTP/1.0, Expect: 100-continue), and an extra request smuggled
// after a short Content-Length is not forwarded as part of it.
func TestRouteAttackBodyFraming(t *testing.T) {
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
	host := strings.TrimPrefix(s.url, "http://")
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n", len(routeAtkChatBody), routeAtkChatBody)
	cases := []struct{ name, req string }{
		{"chunked", fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nTransfer-Encoding: chunked\nConnection: close\n\n%s\r\n", host, chunked)},
		{"chunked with a trailer", fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nTransfer-Encoding: chunked\nTrailer: X-Api-Key\nConnection: close\n\n%sX-Api-Key: cg-test-globex\r\n\r\n", host, chunked)},
		{"HTTP/1.0", fmt.Sprintf("POST /v1/chat/completions HTTP/1.0\nHost: %s\nAuthorization: Bearer cg-test-acme\nContent-Length: %d\n\n%s", host, len(routeAtkChatBody), routeAtkChatBody)},
		{"Expect: 100-continue", fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nExpect: 100-continue\nContent-Length: %d\nConnection: close\n\n%s", host, len(routeAtkChatBody), routeAtkChatBody)},
		{"a second request after the body", fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nContent-Length: %d\n\n%sPOST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", host, len(routeAtkChatBody), routeAtkChatBody)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sendRaw(t, s.url, c.req)
			if got.status != http.StatusOK {
				t.Fatalf("%d %s", got.status, got.body)
			}
			seen := up.take()
			if len(seen) != 1 {
				t.Fatalf("reached the upstream %d times", len(seen))
			}
			var a, b any
			if err := json.Unmarshal([]byte(seen[0].body), &a); err != nil {
				t.Fatalf("the upstream got %q: %v", seen[0].body, err)
			}
			json.Unmarshal([]byte(routeAtkChatBody), &b)
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Errorf("the upstream got %s, want %s", seen[0].body, routeAtkChatBody)
			}
			if v := seen[0].header.Values("X-Api-Key"); len(v) > 0 {
				t.Errorf("the upstream saw the client's x-api-key %q", v)
			}
			if v := seen[0].trailer.Values("X-Api-Key"); len(v) > 0 {
				t.Errorf("the upstream saw the client's x-api-key %q in a trailer", v)
			}
		})
	}
	if n := len(routeAtkEntries(t, s, "globex")); n != 0 {
		t.Errorf("globex was charged %d requests it never sent", n)
	}
}

// TestRouteAttackLongModelNameInALimitKey: the model a limit key is made of is
// the caller's to write, as long as the body allows (8 MiB). A limit keyed
// by model must not let one request put a key of megabytes into the
// shared Redis (every such request a new one, living a window), nor a
// ledger row of that size: a model name longer than any model's is
// refused before it is debited, or reaches the store's keys bounded.
func TestRouteAttackLongModelNameInALimitKey(t *testing.T) {
	rs := redistest.New(t)
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{redisURL: rs.URL, upstream: up, policies: allowAll, extra: `
limits:
  - name: per-model
    dimensions: [tenant, model]
    unit: requests
    rate: 1000
    period: 1h
`})
	model := strings.Repeat("m", 1<<20)
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	req, err := http.NewRequest("POST", s.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	reached := len(up.take())
	t.Logf("a 1 MiB model name: %d %.120s; reached the upstream %d times", resp.StatusCode, b, reached)

	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	keys, err := rdb.Keys(t.Context(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	longest := 0
	for _, k := range keys {
		longest = max(longest, len(k))
	}
	t.Logf("%d keys in Redis, the longest %d bytes", len(keys), longest)
	if longest > 4096 {
		t.Errorf("a request put a key of %d bytes into the limiter's Redis (status %d)", longest, resp.StatusCode)
	}
	for _, e := range routeAtkEntries(t, s, "acme") {
		if len(e.Model) > 4096 {
			t.Errorf("the ledger holds an entry whose model is %d bytes", len(e.Model))
		}
	}
}
