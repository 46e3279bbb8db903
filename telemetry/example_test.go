package telemetry_test

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/costgate/costgate/telemetry"
)

// The proxy records each request's decision, stage timings, store calls and
// settled usage; the admin API reads the operator views and serves
// MetricsHandler on /metrics.
func Example() {
	ctx := context.Background()
	tm, err := telemetry.New(ctx, telemetry.Config{ServiceName: "costgate"})
	if err != nil {
		panic(err)
	}
	defer tm.Shutdown(ctx)

	ctx, span := tm.Tracer().Start(ctx, "POST /v1/chat/completions")
	tm.Stage(telemetry.StageDebit, 42*time.Microsecond)
	tm.StoreOp(telemetry.StoreDebit, 40*time.Microsecond, nil)
	tm.Decision(ctx, telemetry.Decision{
		Tenant: "acme", Route: "chat", Model: "gpt-4o-mini", Policy: "plans",
		Limit: "requests-per-minute", Dimension: "tenant", Outcome: "hard", Status: 429,
		Key: "rpm:acme",
	})
	span.End()
	tm.Usage("acme", "gpt-4o-mini", 1200, 300, 360_000)

	for _, th := range tm.TopThrottled(10) {
		fmt.Printf("%s %s %d\n", th.Limit, th.Key, th.Count)
	}

	rec := httptest.NewRecorder()
	tm.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "costgate_decisions_blocked_total{") || strings.HasPrefix(line, "costgate_spend_nano_usd_total{") {
			fmt.Println(line)
		}
	}
	// Output:
	// requests-per-minute rpm:acme 1
	// costgate_decisions_blocked_total{dimension="tenant",limit="requests-per-minute",policy="plans",status="429"} 1
	// costgate_spend_nano_usd_total{tenant="acme"} 360000
}
