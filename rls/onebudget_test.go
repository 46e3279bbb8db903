package rls_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/rls"
)

// TestThreeFrontDoorsOneBudget: a tenant's proxied request, its
// reserve/settle call and its Envoy rate limit calls draw on one daily
// budget and land in one ledger: once the budget is spent, each front
// door refuses (402, OVER_LIMIT).
func TestThreeFrontDoorsOneBudget(t *testing.T) {
	ctx := context.Background()
	cfg, err := config.Parse([]byte(`
admin_token: t
data_dir: ` + t.TempDir() + `
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
budgets:
  - {name: daily, plans: [free], amount: "0.05"}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - {key: generic_key, value: search, price_per_hit: "0.01"}
`))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.Open(ctx, cfg, proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	web := httptest.NewServer(srv.Handler())
	t.Cleanup(web.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := rls.New(srv.Gate(), rls.Options{})
	go rs.Serve(ln)
	t.Cleanup(rs.GracefulStop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	envoy := rlsv3.NewRateLimitServiceClient(conn)
	search := func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := envoy.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1,
			Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme", "generic_key", "search")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	reserve := func(usd string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, web.URL+"/v1/costgate/reserve", strings.NewReader(`{"cost":{"usd":"`+usd+`"}}`))
		req.Header.Set("Authorization", "Bearer k-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	// 1. A proxied chat completion, whatever it costs (well under a cent).
	oc := openai.NewClient(option.WithBaseURL(web.URL+"/v1"), option.WithAPIKey("k-acme"), option.WithMaxRetries(0))
	if _, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4o-mini", MaxTokens: openai.Int(16),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}); err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	// 2. Two Envoy search calls ($0.01 each) and a reservation of $0.02.
	for i := range 2 {
		if c := search(); c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("search %d: %v", i, c)
		}
	}
	if c := reserve("0.02"); c != http.StatusOK {
		t.Fatalf("reserve $0.02: %d", c)
	}
	// $0.04 and the chat's cost spent of $0.05: a third search fits only
	// if the chat cost nothing, and a $0.01 reservation does not fit.
	if c := reserve("0.01"); c != http.StatusPaymentRequired {
		t.Errorf("reserve $0.01 past the budget: %d, want 402", c)
	}
	if c := search(); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("search past the budget: %v, want OVER_LIMIT", c)
	}
	if err := srv.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := srv.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]int{}
	for _, e := range page.Entries {
		routes[e.Route]++
	}
	if routes["/v1/chat/completions"] != 1 || routes["/v1/costgate/reserve"] != 1 || routes["rls:edge"] != 2 {
		t.Errorf("ledger routes %v; want the chat, the reservation and two searches", routes)
	}
}
