package gate_test

import (
	"context"
	"sync"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// TestSpoiledAtkOneTenantsKeyKeepsTheBreakerClosed: a key of one tenant
// that Redis holds and the script cannot read (a value too short to
// read, a sorted set's key holding a string: written by another program
// or version, or left by a damaged snapshot) fails that tenant's
// requests alone, in a batch and alone. Each failure was counted by the
// circuit breaker as the store's: three of acme's requests in a row
// opened it, and every tenant was decided on the local fallback until
// the cooldown ended (globex Degraded, its limits at a fallback share),
// though Redis answered every call. Only acme's requests are on their
// posture now; the breaker stays closed and globex is decided by Redis.
func TestSpoiledAtkOneTenantsKeyKeepsTheBreakerClosed(t *testing.T) {
	cases := []struct {
		name, limit string
	}{
		{"value too short", "per-tenant"},
		{"log of the wrong type", "per-tenant-log"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.New(t)
			g := openFailModeGate(t, srv, "timeout: 1s, breaker_failures: 3, breaker_cooldown: 1h", `limits:
  - {name: per-tenant, dimensions: [tenant], unit: requests, rate: 1000, period: 1h}
  - {name: per-tenant-log, dimensions: [tenant], unit: requests, algorithm: sliding_log, rate: 1000, period: 1h}`)
			acme, globex := g.Identify("cg-acme"), g.Identify("cg-globex")
			for _, c := range []*gate.Caller{acme, globex} {
				if n, _ := admitN(t, g, c, costmodel.Estimate{}, 1); n != 1 {
					t.Fatalf("%s refused with Redis up", c.Tenant)
				}
			}
			rc := srv.Client(t)
			keys, err := rc.Keys(ctx, "cg:"+tc.limit+":*{acme}*").Result()
			if err != nil || len(keys) != 1 {
				t.Fatalf("acme's %s keys: %q, %v", tc.limit, keys, err)
			}
			// A string of 5 bytes: too short for a meter, of the wrong type for a log.
			if err := rc.Set(ctx, keys[0], "short", 0).Err(); err != nil {
				t.Fatal(err)
			}
			reserve := func(c *gate.Caller) gate.Decision {
				res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/chat/completions"})
				if res != nil {
					res.Cancel(ctx)
				}
				return d
			}
			// acme's requests one at a time (each its script call's
			// only request), then 16 at once (batched with each other).
			for i := range 6 {
				if d := reserve(acme); !d.Degraded {
					t.Fatalf("acme's request %d on its spoiled key: %+v, want its posture (degraded)", i, d)
				}
			}
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() { reserve(acme) })
			}
			wg.Wait()
			for i := range 3 {
				if d := reserve(globex); d.Degraded {
					t.Fatalf("globex's request %d after acme's failed alone: decided on the local fallback: the breaker opened for every tenant", i)
				}
			}
		})
	}
}
