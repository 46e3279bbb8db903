package gate_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// TestCrowdedAtkOneTenantFloodsTheLimiter: every tenant's debits wait in
// one queue of the Redis store while a script call runs. Tenant acme
// keeps thousands of requests waiting (Redis held for 200 ms): its
// requests beyond what one tenant may keep waiting are refused 429 at
// once, a refusal of its own, and globex's request, which arrives after
// them, is decided. Before, acme's requests all waited in arrival order,
// with every other tenant's behind them (weighted.
// TestBatchFaultAtkOneTenantFloodsTheQueue counts the script calls), and
// those past store.queue_timeout were shed 503 overloaded: the rate limit
// service's UNAVAILABLE, which Envoy lets through unlimited.
func TestCrowdedAtkOneTenantFloodsTheLimiter(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	g := openFailModeGate(t, srv, "max_batch: 2, queue_timeout: 400ms, timeout: 5s", `limits:
  - {name: per-tenant, dimensions: [tenant], unit: requests, rate: 1000000, period: 1h}`)
	acme, globex := g.Identify("cg-acme"), g.Identify("cg-globex")
	for _, c := range []*gate.Caller{acme, globex} { // both tenants' counters are fresh
		if n, _ := admitN(t, g, c, costmodel.Estimate{}, 1); n != 1 {
			t.Fatalf("%s refused", c.Tenant)
		}
	}
	// Redis holds every script call for 200 ms: the first of acme's runs,
	// the others wait.
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", 200, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	const flood = 3000
	var wg sync.WaitGroup
	var mu sync.Mutex
	crowded, undecided := 0, 0
	var started sync.WaitGroup
	started.Add(flood)
	for range flood {
		wg.Go(func() {
			started.Done()
			res, d := g.Reserve(ctx, &gate.Request{Caller: acme, Route: "/v1/chat/completions"})
			if res != nil {
				res.Cancel(ctx)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case d.Undecided:
				undecided++
			case d.Status == http.StatusTooManyRequests && d.Error.Code == "too_many_requests_waiting" && d.RetryAfter > 0:
				crowded++
			default:
				t.Errorf("acme refused: %+v", d)
			}
		})
	}
	started.Wait()
	time.Sleep(100 * time.Millisecond) // acme's requests reach the queue
	res, d := g.Reserve(ctx, &gate.Request{Caller: globex, Route: "/v1/chat/completions"})
	if res == nil || d.Undecided || d.Degraded {
		t.Errorf("globex's request behind acme's flood: %+v", d)
	} else {
		res.Cancel(ctx)
	}
	wg.Wait()
	if crowded == 0 {
		t.Errorf("none of acme's %d requests was refused as its own excess (%d shed as the limiter's overload)", flood, undecided)
	}
	t.Logf("acme: %d refused 429 at once, %d shed 503", crowded, undecided)
}
