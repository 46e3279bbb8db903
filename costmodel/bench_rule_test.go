package costmodel

import (
	"net/http"
	"net/url"
	"testing"
)

// BenchmarkRuleEstimate prices generic requests from all CPUs at once: a
// rule reading its units from a JSON field, a query parameter and a header
// (the request gives the JSON field and the header), and a search rule
// scoring a query string with a page size and an offset.
//
//	go test -run XXX -bench RuleEstimate -benchmem ./costmodel/
func BenchmarkRuleEstimate(b *testing.B) {
	units := Rule{PerCall: 1000, PerUnit: 10,
		Units: &Source{JSON: "params.num", Query: "num", Header: "X-Results", Default: 10, Max: 100}}
	search := Rule{PerCall: 1000, PerUnit: 10, Complexity: &Complexity{
		Query:    Source{Query: "q", JSON: "query", Header: "X-Query"},
		PageSize: Source{Query: "size", JSON: "size", Default: 10, Max: 100},
		Offset:   Source{Query: "from", JSON: "from"},
		Page:     Source{Query: "page"},
	}}
	header := http.Header{"Content-Type": {"application/json"}, "Accept": {"*/*"}, "User-Agent": {"bench"}, "X-Results": {"20"}}
	cases := []struct {
		name string
		rule Rule
		req  GenericRequest
	}{
		{"units", units, GenericRequest{Method: "POST", Path: "/search", Query: url.Values{"lang": {"en"}}, Header: header,
			Body: []byte(`{"params":{"num":50,"lang":"en","safe":true},"q":"golang AND redis","tags":["a","b","c"]}`)}},
		{"search", search, GenericRequest{Method: "GET", Path: "/search", Header: header,
			Query: url.Values{"q": {"golang AND (redis OR valkey) title:cache* -java"}, "size": {"20"}, "from": {"200"}}}},
		{"search-json", search, GenericRequest{Method: "POST", Path: "/search", Header: header,
			Body: []byte(`{"query":"golang AND (redis OR valkey) title:cache* -java","size":20,"from":200}`)}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if _, err := c.rule.Estimate(c.req); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			start := cpuTime()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.rule.Estimate(c.req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			reportCPU(b, start)
		})
	}
}
