package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/costgate/costgate/costmodel"
)

// Attacks on the pricing of generic upstreams: a tenant that shapes its
// request so that costgate prices it below what the upstream, reading the
// same request, does (or will charge).

// crAtkUpstreams are two generic search upstreams: search, priced by the
// complexity of its query as examples/costrules/search.yaml prices it, and
// guard, priced by the cost rule of examples/search-guard.
func crAtkUpstreams(t *testing.T, base string) string {
	t.Helper()
	guard := crAtkGuardRule(t)
	return `
  - name: search
    kind: generic
    base_url: ` + base + `
    api_key: search-secret
    auth_header: X-Search-Key
    cost:
      unit: complexity points
      per_call: "0.0005"
      per_unit: "0.0001"
      complexity:
        query: {query: q, json: query, header: X-Query}
        page_size: {query: size, json: size, default: 10, max: 100}
        offset: {query: from, json: from}
        page: {query: page}
        filter_prefix: "filter."
  - name: guard
    kind: generic
    base_url: ` + base + `
    api_key: guard-secret
    auth_header: X-Subscription-Token
    cost:
` + guard + `
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 10000
    period: 1m
`
}

// crAtkGuardRule is the cost section of examples/search-guard's upstream,
// as YAML indented under a "cost:" of an upstream list item.
func crAtkGuardRule(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../examples/search-guard/costgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Upstreams []struct {
			Cost yaml.Node `yaml:"cost"`
		} `yaml:"upstreams"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil || len(f.Upstreams) == 0 {
		t.Fatalf("examples/search-guard: %v", err)
	}
	out, err := yaml.Marshal(&f.Upstreams[0].Cost)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	for i, l := range lines {
		lines[i] = "      " + l
	}
	return strings.Join(lines, "\n")
}

// crAtkSearchRule is the search upstream's rule, to price the request as
// the upstream reads it.
var crAtkSearchRule = costmodel.Rule{
	PerCall: 500_000, PerUnit: 100_000,
	Complexity: &costmodel.Complexity{
		Query:       costmodel.Source{Query: "q", JSON: "query", Header: "X-Query"},
		PageSize:    costmodel.Source{Query: "size", JSON: "size", Default: 10, Max: 100},
		Offset:      costmodel.Source{Query: "from", JSON: "from"},
		Page:        costmodel.Source{Query: "page"},
		QueryPrefix: "filter.",
	},
}

// crAtkStack is costgate in front of a search API that answers every
// request with the results it asks for (num, 10 by default, at most 50),
// saying how many in X-Results-Returned, as the simulator does.
func crAtkStack(t *testing.T) (*stack, *routeAtkSpy) {
	t.Helper()
	up := &routeAtkSpy{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := 10
		if v := r.URL.Query().Get("num"); v != "" {
			n, _ = strconv.Atoi(v)
		}
		w.Header().Set("X-Results-Returned", strconv.Itoa(min(max(n, 0), 50)))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"results":%d}`, n)
	})}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	return newStack(t, "", crAtkUpstreams(t, srv.URL)), up
}

// crAtkBilled sends req (raw HTTP/1.1, "\n" line ends, no Host) and returns
// the status and, when it was admitted, the ledger entry's estimated and
// billed cost.
func crAtkBilled(t *testing.T, s *stack, up *routeAtkSpy, req string) (status int, est, billed costmodel.NanoUSD) {
	t.Helper()
	line, rest, _ := strings.Cut(req, "\n")
	host := strings.TrimPrefix(s.url, "http://")
	got := sendRaw(t, s.url, line+"\nHost: "+host+"\nAuthorization: Bearer cg-test-acme\nConnection: close\n"+rest)
	seen := up.take()
	if got.status != http.StatusOK {
		if len(seen) != 0 {
			t.Errorf("%s: answered %d but reached the upstream", line, got.status)
		}
		return got.status, 0, 0
	}
	id := got.header.Get("X-Request-Id")
	for _, e := range s.entries(t) {
		if e.RequestID == id {
			return got.status, e.EstimatedCost, e.ActualCost
		}
	}
	t.Fatalf("%s: no ledger entry", line)
	return 0, 0, 0
}

// crAtkPrice is what crAtkSearchRule charges for a request with query q
// and body.
func crAtkPrice(t *testing.T, q url.Values, h http.Header, body string) costmodel.NanoUSD {
	t.Helper()
	e, err := crAtkSearchRule.Estimate(costmodel.GenericRequest{Method: http.MethodGet, Query: q, Header: h, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	return e.Cost
}

// crAtkRegexes is a query of n regular expressions, each scored 10.
func crAtkRegexes(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "/.*%c.*/ ", 'a'+i%26)
	}
	return strings.TrimSpace(b.String())
}

// TestCostRuleAttackQueryReadTwice: the complexity rule reads the query
// from one place, but the request says it in two, and the upstream may
// read either. A repeated units parameter or header is refused
// (TestRouteAttackRepeatedPricedParameter); a repeated query, or a query
// in both the URL and the body, must be refused or priced at its most
// complex reading, not at the first one.
func TestCostRuleAttackQueryReadTwice(t *testing.T) {
	s, up := crAtkStack(t)
	cheap, costly := "golang", crAtkRegexes(40)
	most := crAtkPrice(t, url.Values{"q": {costly}}, nil, "")
	cases := []struct{ name, req string }{
		{"query parameter twice", "GET /u/search/s?q=" + url.QueryEscape(cheap) + "&q=" + url.QueryEscape(costly) + " HTTP/1.1\nContent-Length: 0\n\n"},
		{"header twice", "GET /u/search/s HTTP/1.1\nX-Query: " + cheap + "\nX-Query: " + costly + "\nContent-Length: 0\n\n"},
		{"json body and query parameter", fmt.Sprintf("POST /u/search/s?q=%s HTTP/1.1\nContent-Type: application/json\nContent-Length: %d\n\n%s",
			url.QueryEscape(costly), len(`{"query":"`+cheap+`"}`), `{"query":"`+cheap+`"}`)},
		{"query parameter and header", "GET /u/search/s?q=" + url.QueryEscape(cheap) + " HTTP/1.1\nX-Query: " + costly + "\nContent-Length: 0\n\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, _, billed := crAtkBilled(t, s, up, c.req)
			if status == http.StatusBadRequest {
				return // refused
			}
			if billed < most {
				t.Errorf("billed %s; its most complex reading (%d regexes) costs %s", billed, 40, most)
			}
		})
	}
}

// TestCostRuleAttackQuerySyntax: the complexity parser must split a query
// where a Lucene-style engine does. Lucene's query parser separates terms
// on the ideographic space U+3000 as on ' ', and reads \" as an escaped
// character of a term, not the start of a phrase; scored otherwise, forty
// regular expressions would be priced as one term.
func TestCostRuleAttackQuerySyntax(t *testing.T) {
	s, up := crAtkStack(t)
	re := crAtkRegexes(40)
	cases := []struct {
		name, q string
		lucene  string // the same query as a Lucene parser splits it
	}{
		{"ideographic space", strings.ReplaceAll(re, " ", "\u3000"), re},
		{"escaped quotes", `\" ` + re + ` \"`, `x ` + re + ` x`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := crAtkPrice(t, url.Values{"q": {c.lucene}}, nil, "")
			status, _, billed := crAtkBilled(t, s, up, "GET /u/search/s?q="+url.QueryEscape(c.q)+" HTTP/1.1\nContent-Length: 0\n\n")
			if status != http.StatusOK {
				t.Fatalf("answered %d", status)
			}
			if billed < want {
				t.Errorf("q=%.40q... billed %s; read as Lucene reads it (%.40q...) it costs %s", c.q, billed, c.lucene, want)
			}
		})
	}
}

// TestCostRuleAttackDeepQueryDSL: a JSON query nested 22 bool clauses
// deep (within Elasticsearch's default of 30) is scored whole, whatever is
// below its 64th JSON level; a query too deep to score is refused.
func TestCostRuleAttackDeepQueryDSL(t *testing.T) {
	s, up := crAtkStack(t)
	var inner strings.Builder
	inner.WriteString(`{"bool":{"should":[`)
	for i := range 100 {
		if i > 0 {
			inner.WriteString(",")
		}
		fmt.Fprintf(&inner, `{"regexp":{"title":".*%c.*"}}`, 'a'+i%26)
	}
	inner.WriteString(`]}}`)
	q := inner.String()
	const levels = 25
	for range levels {
		q = `{"bool":{"must":[` + q + `]}}`
	}
	body := `{"query":` + q + `}`
	// At the least, the 100 regexes: 100 × 10 points.
	want := crAtkSearchRule.PerCall + 100*10*crAtkSearchRule.PerUnit
	status, _, billed := crAtkBilled(t, s, up, fmt.Sprintf("POST /u/search/s HTTP/1.1\nContent-Type: application/json\nContent-Length: %d\n\n%s", len(body), body))
	if status == http.StatusBadRequest {
		return // refused
	}
	if status != http.StatusOK {
		t.Fatalf("answered %d", status)
	}
	if billed < want {
		t.Errorf("a query of 100 regexes under %d bool clauses billed %s; its regexes alone cost %s", levels, billed, want)
	}
}

// TestCostRuleAttackActualRefundsComplexity: a rule that settled complexity
// points from the upstream's result count (X-Results-Returned) would bill
// a query of forty regexes asking for one result one point: a rule may
// not have both, and search-guard's charges the query its complexity.
func TestCostRuleAttackActualRefundsComplexity(t *testing.T) {
	s, up := crAtkStack(t)
	status, est, billed := crAtkBilled(t, s, up, "GET /u/guard/search?num=1&q="+url.QueryEscape(crAtkRegexes(40))+" HTTP/1.1\nContent-Length: 0\n\n")
	if status != http.StatusOK {
		t.Fatalf("answered %d", status)
	}
	if billed < est {
		t.Errorf("estimated %s (forty regexes, one result), billed %s after the upstream returned the one result asked for", est, billed)
	}
}
