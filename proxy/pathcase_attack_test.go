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
