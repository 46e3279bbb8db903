package rls_test

import (
	"context"
	"fmt"
	"os"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/rls"
)

// A tenant's plan admits 2 requests a minute; Envoy's descriptor
// [tenant=acme] names the tenant. The third request is OVER_LIMIT, with
// the plan's limit, the time until it refills and Retry-After.
func ExampleServer_ShouldRateLimit() {
	dir, _ := os.MkdirTemp("", "rls-example")
	defer os.RemoveAll(dir)
	cfg, err := config.Parse([]byte(`
admin_token: t
data_dir: ` + dir + `
tenants: [{name: acme, plan: free, keys: [{key: k}]}]
limits: [{name: free-requests, plans: [free], dimensions: [tenant], rate: 2, period: 1m}]
rls:
  domains:
    - domain: edge
      descriptors: [{key: tenant, as: tenant}]
`))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	g, err := gate.Open(ctx, cfg, gate.Options{})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	s := rls.New(g, rls.Options{})
	defer s.Close()

	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme")}}
	for range 3 {
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil {
			panic(err)
		}
		st := resp.GetStatuses()[0]
		fmt.Printf("%s %s remaining=%d retry-after=%q\n", resp.GetOverallCode(), st.GetCurrentLimit().GetName(), st.GetLimitRemaining(), headerOf(resp, "Retry-After"))
	}
	// Output:
	// OK free-requests remaining=1 retry-after=""
	// OK free-requests remaining=0 retry-after=""
	// OVER_LIMIT free-requests remaining=0 retry-after="30"
}
