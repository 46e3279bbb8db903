package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/proxy"
)

// TestRedisOutage kills Redis under traffic: fail-open limits keep serving
// within the local fallback budget, fail-closed limits answer 503 at once,
// the breaker opens, and when Redis returns costgate uses it again without
// a restart.
func TestRedisOutage(t *testing.T) {
	const timeout = 50 * time.Millisecond
	rs := redistest.New(t)
	s := newStackWith(t, stackOptions{redisURL: rs.URL, store: `
  timeout: 50ms
  breaker_failures: 3
  breaker_cooldown: 200ms
  fallback_replicas: 2`, extra: `
limits:
  - name: acme-requests
    plans: [free]
    dimensions: [tenant]
    unit: requests
    rate: 8
    period: 1h
  - name: globex-requests
    plans: [strict]
    dimensions: [tenant]
    unit: requests
    rate: 1000
    period: 1m
    on_store_failure: fail_closed
`, policies: allowAll})
	type answer struct {
		status   int
		degraded string
		took     time.Duration
	}
	call := func(key string) answer {
		t.Helper()
		req, _ := http.NewRequest("POST", s.url+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":4,"messages":[{"role":"user","content":"ping"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return answer{resp.StatusCode, resp.Header.Get("Costgate-Degraded"), time.Since(start)}
	}

	// Healthy: Redis decides.
	for range 2 {
		if a := call("cg-test-acme"); a.status != 200 || a.degraded != "" {
			t.Fatalf("healthy: %+v", a)
		}
	}
	if a := call("cg-test-globex"); a.status != 200 {
		t.Fatalf("healthy fail-closed tenant: %+v", a)
	}

	rs.Stop(t)

	// Fail-open: served, marked degraded, and bounded by the fallback
	// budget of 8/2 = 4 requests for this replica, whose counter starts
	// at what the ledger counted of acme's requests this hour, divided
	// the same way: the 2 made before the outage, 1. So 3.
	admitted := 0
	for range 12 {
		a := call("cg-test-acme")
		if a.degraded != "fail-open" {
			t.Fatalf("during the outage an answer lacks Costgate-Degraded: %+v", a)
		}
		switch a.status {
		case 200:
			admitted++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("fail-open limit answered %+v", a)
		}
	}
	if admitted != 3 {
		t.Errorf("fail-open admitted %d requests during the outage, want the fallback budget of 4 less the 1 the ledger counts", admitted)
	}

	// Fail-closed: 503 at once.
	var took []time.Duration
	for range 20 {
		a := call("cg-test-globex")
		if a.status != http.StatusServiceUnavailable {
			t.Fatalf("fail-closed limit answered %+v, want 503", a)
		}
		took = append(took, a.took)
	}
	slices.Sort(took)
	t.Logf("fail-closed 503 latency during the outage: p50 %v, max %v (store timeout %v)", took[len(took)/2], took[len(took)-1], timeout)
	// The overhead is a loopback HTTP round trip, on a machine that may
	// be running the rest of the suite: 25 ms was once too little.
	if took[len(took)/2] > timeout+250*time.Millisecond {
		t.Errorf("fail-closed p50 %v, want within the store timeout %v (plus test overhead)", took[len(took)/2], timeout)
	}
	_, metrics := adminDo(t, s.srv.AdminHandler(), "GET", "/metrics", "test-admin")
	if !strings.Contains(metrics, `costgate_store_breaker_state{state="open"} 1`) {
		t.Errorf("the breaker did not open:\n%s", grep(metrics, "breaker"))
	}
	// The Redis store's own counters are observed (their values depend on
	// how the calls failed).
	for _, name := range []string{"costgate_store_overloaded_total", "costgate_store_unknown_outcomes_total", "costgate_store_late_cancels_total", "costgate_store_late_lost_total"} {
		if !strings.Contains(metrics, "\n"+name+" ") {
			t.Errorf("%s is not exposed:\n%s", name, grep(metrics, "costgate_store_"))
		}
	}
	if !strings.Contains(metrics, `costgate_failopen_total{limit="acme-requests"} 12`) {
		t.Errorf("fail-open decisions not counted:\n%s", grep(metrics, "failopen"))
	}

	// Redis returns: costgate recovers by itself.
	rs.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := call("cg-test-globex")
		if a.status == 200 && a.degraded == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("costgate did not recover after Redis returned: %+v", a)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if a := call("cg-test-acme"); a.status != 200 || a.degraded != "" {
		t.Errorf("after recovery: %+v", a)
	}
	_, metrics = adminDo(t, s.srv.AdminHandler(), "GET", "/metrics", "test-admin")
	if !strings.Contains(metrics, `costgate_store_breaker_state{state="closed"} 1`) {
		t.Errorf("the breaker did not close:\n%s", grep(metrics, "breaker"))
	}
}

// TestRedisCluster runs the pipeline on a 3-primary Redis Cluster: a
// tenant's limits share a slot, the per-model limit lives elsewhere, and
// the request limit still holds exactly.
func TestRedisCluster(t *testing.T) {
	c := redistest.NewCluster(t)
	s := newStackWith(t, stackOptions{redisURL: "redis+cluster://" + strings.Join(c.Addrs, ","), policies: allowAll, extra: `
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 3
    period: 1m
  - name: acme-tokens
    dimensions: [tenant, user]
    unit: tokens
    rate: 100000
    period: 1m
  - name: per-model-usd
    dimensions: [model]
    unit: usd
    rate_usd: "100"
    period: 1m
`})
	client := s.client("cg-test-acme")
	served := 0
	for range 6 {
		var resp *http.Response
		_, err := client.Chat.Completions.New(context.Background(), chatParams("cluster", 8), option.WithResponseInto(&resp))
		if err == nil {
			served++
			if resp.Header.Get("Costgate-Degraded") != "" {
				t.Fatal("the cluster store was reported as failing")
			}
		}
	}
	if served != 3 {
		t.Errorf("served %d on the cluster, want the limit of 3", served)
	}
	// Held reservations on the cluster, whose per-model limit lives in
	// another slot than the tenant's limits, so that their ends are
	// claimed apart (SET NX; a
	// claim in the settlement's script call on a cluster is
	// weighted.TestCluster's): each settles once, a second settle is told
	// the first, a release after it is refused.
	h := s.srv.Handler()
	mons := make([]*redistest.Monitor, len(c.Addrs))
	for i, addr := range c.Addrs {
		mons[i] = redistest.NewMonitor(t, addr)
	}
	for _, body := range []string{`{"cost":{"tokens":10},"model":"gpt-4o"}`, `{"cost":{"tokens":10},"model":"gpt-4o-mini"}`} {
		code, r := reserveCall(t, h, "cg-test-globex", "/v1/costgate/reserve", body)
		if code != 200 {
			t.Fatalf("reserve %s on the cluster: %d %v", body, code, r)
		}
		id, _ := r["reservation_id"].(string)
		settle := `{"reservation_id":"` + id + `","usage":{"input_tokens":4}}`
		if code, out := reserveCall(t, h, "cg-test-globex", "/v1/costgate/settle", settle); code != 200 || out["already_settled"] != false {
			t.Fatalf("settle %s on the cluster: %d %v", body, code, out)
		}
		if code, out := reserveCall(t, h, "cg-test-globex", "/v1/costgate/settle", settle); code != 200 || out["already_settled"] != true {
			t.Errorf("second settle %s on the cluster: %d %v", body, code, out)
		}
		if code, out := reserveCall(t, h, "cg-test-globex", "/v1/costgate/release", `{"reservation_id":"`+id+`"}`); code != 409 {
			t.Errorf("release after a settle %s on the cluster: %d %v", body, code, out)
		}
	}
	setnx := 0
	for i, m := range mons {
		m.CaughtUp(t, c.Addrs[i])
		setnx += m.Count(`"set"`, `"nx"`)
	}
	if setnx != 2 {
		t.Errorf("%d claims made apart from their settlement, want 2 (one per reservation over two slots)", setnx)
	}
}

// TestRedisOutageUnderLoad kills Redis while eight clients keep sending
// requests, then brings it back: no request fails, every answer during the
// outage is marked degraded, and the latency of each phase is reported.
// The store's timeouts are the stack's patient ones: a killed Redis
// refuses its connections at once, while a healthy one that answers a
// loaded -race run past a short timeout is an outage by the
// configuration's word, and its answers are degraded.
func TestRedisOutageUnderLoad(t *testing.T) {
	rs := redistest.New(t)
	s := newStackWith(t, stackOptions{redisURL: rs.URL, policies: allowAll, store: `
  timeout: 2s
  queue_timeout: 2s
  breaker_failures: 5
  breaker_cooldown: 100ms`, extra: `
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 1000000
    period: 1m
  - name: acme-tokens
    dimensions: [tenant, user]
    unit: tokens
    rate: 100000000
    period: 1m
`})
	type sample struct {
		phase    int
		status   int
		degraded bool
		took     time.Duration
	}
	var phase atomic.Int32
	results := make(chan sample, 100000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := int(phase.Load())
				req, _ := http.NewRequest("POST", s.url+"/v1/chat/completions",
					strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":4,"messages":[{"role":"user","content":"load"}]}`))
				req.Header.Set("Authorization", "Bearer cg-test-acme")
				start := time.Now()
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					results <- sample{phase: p, status: -1}
					continue
				}
				resp.Body.Close()
				if int(phase.Load()) != p {
					p = -1 // it straddled a phase change: neither one's
				}
				results <- sample{p, resp.StatusCode, resp.Header.Get("Costgate-Degraded") != "", time.Since(start)}
			}
		})
	}
	count := func(p int, n int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for len(results) < n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		_ = p
	}
	count(0, 200)
	phase.Store(1)
	rs.Stop(t)
	count(1, 600)
	phase.Store(2)
	rs.Restart(t)
	// Let the breaker probe and close: a bounded number of requests later.
	count(2, 1400)
	close(stop)
	wg.Wait()
	close(results)

	lat := map[int][]time.Duration{}
	degraded := map[int]int{}
	for r := range results {
		if r.status != 200 {
			t.Errorf("phase %d: a request got %d", r.phase, r.status)
			continue
		}
		if r.phase < 0 {
			continue
		}
		lat[r.phase] = append(lat[r.phase], r.took)
		if r.degraded {
			degraded[r.phase]++
		}
	}
	names := []string{"healthy", "Redis down", "Redis back"}
	for p, name := range names {
		l := lat[p]
		if len(l) == 0 {
			t.Fatalf("no requests in phase %s", name)
		}
		slices.Sort(l)
		t.Logf("%-10s %4d requests, %4d degraded: latency p50 %v, p99 %v, max %v", name, len(l), degraded[p], l[len(l)/2], l[len(l)*99/100], l[len(l)-1])
	}
	if degraded[0] != 0 {
		t.Errorf("%d requests degraded while Redis was healthy", degraded[0])
	}
	// Requests sent before the kill may still have gone to Redis; the
	// later part of the outage must be all degraded.
	if degraded[1] < len(lat[1])/2 {
		t.Errorf("only %d of %d requests during the outage were degraded", degraded[1], len(lat[1]))
	}
	// After Redis returns, the tail of the run is on Redis again.
	tail := lat[2]
	if degraded[2] == len(tail) {
		t.Error("costgate never went back to Redis")
	}
}

// TestBudgetsSurviveARedisRestart: Redis loses every counter, and the
// budgets come back from the ledger instead of starting afresh.
func TestBudgetsSurviveARedisRestart(t *testing.T) {
	rs := redistest.New(t)
	s := newStackWith(t, stackOptions{redisURL: rs.URL, policies: allowAll, extra: roomyLimits + `
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.00005"
`})
	client := s.client("cg-test-acme")
	served := func() int {
		n := 0
		for range 50 {
			if _, err := client.Chat.Completions.New(context.Background(), chatParams("spend it", 16)); err != nil {
				break
			}
			n++
		}
		return n
	}
	first := served()
	if first == 0 {
		t.Fatal("nothing served before the budget ran out")
	}
	// Redis restarts empty: without reconciliation the tenant would get a
	// whole new budget.
	rs.Stop(t)
	rs.Restart(t)
	if err := s.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.srv.Gate().ReconcileBudgets(context.Background()); err != nil {
		t.Fatal(err)
	}
	if again := served(); again > 1 {
		t.Errorf("after Redis lost its counters, %d more requests were served on a spent budget", again)
	}
}

// TestBudgetsHoldAcrossDataLoss: a Redis that loses its data while
// costgate runs (restarted empty, flushed) is noticed by the first request
// that touches the tenant, which is decided on counters restored from the
// ledger, not on fresh ones; and the local fallback during an outage starts
// from the ledger's spend too. No reconciliation is run by hand.
func TestBudgetsHoldAcrossDataLoss(t *testing.T) {
	for _, loss := range []string{"restart", "flushall", "outage"} {
		t.Run(loss, func(t *testing.T) {
			rs := redistest.New(t)
			s := newStackWith(t, stackOptions{redisURL: rs.URL, policies: allowAll, store: `
  timeout: 2s
  queue_timeout: 2s
  breaker_failures: 1
  breaker_cooldown: 1h`, extra: roomyLimits + `
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.00005"
`})
			client := s.client("cg-test-acme")
			served := func() (n int, last error) {
				for range 50 {
					if _, err := client.Chat.Completions.New(context.Background(), chatParams("spend it", 16)); err != nil {
						return n, err
					}
					n++
				}
				return n, nil
			}
			if first, err := served(); first == 0 || err == nil {
				t.Fatalf("served %d before the budget ran out (%v)", first, err)
			}
			if err := s.srv.WaitIdle(context.Background()); err != nil {
				t.Fatal(err)
			}
			switch loss {
			case "restart":
				rs.Stop(t)
				rs.Restart(t)
			case "flushall":
				opt, err := redis.ParseURL(rs.URL)
				if err != nil {
					t.Fatal(err)
				}
				c := redis.NewClient(opt)
				if err := c.FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				c.Close()
			case "outage":
				rs.Stop(t)
			}
			again, err := served()
			var apiErr *openai.Error
			if again > 0 || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusPaymentRequired {
				t.Errorf("after %s, %d more requests were served on a spent budget; then %v", loss, again, err)
			}
			if loss == "outage" && apiErr != nil && apiErr.Response.Header.Get("Costgate-Degraded") != "fail-open" {
				t.Errorf("the refusal during the outage did not come from the fallback: %v", apiErr.Response.Header)
			}
		})
	}
}

// TestBudgetsSurviveARestart: the in-memory store starts empty at every
// start; the budget, daily or monthly, comes back from the embedded ledger.
func TestBudgetsSurviveARestart(t *testing.T) {
	for _, period := range []string{"day", "month"} {
		t.Run(period, func(t *testing.T) { budgetSurvivesARestart(t, period) })
	}
}

func budgetSurvivesARestart(t *testing.T, period string) {
	dir := t.TempDir()
	yaml := `admin_token: x
data_dir: ` + dir + `
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants: [{name: acme, plan: p, keys: [{key: cg-acme}]}]
budgets: [{name: budget, scope: tenant, period: ` + period + `, amount: "0.00005"}]
`
	open := func() (*proxy.Server, *openai.Client) {
		t.Helper()
		cfg, err := config.Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Store.Redis, cfg.Ledger.DSN = "", ""
		srv, err := proxy.Open(context.Background(), cfg, proxy.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv.Handler())
		c := openai.NewClient(option.WithBaseURL(ts.URL+"/v1/"), option.WithAPIKey("cg-acme"), option.WithMaxRetries(0))
		t.Cleanup(ts.Close)
		return srv, &c
	}
	spend := func(c *openai.Client) int {
		n := 0
		for range 50 {
			if _, err := c.Chat.Completions.New(context.Background(), chatParams("spend it", 16)); err != nil {
				break
			}
			n++
		}
		return n
	}
	srv, c := open()
	if spend(c) == 0 {
		t.Fatal("nothing served")
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv, c = open()
	defer srv.Close()
	if again := spend(c); again > 1 {
		t.Errorf("after a restart, %d more requests were served on a spent budget", again)
	}
}
