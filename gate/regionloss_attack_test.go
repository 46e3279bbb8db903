package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// regionGate opens a gate of region region on srv (a new private Redis
// when nil) with tenant acme (key cg-acme of user ann, key cg-bob of user
// bob) and one limit, limit (a YAML flow mapping), on the ledger of dsn
// (the embedded one when empty); the gate is closed at the test's end.
func regionGate(t *testing.T, region string, srv *redistest.Server, dsn, limit string) *Gate {
	t.Helper()
	if srv == nil {
		srv = redistest.New(t)
	}
	ledgerYAML := ""
	if dsn != "" {
		ledgerYAML = fmt.Sprintf("ledger: {dsn: %q}\n", dsn)
	}
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
region: %s
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
%stenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}, {id: bob-key, key: cg-bob, user: bob}]}
limits:
  - %s
`, t.TempDir(), region, srv.URL, ledgerYAML, limit))
	t.Cleanup(func() { g.Close() })
	return g
}

// regionCases are limits keyed by the caller and the region (and a model),
// each at a rate that admits ten of groupRequest's requests.
var regionCases = []struct {
	name, dims, unit, rate string
}{
	{"tokens per tenant and region", "[tenant, region]", "tokens", "rate: 50"},
	{"requests per user and region", "[user, region]", "requests", "rate: 10"},
	{"dollars per tenant, region and model", "[tenant, region, model]", "usd", `rate_usd: "0.00001"`},
}

// TestLimitLossAtkRegionLimitsHold: a tenant's (or user's) allowance in
// one region, a limit keyed by the caller and the region, is restored
// when Redis loses its data, counter by counter, as a model limit is.
// Two gates of regions eu and us share one Redis and one PostgreSQL
// ledger (no regions: block); acme spends 4 of 10 in eu and 3 in us,
// Redis loses its data, and us's request finds the loss first: its
// restore brings back both regions' counters (the tenant is marked
// restored for both), and eu is admitted 6 more, us 7; after a second
// loss, none. Before, the limit was not restorable: each region admitted
// 10 more, a whole new window. On the embedded ledger (eu alone), the
// counter comes back at 6 left too. In every algorithm that counts an
// amount.
func TestLimitLossAtkRegionLimitsHold(t *testing.T) {
	for _, c := range regionCases {
		for _, algo := range []string{"fixed_window", "sliding_window", "token_bucket", "gcra"} {
			limit := fmt.Sprintf("{name: regional, dimensions: %s, unit: %s, %s, period: 24h, algorithm: %s}", c.dims, c.unit, c.rate, algo)
			q := groupRequest{key: "cg-acme", model: "gpt-4o"}
			t.Run(c.name+"/"+algo+"/embedded", func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				srv := redistest.New(t)
				eu := regionGate(t, "eu", srv, "", limit)
				if n := spendGroupUntil(t, eu, q, 4, 429); n != 4 {
					t.Fatalf("before the loss: %d admitted of 4", n)
				}
				flushRedis(t, srv)
				if n := spendGroupUntil(t, eu, q, 20, 429); n != 6 {
					t.Fatalf("after Redis lost its data: %d admitted of the 6 requests' worth left of 10", n)
				}
				flushRedis(t, srv)
				if n := spendGroupUntil(t, eu, q, 20, 429); n != 0 {
					t.Fatalf("after Redis lost its data again: %d more admitted, spent", n)
				}
			})
			t.Run(c.name+"/"+algo+"/postgres", func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				srv, dsn := redistest.New(t), pgtest.New(t)
				eu, us := regionGate(t, "eu", srv, dsn, limit), regionGate(t, "us", srv, dsn, limit)
				if n := spendGroupUntil(t, eu, q, 4, 429); n != 4 {
					t.Fatalf("eu before the loss: %d admitted of 4", n)
				}
				if n := spendGroupUntil(t, us, q, 3, 429); n != 3 {
					t.Fatalf("us before the loss: %d admitted of 3", n)
				}
				for _, g := range []*Gate{eu, us} {
					if err := g.ledger.Flush(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				flushRedis(t, srv)
				if n := spendGroupUntil(t, us, q, 20, 429); n != 7 {
					t.Fatalf("us after Redis lost its data: %d admitted of the 7 requests' worth left of 10", n)
				}
				if n := spendGroupUntil(t, eu, q, 20, 429); n != 6 {
					t.Fatalf("eu after Redis lost its data (us found the loss): %d admitted of the 6 requests' worth left of 10", n)
				}
				for _, g := range []*Gate{eu, us} {
					if err := g.ledger.Flush(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				flushRedis(t, srv)
				for _, g := range []*Gate{eu, us} {
					if n := spendGroupUntil(t, g, q, 20, 429); n != 0 {
						t.Fatalf("after Redis lost its data again: %d more admitted, spent", n)
					}
				}
			})
		}
	}
}

// TestLimitLossAtkRegionLimitsRegionsOwnEntries: with regions, each
// region's Redis counts its own requests on a limit keyed by the tenant
// and the region, and a region whose Redis loses its data restores its
// counter from its own entries: eu spends 3 of 10 and us 5; eu loses its
// data and is admitted 7 more (before, 10).
func TestLimitLossAtkRegionLimitsRegionsOwnEntries(t *testing.T) {
	regionsOwnEntriesLoss(t, "limits:\n  - {name: regional, dimensions: [tenant, region], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}\n")
}

// TestLimitLossAtkRegionLimitsOnMemory: on the embedded default (the
// in-memory store), a restart loses the counters; acme's $0.01 an hour in
// region eu, spent, stays spent (before, 10 more admitted).
func TestLimitLossAtkRegionLimitsOnMemory(t *testing.T) {
	before, after := spendAcmeAroundARestart(t, `
region: eu
limits:
  - {name: regional, dimensions: [tenant, region], unit: usd, rate_usd: "0.01", period: 1h, algorithm: sliding_window}
`)
	if before != 10 || after != 0 {
		t.Fatalf("%d admitted before the restart, %d after; want 10 and none", before, after)
	}
}

// TestLimitLossAtkRegionLimitsOnTheFallback: Redis refuses writes and the
// local fallback of one of two replicas (fallback_replicas: 2) takes
// over, restored from the ledger: acme had spent 4 of 10 requests in eu,
// the fallback holds 5 of them and counts 2 spent, and admits 3 (before,
// 5).
func TestLimitLossAtkRegionLimitsOnTheFallback(t *testing.T) {
	fallbackShareLoss(t, "region: eu\n", "{name: regional, dimensions: [tenant, region], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}", groupRequest{model: "gpt-4o"}, "cg-acme")
}

// TestLimitLossAtkRegionLimitsLedgerDown: a region limit's restore while
// the ledger's PostgreSQL is down answers from what this node knows, and
// a fail-closed one never read refuses with 503 until the database
// answers, as a model limit's does (ledgerDownLoss).
func TestLimitLossAtkRegionLimitsLedgerDown(t *testing.T) {
	ledgerDownEveryUnit(t, "region: eu\n", "{name: regional, dimensions: [tenant, region], unit: %s, %s, period: 24h, algorithm: fixed_window, on_store_failure: %s}")
}

// TestLimitLossAtkRegionLimitsRateLimitServiceHits: 60 unpriced hits of
// the rate limit service's eve on 100 requests a day per user and region
// must be recorded and counted after Redis loses its data: 40 left, not
// 100 (before, the limit was not restorable and nothing was recorded).
func TestLimitLossAtkRegionLimitsRateLimitServiceHits(t *testing.T) {
	awayFromWindowEdge(t, 24*time.Hour)
	srv := redistest.New(t)
	g := regionGate(t, "eu", srv, "", "{name: regional-hits, dimensions: [user, region], unit: requests, rate: 100, period: 24h, algorithm: fixed_window}")
	unpricedHitsRestored(t, g, srv)
}
