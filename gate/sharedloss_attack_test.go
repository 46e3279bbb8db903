package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// sharedStores are the stores a limit of the whole deployment is lost
// on: Redis flushed, on the embedded ledger and on PostgreSQL, and the
// embedded default (the in-memory store, the embedded ledger) restarted.
var sharedStores = []string{"redis", "redis+postgres", "memory"}

// sharedGate is a gate with tenants acme (key cg-acme of user ann) and
// beta (key cg-beta) in region eu, and one limit, on store (one of
// sharedStores); lose makes its store lose its data.
type sharedGate struct {
	g    *Gate
	lose func()
}

// openShared opens a sharedGate with limit (a YAML flow mapping); its
// gate is closed at the test's end.
func openShared(t *testing.T, limit, store string) *sharedGate {
	t.Helper()
	dir := t.TempDir()
	var srv *redistest.Server
	storeYAML := ""
	if store != "memory" {
		srv = redistest.New(t)
		storeYAML = fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}\n", srv.URL)
	}
	if store == "redis+postgres" {
		storeYAML += fmt.Sprintf("ledger: {dsn: %q}\n", pgtest.New(t))
	}
	open := func() *Gate {
		return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
region: eu
%stenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
  - {name: beta, plan: small, keys: [{id: beta-key, key: cg-beta}]}
limits:
  - %s
`, dir, storeYAML, limit))
	}
	s := &sharedGate{g: open()}
	t.Cleanup(func() { s.g.Close() })
	s.lose = func() {
		t.Helper()
		if srv != nil {
			flushRedis(t, srv)
			return
		}
		if err := s.g.Close(); err != nil {
			t.Fatal(err)
		}
		s.g = open()
	}
	return s
}

// as is q as the caller of key.
func (q groupRequest) as(key string) groupRequest {
	q.key = key
	return q
}

// sharedAlgorithms are the algorithms whose counters the ledger restores:
// every one but concurrency.
var sharedAlgorithms = []string{"fixed_window", "sliding_window", "token_bucket", "gcra", "sliding_log"}

// sharedCase is a limit with no caller dimension (its dimensions, unit
// and rate) and two requests whose counters differ.
type sharedCase struct {
	name, dims, unit, rate string
	a, b                   groupRequest
}

// sharedCases are limits with no caller dimension, keyed by model, route,
// upstream or region, each at a rate that admits ten of groupRequest's
// requests, with two requests whose counters differ.
var sharedCases = []sharedCase{
	{"tokens per model", "[model]", "tokens", "rate: 50",
		groupRequest{model: "gpt-4o"}, groupRequest{model: "gpt-4o-mini"}},
	{"requests per route", "[route]", "requests", "rate: 10",
		groupRequest{route: "/v1/chat/completions"}, groupRequest{route: "/v1/embeddings"}},
	{"input tokens per upstream", "[upstream]", "input_tokens", "rate: 30",
		groupRequest{upstream: "openai"}, groupRequest{upstream: "azure"}},
	{"output tokens per model and route", "[model, route]", "output_tokens", "rate: 20",
		groupRequest{model: "gpt-4o", route: "/v1/chat/completions"}, groupRequest{model: "gpt-4o", route: "/v1/responses"}},
	{"dollars per model and region", "[model, region]", "usd", `rate_usd: "0.00001"`,
		groupRequest{model: "gpt-4o"}, groupRequest{model: "gpt-4o-mini"}},
}

// checkSharedLoss spends, on s, 4 of a's 10 requests' worth as acme and
// 2 as beta, and 2 of b's as beta; the store then loses its data, and
// the counters must come back at what every tenant's entries counted:
// beta is admitted 4 more on a, acme 8 on b; after a second loss, none.
func checkSharedLoss(t *testing.T, s *sharedGate, a, b groupRequest) {
	t.Helper()
	for _, spend := range []struct {
		q groupRequest
		n int
	}{{a.as("cg-acme"), 4}, {a.as("cg-beta"), 2}, {b.as("cg-beta"), 2}} {
		if n := spendGroupUntil(t, s.g, spend.q, spend.n, 429); n != spend.n {
			t.Fatalf("before the loss: %d admitted of %d on %+v", n, spend.n, spend.q)
		}
	}
	s.lose()
	if n := spendGroupUntil(t, s.g, a.as("cg-beta"), 20, 429); n != 4 {
		t.Fatalf("after the store lost its data: %d admitted of the 4 requests' worth two tenants left of 10 on %+v", n, a)
	}
	if n := spendGroupUntil(t, s.g, b.as("cg-acme"), 20, 429); n != 8 {
		t.Fatalf("after the store lost its data: %d admitted of the 8 requests' worth left of 10 on %+v", n, b)
	}
	s.lose()
	for _, q := range []groupRequest{a.as("cg-acme"), b.as("cg-beta")} {
		if n := spendGroupUntil(t, s.g, q, 20, 429); n > 0 {
			t.Fatalf("after the store lost its data again: %d more admitted on %+v, spent", n, q)
		}
	}
}

// TestLimitLossAtkModelOnlyLimitHolds: a limit keyed by model alone is an
// organization's upstream quota, gpt-4o's tokens a day across every
// tenant. acme spends 4 of its 10 requests' worth and beta 2, beta 2 of
// gpt-4o-mini's, and the store then loses its data (Redis flushed, on
// either ledger; the embedded default restarted): gpt-4o must admit 4
// more, not 10, and gpt-4o-mini 8, in every algorithm that counts an
// amount. Before, such a limit came back empty: the deployment spent
// twice its gpt-4o quota.
func TestLimitLossAtkModelOnlyLimitHolds(t *testing.T) {
	c := sharedCases[0]
	for _, algo := range sharedAlgorithms {
		for _, store := range sharedStores {
			t.Run(algo+"/"+store, func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				s := openShared(t, fmt.Sprintf("{name: org-quota, dimensions: %s, unit: %s, %s, period: 24h, algorithm: %s}",
					c.dims, c.unit, c.rate, algo), store)
				checkSharedLoss(t, s, c.a, c.b)
			})
		}
	}
}

// TestLimitLossAtkRouteOnlyLimitHolds: limits keyed by route, upstream,
// or model and route or region, without the caller, in every unit, hold
// across a loss as one keyed by model alone does (see
// TestLimitLossAtkModelOnlyLimitHolds). Before, they came back empty.
func TestLimitLossAtkRouteOnlyLimitHolds(t *testing.T) {
	checkSharedCases(t, sharedCases[1:])
}

// checkSharedCases runs checkSharedLoss on each of cases, in every
// algorithm of sharedAlgorithms and on every store of sharedStores, each
// a parallel subtest.
func checkSharedCases(t *testing.T, cases []sharedCase) {
	for _, c := range cases {
		for _, algo := range sharedAlgorithms {
			for _, store := range sharedStores {
				t.Run(c.name+"/"+algo+"/"+store, func(t *testing.T) {
					t.Parallel()
					awayFromWindowEdge(t, 24*time.Hour)
					s := openShared(t, fmt.Sprintf("{name: shared, dimensions: %s, unit: %s, %s, period: 24h, algorithm: %s}",
						c.dims, c.unit, c.rate, algo), store)
					checkSharedLoss(t, s, c.a, c.b)
				})
			}
		}
	}
}

// addressCases are limits with no caller dimension keyed by the client
// address or an attribute (alone, or with a model), as sharedCases: an
// address's requests a day across every tenant, a project's tokens.
var addressCases = []sharedCase{
	{"requests per address", "[ip]", "requests", "rate: 10",
		groupRequest{ip: "203.0.113.7"}, groupRequest{ip: "203.0.113.8"}},
	{"tokens per IPv6 /64", "[ip]", "tokens", "rate: 50",
		groupRequest{ip: "2001:db8:1:2::7"}, groupRequest{ip: "2001:db8:1:3::7"}},
	{"tokens per project", "[attr.project]", "tokens", "rate: 50",
		groupRequest{attrs: map[string]string{"project": "apollo"}}, groupRequest{attrs: map[string]string{"project": "gemini"}}},
	{"dollars per project and model", "[attr.project, model]", "usd", `rate_usd: "0.00001"`,
		groupRequest{attrs: map[string]string{"project": "a:b={c}%"}}, groupRequest{attrs: map[string]string{"project": "a:b={c}%"}, model: "gpt-4o-mini"}},
	{"requests per address and job", "[ip, attr.job]", "requests", "rate: 10",
		groupRequest{ip: "198.51.100.1", attrs: map[string]string{"job": "nightly"}}, groupRequest{ip: "198.51.100.1", attrs: map[string]string{"job": "hourly"}}},
}

// TestLimitLossAtkAddressOnlyLimitHolds: a limit keyed by the client
// address or an attribute without the caller is a deployment's abuse
// bound (an address's requests a day, whichever tenant's key it uses) or
// a project's quota across tenants. acme and beta spend 6 of an
// address's 10 requests' worth, beta 2 of another's, and the store then
// loses its data (Redis flushed, on either ledger; the embedded default
// restarted): the first address must admit 4 more, not 10, and the
// second 8, in every algorithm that counts an amount, for an IPv6 /64
// and attribute values a key escapes too. Before, such a limit's keys
// carried no hash tag, so no generation marker told their loss: they
// came back empty, and an address that had spent its day's allowance got
// it again.
func TestLimitLossAtkAddressOnlyLimitHolds(t *testing.T) {
	checkSharedCases(t, addressCases)
}

// TestLimitLossAtkNoDimensionLimitHolds: a limit with no dimension (or
// the region alone) in requests or tokens is the deployment's allowance,
// as one in dollars is its spend cap. acme spends 4 of 10 requests'
// worth and beta 2; after the store loses its data the two tenants
// together are admitted 4, not 10; after a second loss, none.
func TestLimitLossAtkNoDimensionLimitHolds(t *testing.T) {
	for _, u := range unitCases {
		for _, dims := range []string{"[]", "[region]"} {
			for _, algo := range sharedAlgorithms {
				for _, store := range sharedStores {
					t.Run(u.unit+dims+"/"+algo+"/"+store, func(t *testing.T) {
						t.Parallel()
						awayFromWindowEdge(t, 24*time.Hour)
						s := openShared(t, fmt.Sprintf("{name: all, dimensions: %s, unit: %s, rate: %s, period: 24h, algorithm: %s}",
							dims, u.unit, u.rate, algo), store)
						if a, b := spendGroupUntil(t, s.g, groupRequest{key: "cg-acme"}, 4, 429), spendGroupUntil(t, s.g, groupRequest{key: "cg-beta"}, 2, 429); a+b != 6 {
							t.Fatalf("before the loss: %d and %d admitted of 4 and 2", a, b)
						}
						s.lose()
						if n := spendGroupUntil(t, s.g, groupRequest{key: "cg-beta"}, 3, 429) + spendGroupUntil(t, s.g, groupRequest{key: "cg-acme"}, 20, 429); n != 4 {
							t.Fatalf("after the store lost its data: %d admitted of the 4 requests' worth two tenants left of 10", n)
						}
						s.lose()
						if n := spendGroupUntil(t, s.g, groupRequest{key: "cg-beta"}, 20, 429); n > 0 {
							t.Fatalf("after the store lost its data again: %d more admitted of a limit the tenants had spent", n)
						}
					})
				}
			}
		}
	}
}

// TestLimitLossAtkSharedLimitsLedgerDown: the restore of a limit of the
// whole deployment while the ledger's PostgreSQL is down answers from
// what this node knows, as the restore of a caller's limit does. One
// process spends 2 of 10 (acme and beta one each), Redis loses its data
// (the restore reads the ledger), beta spends 2 more with the database
// down (in this node's spool), and Redis loses its data again: the
// restore counts the last read plus the spool, 4, and admits 6. Then
// another process, which never read the counts, takes over with the
// database down again and Redis empty: a fail-closed limit refuses with
// 503 (ErrSpendUnknown) until the database answers, then is restored
// (the 10 spent: none admitted); a fail-open one keeps serving. Before,
// the counter came back empty: 10 admitted after each loss.
func TestLimitLossAtkSharedLimitsLedgerDown(t *testing.T) {
	for _, posture := range []string{"fail_closed", "fail_open"} {
		for _, c := range []struct{ dims, unit, rate, ip string }{
			{"[model]", "tokens", "rate: 50", ""}, {"[]", "requests", "rate: 10", ""}, {"[route]", "usd", `rate_usd: "0.00001"`, ""},
			{"[ip]", "requests", "rate: 10", "203.0.113.7"},
		} {
			t.Run(posture+"/"+c.unit+c.dims, func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				ledgerDownLoss(t, "", fmt.Sprintf("{name: shared, dimensions: %s, unit: %s, %s, period: 24h, algorithm: fixed_window, on_store_failure: %s}", c.dims, c.unit, c.rate, posture), posture,
					groupRequest{key: "cg-acme", ip: c.ip}, groupRequest{key: "cg-beta", ip: c.ip})
			})
		}
	}
}

// TestLimitLossAtkSharedLimitsRegionsOwnEntries: with regions, each
// region's Redis counts its own requests on a limit of the deployment,
// and a region whose Redis loses its data restores its counters from its
// own entries only, as a caller's limit is restored. On one ledger, eu
// spends 3 of 10 (acme 2, globex 1) and us 5; eu loses its data and is
// admitted 7 more, no fewer (the 5 of us are us's to count) and no more
// (before, 10 on gpt-4o; with no dimension, 8: the counter came back at
// the spend of the tenant whose request found the loss).
func TestLimitLossAtkSharedLimitsRegionsOwnEntries(t *testing.T) {
	for _, c := range []struct{ dims, unit, rate string }{
		{"[model]", "requests", "rate: 10"}, {"[]", "tokens", "rate: 50"}, {"[]", "usd", `rate_usd: "0.00001"`},
	} {
		t.Run(c.unit+c.dims, func(t *testing.T) {
			t.Parallel()
			awayFromWindowEdge(t, 24*time.Hour)
			dsn := pgtest.New(t)
			euRedis := redistest.New(t)
			limit := fmt.Sprintf("limits:\n  - {name: shared, dimensions: %s, unit: %s, %s, period: 24h, algorithm: fixed_window}\n", c.dims, c.unit, c.rate)
			region := func(name string, srv *redistest.Server) *Gate {
				return acmeGate(t, dsn, srv, fmt.Sprintf("region: %s\nregions: {names: [eu, us], interval: 1h}\n", name)+limit)
			}
			eu, us := region("eu", euRedis), region("us", redistest.New(t))
			q := groupRequest{key: "cg-acme", model: "gpt-4o"}
			if n := spendGroupUntil(t, eu, q, 2, 429); n != 2 {
				t.Fatalf("eu before the loss: %d admitted of 2", n)
			}
			// A tenant of the rate limit service's, which the config
			// does not list.
			res, d := eu.Reserve(context.Background(), &Request{Caller: eu.Trusted("globex", "", "", "small"), Route: "/x", Upstream: "openai",
				Estimate: costmodel.Estimate{Model: "gpt-4o", Usage: unitUsage, Cost: 1_000}})
			if res == nil {
				t.Fatalf("globex refused in eu: %+v", d)
			}
			if d, ok := res.Record(context.Background()); !ok {
				t.Fatalf("record: %+v", d)
			}
			res.Settle(context.Background(), Charge{Usage: unitUsage, Cost: 1_000, HTTPStatus: 200})
			if n := spendGroupUntil(t, us, q, 5, 429); n != 5 {
				t.Fatalf("us: %d admitted of 5", n)
			}
			if err := us.ledger.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			flushRedis(t, euRedis)
			if n := spendGroupUntil(t, eu, q, 20, 429); n != 7 {
				t.Fatalf("eu after its Redis lost its data: %d admitted of the 7 left of its 10", n)
			}
		})
	}
}

// TestLimitLossAtkSharedLimitsOnTheFallback: Redis refuses writes and the
// local fallback of one of two replicas (fallback_replicas: 2) takes
// over, empty, restored from the ledger before its first decision, each
// counter of a limit of the deployment at its share of what the ledger
// counted: acme and beta had spent 4 of gpt-4o's 10 requests, the
// fallback holds 5 of them and counts 2 spent, and admits 3. Before, it
// came back empty on the fallback, which admitted 5.
func TestLimitLossAtkSharedLimitsOnTheFallback(t *testing.T) {
	fallbackShareLoss(t, "", "{name: model-requests, dimensions: [model], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}", groupRequest{model: "gpt-4o"}, "cg-acme", "cg-beta")
}

// TestLimitLossAtkAddressOnlyLimitsOnTheFallback: a limit keyed by the
// client address, or by an attribute, without the caller is restored on
// the local fallback at its share as one keyed by model alone is (see
// TestLimitLossAtkSharedLimitsOnTheFallback): acme and beta had spent 4
// of an address's (or a project's) 10 requests, the fallback holds 5 and
// admits 3. Before, it came back empty on the fallback, which admitted 5.
func TestLimitLossAtkAddressOnlyLimitsOnTheFallback(t *testing.T) {
	for _, c := range []struct {
		dims string
		q    groupRequest
	}{
		{"[ip]", groupRequest{ip: "203.0.113.7"}},
		{"[attr.project]", groupRequest{attrs: map[string]string{"project": "apollo"}}},
	} {
		t.Run(c.dims, func(t *testing.T) {
			t.Parallel()
			fallbackShareLoss(t, "", "{name: shared, dimensions: "+c.dims+", unit: requests, rate: 10, period: 24h, algorithm: fixed_window}", c.q, "cg-acme", "cg-beta")
		})
	}
}

// TestLimitLossAtkSharedLimitsRateLimitServiceHits: the rate limit
// service records a call that costs nothing when it counts on a limit
// the ledger restores (Reservation.Restorable). A debit of 60 unpriced
// hits of eve on gpt-4o, on a limit of 100 requests a day per model,
// must be recorded and counted after Redis loses its data: 40 hits are
// left, not 100. Before, a limit keyed by model alone was not
// restorable: the service recorded nothing of the hits.
func TestLimitLossAtkSharedLimitsRateLimitServiceHits(t *testing.T) {
	awayFromWindowEdge(t, 24*time.Hour)
	g, srv := groupGate(t, "{name: model-hits, dimensions: [model], unit: requests, rate: 100, period: 24h, algorithm: fixed_window}", false)
	unpricedHitsRestored(t, g, srv)
}
