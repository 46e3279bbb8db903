package rls_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// sharedLossConfig has descriptor limits that name no tenant, under the
// domain's tag: an address's 10 requests a day and a path's 6 (values
// the request's), of the algorithm %[1]s, beside acme's 10 searches a
// day. An address is often the only thing Envoy's descriptors say of a
// caller: that limit is the one an abuser meets.
const sharedLossConfig = `
admin_token: t
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          rate_limit: {name: per-address, unit: day, requests_per_unit: 10, algorithm: %[1]s}
        - key: path
          rate_limit: {name: per-path, unit: day, requests_per_unit: 6, algorithm: %[1]s}
        - key: tenant
          as: tenant
          descriptors:
            - key: generic_key
              value: search
              rate_limit: {name: search, unit: day, requests_per_unit: 10, algorithm: %[1]s}
`

func address(a string) *commonv3.RateLimitDescriptor { return d("remote_address", a) }

// sharedLossEnv opens sharedLossConfig for algo on Redis, away from the
// end of the day.
func sharedLossEnv(t *testing.T, algo string) *env {
	t.Helper()
	awayFromDayEnd(time.Minute)
	return newEnv(t, fmt.Sprintf(sharedLossConfig, algo), true, rls.Options{})
}

// TestSharedLossAtkAddressAlone: an address spends 6 of its 10 requests
// a day in calls that name no tenant, then Redis loses its data
// (FLUSHALL): 4 are left. Before, nothing recorded such a call, and its
// counter came back empty: 10 more were admitted.
func TestSharedLossAtkAddressAlone(t *testing.T) {
	for _, algo := range descAlgorithms {
		t.Run(algo, func(t *testing.T) {
			e := sharedLossEnv(t, algo)
			for range 6 {
				if r := e.ask(t, "edge", 1, address("198.51.100.7")); r.GetOverallCode() != OK {
					t.Fatalf("a request of the first 6: %s", codes_(r))
				}
			}
			loseRedis(t, e)
			if n := e.admitted(t, func() *commonv3.RateLimitDescriptor { return address("198.51.100.7") }); n != 4 {
				t.Fatalf("after Redis lost its data: %d admitted of the address's 4 left", n)
			}
		})
	}
}

// TestSharedLossAtkBesideATenant: the address's and a path's counters
// counted in calls of acme's (a search, the address and the path in one
// request, hits_addend 2, three times), and one of another address, are
// back after the loss, found by a call that names only the second
// address: the first has 4 left, the path none, the second 9, acme's
// searches 4. Before, the address's and the path's came back empty.
func TestSharedLossAtkBesideATenant(t *testing.T) {
	for _, algo := range descAlgorithms {
		t.Run(algo, func(t *testing.T) {
			e := sharedLossEnv(t, algo)
			for range 3 {
				if r := e.ask(t, "edge", 2, search(), address("198.51.100.7"), d("path", "/v1/search")); r.GetOverallCode() != OK {
					t.Fatalf("acme's request: %s", codes_(r))
				}
			}
			if r := e.ask(t, "edge", 1, address("198.51.100.8")); r.GetOverallCode() != OK {
				t.Fatalf("the second address: %s", codes_(r))
			}
			loseRedis(t, e)
			for _, c := range []struct {
				what string
				desc func() *commonv3.RateLimitDescriptor
				want int
			}{
				{"the second address", func() *commonv3.RateLimitDescriptor { return address("198.51.100.8") }, 9},
				{"the first address", func() *commonv3.RateLimitDescriptor { return address("198.51.100.7") }, 4},
				{"the path", func() *commonv3.RateLimitDescriptor { return d("path", "/v1/search") }, 0},
				{"acme's searches", search, 4},
			} {
				if n := e.admitted(t, c.desc); n != c.want {
					t.Fatalf("after the loss: %d admitted on %s, which had %d left", n, c.what, c.want)
				}
			}
		})
	}
}

// TestSharedLossAtkRestartOnMemory: the embedded default loses every
// counter at a restart; the address's 6 come back from the ledger.
func TestSharedLossAtkRestartOnMemory(t *testing.T) {
	addr := func() *commonv3.RateLimitDescriptor { return address("2001:db8::1") }
	e := restartedAfterSix(t, fmt.Sprintf(sharedLossConfig, "fixed_window"), addr)
	if n := e.admitted(t, addr); n != 4 {
		t.Fatalf("after a restart: %d admitted of the address's 4 left", n)
	}
}

// TestSharedLossAtkTalliedAsTheDomain: what a call counts under the
// domain's tag is in the ledger as the domain's tag's own entries, of no
// cost and no request, never in acme's spend or requests.
func TestSharedLossAtkTalliedAsTheDomain(t *testing.T) {
	e := sharedLossEnv(t, "fixed_window")
	for range 3 {
		if r := e.ask(t, "edge", 1, search(), address("198.51.100.7")); r.GetOverallCode() != OK {
			t.Fatalf("acme's request: %s", codes_(r))
		}
	}
	ctx := context.Background()
	l := e.g.Ledger()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	q := ledger.SpendQuery{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}
	for _, c := range []struct {
		tenant, counter string
	}{{"rls:edge", "{rls:edge}"}, {"acme", "{acme}"}} {
		q.Tenant = c.tenant
		gs, err := l.CountsBy(ctx, q, ledger.GroupBy{Desc: true})
		if err != nil {
			t.Fatal(err)
		}
		var lines, requests int64
		var spent int64
		for _, g := range gs {
			requests += g.Counts.Requests
			spent += int64(g.Charge)
			for _, line := range strings.Split(g.KeyDesc, "\n") {
				if !strings.Contains(line, "\t"+c.counter) {
					t.Errorf("%s's entries name a counter of another tag: %q", c.tenant, line)
				}
				lines++
			}
		}
		if lines == 0 || spent != 0 || requests != 0 {
			t.Errorf("%s: %d counter lines, %d requests, %d spent; want some lines, no request and no spend", c.tenant, lines, requests, spent)
		}
	}
}
