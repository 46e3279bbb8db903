package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
)

// A search API client gated by costgate: the Transport reserves the
// results each query asks for (?count=N) and settles the "units_used" the
// API reports, priced by the search upstream's cost rule in costgate's
// configuration ($0.001 a call and $0.0005 a result): each query reserves
// $0.0035 and is charged $0.0025. The tenant's $0.008 daily budget stops
// the third query before it reaches the API.
func ExampleTransport() {
	// A search API that serves at most 3 results and reports them.
	search := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("count"))
		results := make([]string, min(n, 3))
		for i := range results {
			results[i] = fmt.Sprintf("%s result %d", r.URL.Query().Get("q"), i+1)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"results": results, "units_used": len(results)})
	}))
	defer search.Close()

	// costgate, with the search API as a generic upstream.
	cg, err := openCostgate(`
admin_token: example-admin
upstreams:
  - name: search
    kind: generic
    base_url: `+search.URL+`
    cost:
      per_call: "0.001"
      per_unit: "0.0005"
      units: {query: count, default: 10}
      actual: {json: units_used}
tenants:
  - name: acme
    plan: free
    keys:
      - {id: acme-key, key: cg-example-acme}
budgets:
  - {name: acme-daily, scope: tenant, amount: "0.008"}
`, "", "", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cg.Close()

	hc := &http.Client{Transport: &client.Transport{
		Client:   client.New(cg.url, "cg-example-acme"),
		Upstream: "search",
		// Where the request says how many units it asks for, and where
		// the answer says how many it used.
		Rule: costmodel.Rule{
			Units:  &costmodel.Source{Query: "count", Default: 10},
			Actual: &costmodel.Source{JSON: "units_used"},
		},
		Settled: func(_ *http.Request, s *client.Settlement, err error) {
			if err == nil {
				fmt.Println("  charged", s.Cost)
			}
		},
	}}

	for _, q := range []string{"gophers", "limiters", "budgets"} {
		resp, err := hc.Get(search.URL + "/search?q=" + q + "&count=5")
		var refused *client.RefusedError
		if errors.As(err, &refused) {
			fmt.Printf("%s: refused, %s (%s)\n", q, refused.Type, refused.Code)
			continue
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		var page struct{ Results []string }
		json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		fmt.Printf("%s: %d results, first %q\n", q, len(page.Results), page.Results[0])
	}
	// Output:
	//   charged $0.002500000
	// gophers: 3 results, first "gophers result 1"
	//   charged $0.002500000
	// limiters: 3 results, first "limiters result 1"
	// budgets: refused, budget_exceeded (acme-daily)
}

// A batch job that pays per item: each job reserves its largest batch's
// worth, processes its items, and settles what it processed, which
// returns the rest to the tenant's budget; a job that finds no input
// releases its reservation whole.
func ExampleClient_Reserve() {
	cg, err := openCostgate(`
admin_token: example-admin
upstreams:
  - {name: openai, kind: openai, simulate: always}
tenants:
  - name: acme
    plan: free
    keys:
      - {id: acme-key, key: cg-example-acme}
budgets:
  - {name: acme-daily, scope: tenant, amount: "0.50"}
`, "", "", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cg.Close()

	const perItem = 2 * costmodel.Dollar / 1000 // $0.002 an item
	c := client.New(cg.url, "cg-example-acme")
	ctx := context.Background()

	run := func(job string, items []string, most int) {
		r, err := c.Reserve(ctx, client.ReserveRequest{
			Cost:  client.Cost{Requests: 1, USD: costmodel.NanoUSD(most) * perItem},
			Route: "batch.enrich",
			TTL:   30 * time.Minute,
		})
		var refused *client.RefusedError
		if errors.As(err, &refused) {
			fmt.Printf("%s: refused, %s\n", job, refused.Type)
			return
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		n := min(len(items), most) // process items[:n] here
		if n == 0 {
			if err := r.Release(ctx); err != nil {
				fmt.Println(err)
				return
			}
			fmt.Printf("%s: reserved %v, no input: released\n", job, r.Estimate.Cost)
			return
		}
		s, err := r.Settle(ctx, client.Usage{USD: costmodel.NanoUSD(n) * perItem})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: reserved %v, processed %d items, charged %v\n", job, r.Estimate.Cost, n, s.Cost)
	}
	run("job 1", make([]string, 90), 100)
	run("job 2", nil, 100)
	run("job 3", make([]string, 150), 160) // $0.32: all that is left
	run("job 4", make([]string, 20), 20)   // $0.04: $0.02 is left
	// Output:
	// job 1: reserved $0.200000000, processed 90 items, charged $0.180000000
	// job 2: reserved $0.200000000, no input: released
	// job 3: reserved $0.320000000, processed 150 items, charged $0.300000000
	// job 4: refused, budget_exceeded
}
