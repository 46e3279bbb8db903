package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/costgate/costgate/dashboard"
)

// The proxy mounts the dashboard on its admin listener under /admin/, with
// a Source that reads its telemetry. The page is public; its data is not.
func ExampleHandler() {
	src := func(ctx context.Context) (dashboard.Data, error) {
		return dashboard.Data{
			GeneratedAt: time.Date(2026, 11, 30, 10, 45, 0, 0, time.UTC),
			Store:       dashboard.StoreHealth{Kind: "memory", Healthy: true, Breaker: "closed"},
			Spend: []dashboard.TenantSeries{{Tenant: "acme", Points: []dashboard.Point{
				{T: time.Date(2026, 11, 30, 10, 44, 0, 0, time.UTC), NanoUSD: 1_250_000_000},
			}}},
		}, nil
	}
	tokens := func() []string { return []string{"cg-demo-admin"} }

	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", dashboard.Handler(tokens, src)))
	admin := httptest.NewServer(mux)
	defer admin.Close()

	page, _ := http.Get(admin.URL + "/admin/")
	fmt.Println("page:", page.StatusCode, page.Header.Get("Content-Type"))

	data, _ := http.Get(admin.URL + "/admin/data.json")
	fmt.Println("data without a token:", data.StatusCode)

	req, _ := http.NewRequest(http.MethodGet, admin.URL+"/admin/data.json", nil)
	req.Header.Set("Authorization", "Bearer cg-demo-admin")
	data, _ = http.DefaultClient.Do(req)
	body, _ := io.ReadAll(data.Body)
	fmt.Println("data with the token:", data.StatusCode)
	fmt.Println(string(body))
	// Output:
	// page: 200 text/html; charset=utf-8
	// data without a token: 401
	// data with the token: 200
	// {"generated_at":"2026-11-30T10:45:00Z","store":{"kind":"memory","healthy":true,"breaker":"closed","fail_open_total":0},"spend":[{"tenant":"acme","points":[{"t":"2026-11-30T10:44:00Z","nano_usd":"1250000000"}]}],"decisions":[],"top_throttled":[],"shadow":[],"budgets":[],"limits":[]}
}
