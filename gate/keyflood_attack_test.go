package gate

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// redisUsedMemory is INFO's used_memory of c's server, in bytes.
func redisUsedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no used_memory in INFO: %q", info)
	return 0
}

// TestKeyFloodAtkOneTenantFillsRedis: every tenant shares one Redis, run
// as it should be (maxmemory, noeviction), where a full Redis refuses
// every write. acme (plan big) reserves with a job attribute of its own
// choosing, a new one per request, on a limit keyed by it: each makes a
// new counter. Once Redis was full (6,869 jobs, 4 MiB), limiting was
// off, or on, for every other tenant: globex, which had spent 2 of its 5
// requests an hour, was admitted 5 more on the local fallback (7 of 5;
// fail_open) or refused every one with 503 (fail_closed), and so was
// initech, a tenant with no request before. Held: acme is refused its
// 4,097th new job (429 of the limit, by store.max_keys_per_tenant,
// store.max_keys_per_tenant's default) and keeps the jobs it holds, Redis
// stays below maxmemory, and the others are decided by their own limits,
// none of them on the fallback.
func TestKeyFloodAtkOneTenantFillsRedis(t *testing.T) {
	for _, posture := range []string{"fail_open", "fail_closed"} {
		t.Run(posture, func(t *testing.T) {
			awayFromWindowEdge(t, time.Hour)
			ctx := context.Background()
			srv := redistest.New(t)
			rc := srv.Client(t)
			const room = 4 << 20
			if err := rc.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.ConfigSet(ctx, "maxmemory", strconv.FormatInt(redisUsedMemory(t, rc)+room, 10)).Err(); err != nil {
				t.Fatal(err)
			}
			g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
tenants:
  - {name: acme, plan: big, keys: [{id: acme-key, key: cg-acme}]}
  - {name: globex, plan: small, keys: [{id: globex-key, key: cg-globex}]}
  - {name: initech, plan: small, keys: [{id: initech-key, key: cg-initech}]}
limits:
  - {name: per-job, dimensions: [tenant, attr.job], unit: requests, algorithm: fixed_window, rate: 1000, period: 24h, plans: [big]}
  - {name: per-hour, dimensions: [tenant], unit: requests, algorithm: sliding_log, rate: 5, period: 1h, plans: [small], on_store_failure: %s}
`, t.TempDir(), srv.URL, posture))
			t.Cleanup(func() { g.Close() })
			acme, globex, initech := g.Identify("cg-acme"), g.Identify("cg-globex"), g.Identify("cg-initech")
			spend := func(c *Caller, n int) (admitted, degraded int, last Decision) {
				t.Helper()
				for range n {
					res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/v1/chat/completions"})
					if res == nil {
						return admitted, degraded, d
					}
					if d, ok := res.Record(ctx); !ok {
						t.Fatalf("record: %+v", d)
					}
					res.Settle(ctx, Charge{HTTPStatus: http.StatusOK})
					admitted++
					if d.Degraded {
						degraded++
					}
				}
				return admitted, degraded, Decision{}
			}
			if n, _, d := spend(globex, 2); n != 2 {
				t.Fatalf("globex's first 2 requests: %d admitted, then %+v", n, d)
			}

			// The flood: one new job per request, 150 bytes each.
			pad := strings.Repeat("j", 140)
			flood, refusal := 0, Decision{}
			for ; flood < 20000; flood++ {
				res, d := g.Reserve(ctx, &Request{Caller: acme, Route: "/v1/costgate/reserve",
					Attributes: map[string]string{"job": fmt.Sprintf("%s-%06d", pad, flood)}})
				if res == nil {
					refusal = d
					break
				}
				if d.Degraded {
					res.Cancel(ctx)
					refusal = d
					break
				}
				res.Settle(ctx, Charge{HTTPStatus: http.StatusOK})
			}
			used := redisUsedMemory(t, rc)
			t.Logf("acme: %d new jobs admitted, then %d %v (degraded %v); Redis at %d bytes", flood, refusal.Status, refusal.Error, refusal.Degraded, used)
			if refusal.Status != http.StatusTooManyRequests || refusal.Error == nil || refusal.Error.Code != "per-job" || refusal.Error.Policy != keyCapPolicy || refusal.Degraded {
				t.Errorf("acme's flood ended with %d %+v (degraded %v) after %d new jobs; want 429 of per-job by store.max_keys_per_tenant", refusal.Status, refusal.Error, refusal.Degraded, flood)
			}
			if want := 4096; flood != want { // config.DefaultMaxKeysPerTenant
				t.Errorf("acme made %d counters of its jobs; want store.max_keys_per_tenant's %d", flood, want)
			}
			if refusal.Error != nil && !strings.Contains(refusal.Error.Message, `"per-job"`) {
				t.Errorf("the refusal does not name the limit: %q", refusal.Error.Message)
			}
			// acme's own jobs keep working.
			if res, d := g.Reserve(ctx, &Request{Caller: acme, Route: "/v1/costgate/reserve",
				Attributes: map[string]string{"job": fmt.Sprintf("%s-%06d", pad, 7)}}); res == nil {
				t.Errorf("acme's request on a job it holds was refused: %+v", d)
			} else {
				res.Settle(ctx, Charge{HTTPStatus: http.StatusOK})
			}

			n, degraded, d := spend(globex, 20)
			if n != 3 || degraded != 0 || d.Status != http.StatusTooManyRequests || d.Error == nil || d.Error.Code != "per-hour" {
				t.Errorf("globex, 2 of 5 an hour spent before the flood: %d more admitted (%d on the fallback), then %d %+v; want 3, then 429 per-hour", n, degraded, d.Status, d.Error)
			}
			n, degraded, d = spend(initech, 20)
			if n != 5 || degraded != 0 || d.Status != http.StatusTooManyRequests {
				t.Errorf("initech, new: %d admitted (%d on the fallback), then %d %+v; want 5, then 429 per-hour", n, degraded, d.Status, d.Error)
			}
		})
	}
}
