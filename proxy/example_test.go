package proxy_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/proxy"
)

// A tenant on a plan of one request a minute, in front of the built-in
// simulator: the first request is served, the second is refused with 429.
func Example() {
	dir, err := os.MkdirTemp("", "costgate-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg, err := config.Parse([]byte(`
admin_token: example-admin
data_dir: ` + dir + `
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants: [{name: acme, plan: free, keys: [{key: cg-acme}]}]
limits: [{name: acme-requests, dimensions: [tenant], rate: 1, period: 1m}]
`))
	if err != nil {
		log.Fatal(err)
	}
	// The in-memory store and the embedded ledger, whatever REDIS_URL and
	// DATABASE_URL say.
	cfg.Store.Redis, cfg.Ledger.DSN = "", ""
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	for range 2 {
		req, _ := http.NewRequest("POST", ts.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer cg-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
	}
	// Output:
	// 200 "acme-requests";q=1;w=60;qu="requests"
	// 429 "acme-requests";q=1;w=60;qu="requests"
}
