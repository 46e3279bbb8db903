package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"

	"github.com/costgate/costgate/costmodel"
)

// pathCaseAtkRouter routes as ASP.NET Core and Express do by default: a
// path matches a route in any case (ASP.NET Core compares with
// OrdinalIgnoreCase, each character upper-cased, so that "ſ" is "S"). It
// says in X-Served whether it ran the expensive operation.
func pathCaseAtkRouter(w http.ResponseWriter, r *http.Request) {
	upper := strings.Map(unicode.ToUpper, r.URL.Path)
	served := "cheap"
	if upper == "/API/EXPENSIVE" || strings.HasPrefix(upper, "/API/EXPENSIVE/") {
		served = "expensive"
	}
	w.Header().Set("X-Served", served)
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"ok":true}`))
}

// TestRouteAttackPathCaseEscapesPrefixRule: a generic upstream whose
// routes match in any case (ASP.NET Core's and Express's default) runs
// /EXPENSIVE as /expensive. Its price rule for the prefix /expensive must
// price every spelling the upstream runs as that path: before, a path in
// another case matched no prefix and paid the upstream's default rule
// ($0.001 against $1).
func TestRouteAttackPathCaseEscapesPrefixRule(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(pathCaseAtkRouter))
	t.Cleanup(up.Close)
	s := newStack(t, "", genericYAML(up.URL))
	const expensive = costmodel.NanoUSD(1_000_000_000)
	targets := []string{
		"/u/gen/expensive",
		"/u/gen/EXPENSIVE",
		"/u/gen/Expensive/run",
		"/u/gen/%45xpensive",
		"/u/gen/eXpEnSiVe/",
		"/u/gen/expen%C5%BFive", // ſ, LATIN SMALL LETTER LONG S: upper-cased, S
	}
	ids := map[string]string{} // request id -> target
	for _, target := range targets {
		got := rawRequest(t, s.url, "GET", target)
		if got.status == http.StatusBadRequest {
			continue // refused
		}
		if got.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", target, got.status, got.body)
		}
		if got.header.Get("X-Served") != "expensive" {
			t.Fatalf("GET %s: the upstream served %q; the test expects the expensive operation", target, got.header.Get("X-Served"))
		}
		ids[got.header.Get("X-Request-Id")] = target
	}
	for _, e := range s.entries(t) {
		target, ok := ids[e.RequestID]
		if !ok {
			continue
		}
		delete(ids, e.RequestID)
		if e.EstimatedCost < expensive || e.ActualCost < expensive {
			t.Errorf("GET %s ran /expensive upstream; estimated %s, billed %s, want %s", target, e.EstimatedCost, e.ActualCost, expensive)
		}
	}
	if len(ids) > 0 {
		t.Errorf("no ledger entry for %v", ids)
	}
}

// pathOverrideAtkRouter routes as servers that take the path from a
// front end's rewrite header do (IIS's URL Rewrite and ASP.NET behind it,
// Zend and older Symfony, by X-Original-URL or X-Rewrite-URL, CGI-style
// names included): that header, when sent, names the path run.
func pathOverrideAtkRouter(w http.ResponseWriter, r *http.Request) {
	for k, vs := range r.Header {
		if n := strings.ToUpper(strings.ReplaceAll(k, "-", "_")); (n == "X_ORIGINAL_URL" || n == "X_REWRITE_URL") && len(vs) > 0 {
			r.URL.Path, _, _ = strings.Cut(vs[0], "?")
		}
	}
	pathCaseAtkRouter(w, r)
}

// TestRouteAttackPathOverrideHeader: a header by which an upstream runs
// another path than the request line's (X-Original-URL, X-Rewrite-URL,
// in any case, '_' for '-') would have it run a path costgate did not
// price, under costgate's credential: /u/gen/cheap with X-Original-URL:
// /api/expensive was billed $0.001 for the $1 operation. It is refused,
// as a method override is.
func TestRouteAttackPathOverrideHeader(t *testing.T) {
	up := &routeAtkSpy{next: http.HandlerFunc(pathOverrideAtkRouter)}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	s := newStack(t, "", genericYAML(srv.URL))
	host := strings.TrimPrefix(s.url, "http://")
	const expensive = costmodel.NanoUSD(1_000_000_000)
	for _, h := range []string{"X-Original-URL", "X-Rewrite-URL", "x-original-url", "X_Original_URL", "X_REWRITE_URL"} {
		t.Run(h, func(t *testing.T) {
			got := sendRaw(t, s.url, "GET /u/gen/cheap HTTP/1.1\nHost: "+host+"\nAuthorization: Bearer cg-test-acme\n"+h+
				": /api/expensive\nContent-Length: 0\nConnection: close\n\n")
			seen := up.take()
			if got.status == http.StatusBadRequest && len(seen) == 0 {
				return // refused
			}
			if got.status != http.StatusOK || len(seen) != 1 {
				t.Fatalf("%d %s; reached the upstream %d times", got.status, got.body, len(seen))
			}
			if got.header.Get("X-Served") != "expensive" {
				return // the header did not reach the upstream
			}
			for _, e := range s.entries(t) {
				if e.RequestID == got.header.Get("X-Request-Id") && e.ActualCost < expensive {
					t.Errorf("the upstream ran /expensive by %s; billed %s, want %s", h, e.ActualCost, expensive)
				}
			}
		})
	}
}
