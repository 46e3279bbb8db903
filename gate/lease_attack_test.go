package gate_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// leaseAtkOpen opens n gates on one private Redis, each with tenant acme
// (keys for users alice and bob) and limits, and a store as patient as
// openRedisGate's: a store call timed out is an outage, decided on the
// local fallback, and these tests count decisions of a working store.
func leaseAtkOpen(t *testing.T, n int, limits string) []*gate.Gate {
	t.Helper()
	url := redistest.New(t).URL
	gs := make([]*gate.Gate, n)
	for i := range gs {
		gs[i] = openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
tenants:
  - {name: acme, plan: small, keys: [{id: ka, key: cg-alice, user: alice}, {id: kb, key: cg-bob, user: bob}]}
limits:
%s`, t.TempDir(), url, limits))
	}
	return gs
}

// leaseAtkHammer sends each gate workers goroutines of per requests of
// key's caller at once and returns how many were admitted and the
// refusals' statuses and Retry-Afters.
func leaseAtkHammer(t *testing.T, gs []*gate.Gate, key string, workers, per int) (admitted int64, refusals []gate.Decision) {
	t.Helper()
	ctx := context.Background()
	var n atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, g := range gs {
		for range workers {
			wg.Go(func() {
				for range per {
					req := &gate.Request{Caller: g.Identify(key), Route: "/x"}
					if d, refused := g.Prefilter(req); refused {
						mu.Lock()
						refusals = append(refusals, d)
						mu.Unlock()
						continue
					}
					res, d := g.Reserve(ctx, req)
					if res == nil {
						mu.Lock()
						refusals = append(refusals, d)
						mu.Unlock()
						continue
					}
					n.Add(1)
					res.Settle(ctx, gate.Charge{HTTPStatus: 200})
				}
			})
		}
	}
	wg.Wait()
	return n.Load(), refusals
}

// TestLeaseAttackConcurrentReplicasWindow: three replicas on one Redis,
// four racers each, 1,800 requests against a leased fixed window of 300
// (leases of at most 60): a window admits at most its capacity, as
// strictly, and every refusal is a 429 with a Retry-After.
func TestLeaseAttackConcurrentReplicasWindow(t *testing.T) {
	gs := leaseAtkOpen(t, 3, `  - {name: hot, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 300, period: 24h, lease: {max_share: 0.2, ttl: 1m}}`)
	admitted, refusals := leaseAtkHammer(t, gs, "cg-alice", 4, 150)
	if admitted > 300 {
		t.Fatalf("admitted %d in one window of 300", admitted)
	}
	if admitted < 300-3*60 {
		t.Errorf("admitted only %d of 300 with 1,800 asked", admitted)
	}
	for _, d := range refusals {
		if d.Status != 429 || d.RetryAfter <= 0 {
			t.Fatalf("refusal: %+v", d)
		}
	}
}

// TestLeaseAttackConcurrentReplicasBucket: the same race on a leased token
// bucket of 100 that refills 100 an hour: over the race the replicas
// admit at most the capacity, what refilled meanwhile and R x M (three
// replicas, leases of at most 20).
func TestLeaseAttackConcurrentReplicasBucket(t *testing.T) {
	gs := leaseAtkOpen(t, 3, `  - {name: hot, dimensions: [tenant], unit: requests, algorithm: token_bucket, rate: 100, period: 1h, lease: {max_share: 0.2, ttl: 1m}}`)
	start := time.Now()
	admitted, _ := leaseAtkHammer(t, gs, "cg-alice", 4, 100)
	refill := int64(time.Since(start)*100/time.Hour) + 1
	if bound := 100 + 3*20 + refill; admitted > bound {
		t.Fatalf("admitted %d, bound capacity + R x M + refill = %d", admitted, bound)
	}
}

// TestLeaseAttackPrefilterPerUser: a leased per-user limit spent by
// alice is remembered by the prefilter; bob, another user of the same
// tenant with the same limit, is neither refused by it nor by the store.
func TestLeaseAttackPrefilterPerUser(t *testing.T) {
	ctx := context.Background()
	g := leaseAtkOpen(t, 1, `  - {name: per-user, dimensions: [user], unit: requests, algorithm: fixed_window, rate: 20, period: 24h, lease: {max_share: 0.5, ttl: 1m}}`)[0]
	admitted, refusals := leaseAtkHammer(t, []*gate.Gate{g}, "cg-alice", 1, 40)
	if admitted != 20 || len(refusals) != 20 {
		t.Fatalf("alice: %d admitted, %d refused of 40 against 20", admitted, len(refusals))
	}
	bob := &gate.Request{Caller: g.Identify("cg-bob"), Route: "/x"}
	if d, refused := g.Prefilter(bob); refused {
		t.Fatalf("bob refused by alice's denial: %+v", d)
	}
	if res, d := g.Reserve(ctx, bob); res == nil {
		t.Fatalf("bob refused by the store: %+v", d)
	}
}

// TestLeaseAttackPrefilterAfterRaise: a leased limit spent, its denial
// remembered by the prefilter, then a reload raises the limit: the
// tenant is admitted at once up to the new capacity, not refused until
// the old denial's Retry-After.
func TestLeaseAttackPrefilterAfterRaise(t *testing.T) {
	for _, lease := range []string{"", ", lease: {max_share: 0.5, ttl: 1m}"} {
		t.Run(map[bool]string{true: "strict", false: "leased"}[lease == ""], func(t *testing.T) {
			g := leaseAtkOpen(t, 1, `  - {name: hot, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 10, period: 24h`+lease+`}`)[0]
			if admitted, _ := leaseAtkHammer(t, []*gate.Gate{g}, "cg-alice", 1, 15); admitted != 10 {
				t.Fatalf("admitted %d of 10", admitted)
			}
			if _, refused := g.Prefilter(&gate.Request{Caller: g.Identify("cg-alice"), Route: "/x"}); !refused {
				t.Fatal("the spent limit is not remembered")
			}
			cfg := *g.Config()
			cfg.Limits = slices.Clone(cfg.Limits)
			cfg.Limits[0].Rate = 20
			if err := g.Apply(&cfg); err != nil {
				t.Fatal(err)
			}
			if admitted, _ := leaseAtkHammer(t, []*gate.Gate{g}, "cg-alice", 1, 15); admitted != 10 {
				t.Fatalf("after the limit was raised to 20: admitted %d more, want 10", admitted)
			}
		})
	}
}

// TestLeaseAttackPrefilterRetryAfterOfALargerCost: a token bucket's denial
// of a request of 3 is remembered; a request of 5 that the prefilter
// refuses must get the Retry-After the store gives a request of 5 (when
// 5 have refilled), not the sooner one of 3, after which the client's
// retry is refused again.
func TestLeaseAttackPrefilterRetryAfterOfALargerCost(t *testing.T) {
	ctx := context.Background()
	g := leaseAtkOpen(t, 1, `  - {name: bucket, dimensions: [tenant], unit: requests, algorithm: token_bucket, rate: 10, period: 100s}`)[0]
	c := g.Identify("cg-alice")
	req := func(n int64) *gate.Request { return &gate.Request{Caller: c, Route: "/x", Requests: n} }
	res, d := g.Reserve(ctx, req(10))
	if res == nil {
		t.Fatalf("the full bucket: %+v", d)
	}
	res.Settle(ctx, gate.Charge{HTTPStatus: 200})
	if _, d3 := g.Reserve(ctx, req(3)); d3.Allowed() {
		t.Fatal("3 admitted from an empty bucket")
	}
	pre, refused := g.Prefilter(req(5))
	_, d5 := g.Reserve(ctx, req(5))
	if d5.Allowed() {
		t.Fatal("5 admitted from an empty bucket")
	}
	if refused && pre.RetryAfter < d5.RetryAfter {
		t.Fatalf("the prefilter refused 5 with Retry-After %d s; the store says %d s", pre.RetryAfter, d5.RetryAfter)
	}
}

// TestLeaseAttackLoweredWhileRacing: two replicas race on a leased window
// of 1,000 while both reload it down to 100: once both run the new
// limit the window admits nothing beyond 100 in all, the old leases
// included.
func TestLeaseAttackLoweredWhileRacing(t *testing.T) {
	gs := leaseAtkOpen(t, 2, `  - {name: hot, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 1000, period: 24h, lease: {max_share: 0.1, ttl: 1m}}`)
	first, _ := leaseAtkHammer(t, gs, "cg-alice", 1, 30) // 60 admitted, leases out on both
	if first != 60 {
		t.Fatalf("admitted %d of 60 under 1,000", first)
	}
	var wg sync.WaitGroup
	var during atomic.Int64
	for _, g := range gs {
		wg.Go(func() {
			cfg := *g.Config()
			cfg.Limits = slices.Clone(cfg.Limits)
			cfg.Limits[0].Rate = 100
			if err := g.Apply(&cfg); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Go(func() {
		n, _ := leaseAtkHammer(t, gs, "cg-alice", 2, 40)
		during.Add(n)
	})
	wg.Wait()
	after, _ := leaseAtkHammer(t, gs, "cg-alice", 2, 60)
	// Under the old limit while the reload was on its way a replica may
	// still admit from its old leases (at most M = 100 each); once both
	// run 100, nothing is admitted past 100 in the window.
	if total := first + during.Load() + after; total > max(100, first+during.Load()) {
		t.Fatalf("admitted %d before, %d during, %d after the limit was lowered to 100", first, during.Load(), after)
	}
}

// TestLeaseAttackMixedCosts: three replicas race on a leased fixed window
// of 300 with requests that count for 1 to 40 requests each (a lease may
// hold 30: the large ones go to Redis strictly, the middle ones take the
// rest as a lease of their own): the window admits at most its capacity.
func TestLeaseAttackMixedCosts(t *testing.T) {
	ctx := context.Background()
	gs := leaseAtkOpen(t, 3, `  - {name: hot, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 300, period: 24h, lease: {max_share: 0.1, ttl: 1m}}`)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i, g := range gs {
		for w := range 3 {
			wg.Go(func() {
				for j := range 60 {
					n := int64(1 + (i*7+w*13+j*17)%40)
					res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-alice"), Route: "/x", Requests: n})
					if res == nil {
						if d.Status != 429 {
							t.Errorf("refused with %d: %+v", d.Status, d)
						}
						continue
					}
					admitted.Add(n)
					res.Settle(ctx, gate.Charge{HTTPStatus: 200})
				}
			})
		}
	}
	wg.Wait()
	if admitted.Load() > 300 {
		t.Fatalf("admitted %d requests' worth in one window of 300", admitted.Load())
	}
}

// TestLeaseAttackWindowRollover: two replicas race for three seconds on a
// leased fixed window of 50 a second (leases of at most 10): leases taken
// near a window's end must not be spent in the next one. Each admission
// is counted in the window it was decided in, when it was decided wholly
// within one: none admits more than 50.
func TestLeaseAttackWindowRollover(t *testing.T) {
	ctx := context.Background()
	gs := leaseAtkOpen(t, 2, `  - {name: hot, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 50, period: 1s, lease: {max_share: 0.2, ttl: 1s}}`)
	var mu sync.Mutex
	perWindow, crossing := map[int64]int{}, map[int64]int{}
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for _, g := range gs {
		for range 2 {
			wg.Go(func() {
				for time.Now().Before(end) {
					before := time.Now().Unix()
					res, _ := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-alice"), Route: "/x"})
					after := time.Now().Unix()
					if res == nil {
						continue
					}
					res.Settle(ctx, gate.Charge{HTTPStatus: 200})
					mu.Lock()
					if after == before {
						perWindow[before]++
					} else {
						crossing[after]++
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	for w, n := range perWindow {
		if n > 50 {
			t.Errorf("window %d admitted %d of 50 (and %d decided across its start, %d across its end)", w, n, crossing[w], crossing[w+1])
		}
	}
}
