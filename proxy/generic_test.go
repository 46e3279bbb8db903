package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// searchAPI is a metered search upstream: it wants its own key in
// X-Subscription-Token, returns num results (at most 20) and says how many
// in X-Results-Returned.
func searchAPI(t *testing.T, seenClientKey *atomic.Bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Subscription-Token") != "search-upstream-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if strings.Contains(r.Header.Get("Authorization"), "cg-test") || strings.Contains(r.URL.RawQuery, "cg-test") {
			seenClientKey.Store(true)
		}
		if r.URL.Path != "/v2/search" {
			http.NotFound(w, r)
			return
		}
		n, _ := strconv.Atoi(r.URL.Query().Get("num"))
		if n == 0 {
			n = 10
		}
		n = min(n, 20)
		w.Header().Set("X-Results-Returned", strconv.Itoa(n))
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"query": r.URL.Query().Get("q"), "results": make([]int, n)})
	})
}

// TestGenericUpstream: /u/{upstream}/... is priced by its cost rule,
// forwarded with the upstream's credential, settled from the units the
// upstream reports, and stopped by the budget.
func TestGenericUpstream(t *testing.T) {
	var leaked atomic.Bool
	up := httptest.NewServer(searchAPI(t, &leaked))
	t.Cleanup(up.Close)
	s := newStack(t, "", `
  - name: search
    kind: generic
    base_url: `+up.URL+`
    api_key: search-upstream-secret
    auth_header: X-Subscription-Token
    cost:
      unit: results
      per_call: "0.002"
      per_unit: "0.0004"
      units: {query: num, default: 10, max: 100}
      actual: {header: X-Results-Returned}
limits:
  - name: search-calls
    dimensions: [tenant, upstream]
    unit: requests
    rate: 100
    period: 1m
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.05"
`)
	get := func(query string) (int, string) {
		req, _ := http.NewRequest("GET", s.url+"/u/search/v2/search?"+query, nil)
		req.Header.Set("Authorization", "Bearer cg-test-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Asks for 50 results, gets 20: reserved at 50, charged for 20.
	if code, body := get("q=costgate&num=50"); code != 200 || !strings.Contains(body, `"query":"costgate"`) {
		t.Fatalf("search: %d %s", code, body)
	}
	if leaked.Load() {
		t.Fatal("the client's key reached the upstream")
	}
	es := s.entries(t)
	if len(es) != 1 {
		t.Fatalf("ledger has %d entries", len(es))
	}
	e := es[0]
	want := 2*costmodel.Dollar/1000 + 20*4*costmodel.Dollar/10000
	if e.Actual.Units != 20 || e.ActualCost != want || e.EstimatedCost != 2*costmodel.Dollar/1000+50*4*costmodel.Dollar/10000 {
		t.Errorf("entry: units %d actual %v estimated %v; want 20 units at %v", e.Actual.Units, e.ActualCost, e.EstimatedCost, want)
	}
	if e.Route != "/u/search" || e.Upstream != "search" || e.Status != ledger.StatusSettled {
		t.Errorf("entry: %+v", e)
	}

	// An upstream error is not charged.
	if code, _ := get("q=x&num=1"); code != 200 {
		t.Fatalf("second search: %d", code)
	}
	req, _ := http.NewRequest("GET", s.url+"/u/search/v9/missing", nil)
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("missing path: %d", resp.StatusCode)
	}
	var spent costmodel.NanoUSD
	es = s.entries(t)
	for _, e := range es {
		spent += e.ActualCost
		if e.HTTPStatus == 404 && (e.ActualCost != 0 || e.Status != ledger.StatusFailed) {
			t.Errorf("the upstream's 404 was charged: %+v", e)
		}
	}

	// The $0.05 budget runs out: 402.
	var last int
	for range 40 {
		if last, _ = get("q=spend&num=20"); last != 200 {
			break
		}
	}
	if last != http.StatusPaymentRequired {
		t.Fatalf("after spending the budget: %d, want 402", last)
	}
	if err := s.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	spent = 0
	for _, e := range s.entries(t) {
		spent += e.ActualCost
	}
	if spent > 5*costmodel.Dollar/100 {
		t.Errorf("spent %v over a $0.05 budget", spent)
	}

	// An unknown generic upstream is a 404 from costgate.
	if code, body := get("q=x"); code != 402 {
		t.Logf("(budget still spent: %d %s)", code, body)
	}
	req, _ = http.NewRequest("GET", s.url+"/u/nope/v2/search", nil)
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("unknown upstream: %d", resp.StatusCode)
	}
}
