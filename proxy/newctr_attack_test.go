package proxy_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/rls"
)

// TestNewCtrAtkReloadOneOfTwoReplicas: two replicas share one Redis and
// one PostgreSQL ledger; the tenant holds 0.60 of its 1.00 day budget
// through the first one's reserve API, and 8 callers ask each replica for
// 0.60 more. Only the first replica is reloaded with a file that renames
// the budget or makes it monthly (the second still runs the old file).
// Every request must be refused, on both: the first one's new counter
// must count the day's spend, wherever it was recorded.
func TestNewCtrAtkReloadOneOfTwoReplicas(t *testing.T) {
	for _, tc := range reloadAtkMoves[:2] {
		t.Run(tc.name, func(t *testing.T) {
			url, dsn := redistest.New(t).URL, pgtest.New(t)
			a, b := reloadAtkStack(t, url, dsn, "", reloadAtkDaily), reloadAtkStack(t, url, dsn, "", reloadAtkDaily)
			ha, hb := a.srv.Handler(), b.srv.Handler()
			// The second replica reserves, so that the first one's restore
			// needs the other's records.
			if code, out := reserveCall(t, hb, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"usd":"0.60"}}`); code != 200 {
				t.Fatalf("first reserve: %d %v", code, out)
			}
			hm := reloadAtkHammer(t, ha, hb)
			a.reload(t, tc.after)
			if got := hm.halt(t, 200); got > 0 {
				t.Errorf("%d reservations of 0.60 admitted around a reload of one replica (%s), on a budget with 0.60 of 1.00 spent today", got, tc.name)
			}
		})
	}
}

// newCtrAtkRLSYAML is a tenant acme with a $0.05 budget and an RLS
// domain edge whose search descriptor costs $0.01 a hit; budget is the
// budget's YAML flow fields after its amount.
func newCtrAtkRLSYAML(dir, redis, budget string) string {
	return fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q}
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
budgets:
  - {amount: "0.05", %s}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - {key: generic_key, value: search, price_per_hit: "0.01"}
`, dir, redis, budget)
}

// TestNewCtrAtkRLSReload: Envoy's rate limit calls as the caller. acme
// spends its $0.05 day budget in $0.01 searches over gRPC; then 8 callers
// keep searching while a reload renames the budget or makes it monthly.
// Every search after the budget is spent must be OVER_LIMIT (or
// UNAVAILABLE), never OK.
func TestNewCtrAtkRLSReload(t *testing.T) {
	for _, tc := range []struct{ name, after string }{
		{"renamed", "name: daily-usd"},
		{"monthly", "name: daily, period: month"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir, url := t.TempDir(), redistest.New(t).URL
			parse := func(budget string) *config.Config {
				cfg, err := config.Parse([]byte(newCtrAtkRLSYAML(dir, url, budget)))
				if err != nil {
					t.Fatal(err)
				}
				return cfg
			}
			srv, err := proxy.Open(ctx, parse("name: daily"), proxy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			rs := rls.New(srv.Gate(), rls.Options{})
			go rs.Serve(ln)
			t.Cleanup(rs.GracefulStop)
			conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			envoy := rlsv3.NewRateLimitServiceClient(conn)
			search := func() (rlsv3.RateLimitResponse_Code, error) {
				resp, err := envoy.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1,
					Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{
						{Key: "tenant", Value: "acme"}, {Key: "generic_key", Value: "search"}}}}})
				return resp.GetOverallCode(), err
			}
			spent := 0
			for range 10 {
				if c, err := search(); err == nil && c == rlsv3.RateLimitResponse_OK {
					spent++
				}
			}
			if spent != 5 {
				t.Fatalf("spending $0.05 in $0.01 searches: %d admitted", spent)
			}
			var (
				admitted, sent atomic.Int64
				stop           atomic.Bool
				wg             sync.WaitGroup
			)
			for range 8 {
				wg.Go(func() {
					for !stop.Load() {
						sent.Add(1)
						if c, err := search(); err == nil && c == rlsv3.RateLimitResponse_OK {
							admitted.Add(1)
						}
					}
				})
			}
			reloadAtkAwait(t, "the callers running", func() bool { return sent.Load() > 50 })
			srv.SetLoader(func() (*config.Config, error) { return parse(tc.after), nil })
			if err := srv.Reload(); err != nil {
				t.Fatal(err)
			}
			n := sent.Load()
			reloadAtkAwait(t, "the callers after the reload", func() bool { return sent.Load() > n+200 })
			stop.Store(true)
			wg.Wait()
			if got := admitted.Load(); got > 0 {
				t.Errorf("%d searches of $0.01 admitted over RLS around a reload (%s) of a spent $0.05 budget", got, tc.name)
			}
		})
	}
}
