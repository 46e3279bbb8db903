package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// openFailModeGate opens a gate on srv with store, a YAML flow mapping of
// store knobs besides redis, and two tenants of plan small.
func openFailModeGate(t *testing.T, srv *redistest.Server, store, limits string) *gate.Gate {
	t.Helper()
	return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, %s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
  - {name: globex, plan: small, keys: [{id: globex-key, key: cg-globex}]}
%s`, t.TempDir(), srv.URL, store, limits))
}

// admitN reserves one request at a time for c, settled at its estimate,
// until one is refused or n were admitted, and returns how many were
// admitted and the refusal.
func admitN(t *testing.T, g *gate.Gate, c *gate.Caller, est costmodel.Estimate, n int) (int, gate.Decision) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: est})
		if res == nil {
			return i, d
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, gate.Charge{Usage: est.Usage, Cost: est.Cost, HTTPStatus: http.StatusOK})
	}
	return n, gate.Decision{}
}

// While the limiter store is out, a request answered without a store
// call (a cost no limit can ever admit, found before the call; a caller
// that left before its call was made) tells nothing of the store's
// health. Sent when the breaker half-opens, it must not close the breaker,
// which would start a new outage with a fresh fallback burst for every
// rate limit of every tenant: a fail-open rate limit admits its fallback
// capacity once per outage, however many such requests arrive.
func TestFailModeAttackProbeWithoutStoreCall(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		req  gate.Request
	}{
		{"cost too big", context.Background(), gate.Request{Requests: 1000}},
		{"caller gone", cancelled, gate.Request{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.New(t)
			const cooldown = 50 * time.Millisecond
			g := openFailModeGate(t, srv, "breaker_failures: 2, breaker_cooldown: 50ms", `limits:
  - {name: per-tenant, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 4, period: 1h}`)
			acme, globex := g.Identify("cg-acme"), g.Identify("cg-globex")
			srv.Stop(t)
			for _, c := range []*gate.Caller{acme, globex} {
				if n, d := admitN(t, g, c, costmodel.Estimate{}, 100); n != 4 || d.Status != http.StatusTooManyRequests || !d.Degraded {
					t.Fatalf("%s's fallback burst: %d admitted, then %d (degraded %v); want 4, then a degraded 429", c.Tenant, n, d.Status, d.Degraded)
				}
			}
			extra := map[string]int{}
			for range 3 {
				time.Sleep(cooldown + 10*time.Millisecond) // the breaker half-opens
				req := tc.req
				req.Caller, req.Route = acme, "/v1/chat/completions"
				if res, _ := g.Reserve(tc.ctx, &req); res != nil {
					res.Cancel(context.Background())
				}
				n, _ := admitN(t, g, acme, costmodel.Estimate{}, 100)
				extra["acme"] += n
			}
			extra["globex"], _ = admitN(t, g, globex, costmodel.Estimate{}, 100)
			if extra["acme"] != 0 || extra["globex"] != 0 {
				t.Errorf("during one outage, beyond each tenant's fallback capacity of 4, acme got %d more and globex %d more", extra["acme"], extra["globex"])
			}
		})
	}
}

// A budget spent on the local fallback while Redis refused every call
// (here: out of memory, its data kept) stays spent when Redis answers
// again: the requests after the recovery, the first one too, are decided
// on counters that count what the ledger recorded, whether the outage
// opened the breaker or was too short to (then also after the reconcile
// loop's check of the breaker, every second), and whether the fallback's
// reservation was settled during the outage or after it. A tenant must
// not get its budget once from the fallback and once more from Redis.
func TestFailModeAttackFallbackSpendAfterRecovery(t *testing.T) {
	for _, tc := range []struct {
		name        string
		store       string
		wait        time.Duration // after the recovery
		settleAfter bool          // the fallback's reservation is settled after the recovery
	}{
		{"breaker opened", "breaker_failures: 1, breaker_cooldown: 20ms", 30 * time.Millisecond, false},
		{"breaker stayed closed", "breaker_failures: 5, breaker_cooldown: 20ms", 2500 * time.Millisecond, false},
		{"settled after the recovery", "breaker_failures: 1, breaker_cooldown: 20ms", 30 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.New(t)
			g := openFailModeGate(t, srv, "timeout: 5s, queue_timeout: 5s, "+tc.store, `budgets:
  - {name: daily, scope: tenant, amount: "0.01"}`)
			acme := g.Identify("cg-acme")
			// Redis is up and has counted next to nothing (the tenant's
			// marker is written).
			if n, d := admitN(t, g, acme, costmodel.Estimate{Cost: 1}, 1); n != 1 || d.Status != 0 {
				t.Fatalf("a first request: %d admitted, %+v", n, d)
			}
			rc := srv.Client(t)
			if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
			// Reserved at $0.001 on the fallback, settled at $0.006.
			res, d := g.Reserve(ctx, &gate.Request{Caller: acme, Route: "/v1/chat/completions", Estimate: costmodel.Estimate{Cost: usd("0.001")}})
			if res == nil || !d.Degraded {
				t.Fatalf("during the outage: %+v, want admitted on the fallback", d)
			}
			if d, ok := res.Record(ctx); !ok {
				t.Fatal(d)
			}
			charge := gate.Charge{Cost: usd("0.006"), HTTPStatus: http.StatusOK}
			if !tc.settleAfter {
				res.Settle(ctx, charge)
			}
			if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(tc.wait)
			if tc.settleAfter {
				if n, d := admitN(t, g, acme, costmodel.Estimate{Cost: 1}, 1); n != 1 || d.Degraded {
					t.Fatalf("Redis is back: %d admitted, %+v", n, d)
				}
				res.Settle(ctx, charge)
			}
			res, d = g.Reserve(ctx, &gate.Request{Caller: acme, Route: "/v1/chat/completions", Estimate: costmodel.Estimate{Cost: usd("0.006")}})
			if res != nil {
				res.Cancel(ctx)
				t.Errorf("after the recovery, a budget of $0.01 with $0.006 spent on the fallback admitted $0.006 more (degraded %v)", d.Degraded)
			} else if d.Status != http.StatusPaymentRequired {
				t.Errorf("after the recovery: %d, want 402", d.Status)
			}
		})
	}
}

// A reservation admitted by Redis and settled while Redis refuses every
// call (its data kept) still charges its limits the actual cost: once
// Redis answers again, a tenant that settled far above its estimate
// during the outage finds its budget and its token limit spent, not
// charged the estimate alone.
func TestFailModeAttackSettleDuringOutage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits string
		est    costmodel.Estimate // reserved before the outage, then asked again after
		actual gate.Charge        // the first one's settlement during the outage
		status int                // the answer to the second one
	}{
		{"budget", `budgets:
  - {name: daily, scope: tenant, amount: "0.01"}`,
			costmodel.Estimate{Cost: usd("0.001")}, gate.Charge{Cost: usd("0.009")}, http.StatusPaymentRequired},
		{"token window", `limits:
  - {name: tokens-day, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000, period: 24h}`,
			costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 100}}, gate.Charge{Usage: costmodel.Usage{InputTokens: 900}}, http.StatusTooManyRequests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.New(t)
			g := openFailModeGate(t, srv, "timeout: 5s, queue_timeout: 5s, breaker_failures: 1, breaker_cooldown: 20ms", tc.limits)
			acme := g.Identify("cg-acme")
			res, d := g.Reserve(ctx, &gate.Request{Caller: acme, Route: "/v1/chat/completions", Estimate: tc.est})
			if res == nil || d.Degraded {
				t.Fatalf("before the outage: %+v", d)
			}
			if d, ok := res.Record(ctx); !ok {
				t.Fatal(d)
			}
			rc := srv.Client(t)
			if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
			tc.actual.HTTPStatus = http.StatusOK
			res.Settle(ctx, tc.actual)
			if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(30 * time.Millisecond) // past the cooldown
			// The second request asks for more than is left after the
			// first one's actual cost.
			est := tc.est
			est.Cost, est.Usage.InputTokens = 2*est.Cost, 2*est.Usage.InputTokens
			res, d = g.Reserve(ctx, &gate.Request{Caller: acme, Route: "/v1/chat/completions", Estimate: est})
			if res != nil {
				res.Cancel(ctx)
				t.Errorf("after the outage, a request of twice the first one's estimate was admitted (degraded %v): the actual cost settled during the outage was not charged", d.Degraded)
			} else if d.Status != tc.status {
				t.Errorf("after the outage: %d, want %d", d.Status, tc.status)
			}
		})
	}
}

// Requests that make no store call (a cost no limit can ever admit) do not
// count as the store's successes: however one tenant interleaves them
// with the others' requests, store.breaker_failures calls in a row that
// get no reply open the breaker, and the other tenants' requests then stop
// paying store.timeout each.
func TestFailModeAttackTooBigKeepsBreakerClosed(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	const timeout = 200 * time.Millisecond
	g := openFailModeGate(t, srv, "timeout: 200ms, queue_timeout: 200ms, breaker_failures: 3, breaker_cooldown: 1h", `limits:
  - {name: per-tenant, dimensions: [tenant], unit: requests, rate: 1000, period: 1h}`)
	acme, globex := g.Identify("cg-acme"), g.Identify("cg-globex")
	for _, c := range []*gate.Caller{acme, globex} { // both tenants' counters are fresh
		if n, _ := admitN(t, g, c, costmodel.Estimate{}, 1); n != 1 {
			t.Fatalf("%s refused with Redis up", c.Tenant)
		}
	}
	// Redis takes calls and answers none for a while.
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", 4000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	slow := 0
	for i := range 8 {
		res, d := g.Reserve(ctx, &gate.Request{Caller: acme, Route: "/v1/chat/completions", Requests: 5000})
		// 400 from the store's check, or a degraded 429 from the fallback's.
		if res != nil || d.Status != http.StatusBadRequest && !(d.Status == http.StatusTooManyRequests && d.Degraded) {
			t.Fatalf("a request of 5000 units on a limit of 1000: %+v", d)
		}
		start := time.Now()
		res, d = g.Reserve(ctx, &gate.Request{Caller: globex, Route: "/v1/chat/completions"})
		took := time.Since(start)
		if res == nil || !d.Degraded {
			t.Fatalf("globex's request %d: %+v, want admitted on the fallback", i, d)
		}
		res.Cancel(ctx)
		if took >= timeout {
			slow++
		}
	}
	if slow > 3 {
		t.Errorf("%d of globex's 8 requests waited out store.timeout: the breaker never opened", slow)
	}
}
