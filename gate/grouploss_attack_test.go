package gate

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// groupGate opens a gate on a private Redis with tenant acme (key cg-acme
// of user ann, key cg-bob of user bob) and one limit, limit (a YAML flow
// mapping), on the embedded ledger or, with pg, on a new PostgreSQL
// database; the gate is closed at the test's end.
func groupGate(t *testing.T, limit string, pg bool) (*Gate, *redistest.Server) {
	t.Helper()
	srv := redistest.New(t)
	ledgerYAML := ""
	if pg {
		ledgerYAML = fmt.Sprintf("ledger: {dsn: %q}\n", pgtest.New(t))
	}
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
%stenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}, {id: bob-key, key: cg-bob, user: bob}]}
limits:
  - %s
`, t.TempDir(), srv.URL, ledgerYAML, limit))
	t.Cleanup(func() { g.Close() })
	return g, srv
}

// groupRequest is a request of unitUsage (and $0.000001) as the caller
// of key, to route and upstream, for model, from client address ip with
// attributes attrs; empty ones are "/x", "openai", "gpt-4o", no address
// and no attributes.
type groupRequest struct {
	key, route, name, upstream, model, ip string
	attrs                                 map[string]string
}

func (q groupRequest) request(g *Gate) *Request {
	if q.route == "" {
		q.route = "/x"
	}
	if q.upstream == "" {
		q.upstream = "openai"
	}
	if q.model == "" {
		q.model = "gpt-4o"
	}
	return &Request{Caller: g.Identify(q.key), Route: q.route, Name: q.name, Upstream: q.upstream, IP: q.ip, Attributes: q.attrs,
		Estimate: costmodel.Estimate{Model: q.model, Usage: unitUsage, Cost: 1_000}}
}

// spendGroupUntil makes up to n of q's requests, each recorded and
// settled at its estimate, until one is refused with status, and returns
// how many were admitted.
func spendGroupUntil(t *testing.T, g *Gate, q groupRequest, n, status int) (admitted int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		res, d := g.Reserve(ctx, q.request(g))
		if res == nil {
			if d.Status != status {
				t.Fatalf("%+v refused with %d: %+v, %+v", q, d.Status, d, d.Error)
			}
			return admitted
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, Charge{Usage: unitUsage, Cost: 1_000, HTTPStatus: 200})
		admitted++
	}
	return admitted
}

// flushRedis makes Redis lose its data.
func flushRedis(t *testing.T, srv *redistest.Server) {
	t.Helper()
	if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// groupCases are limits keyed by the caller and by model, route or
// upstream, each at a rate that admits ten of groupRequest's requests,
// with the two requests whose counters differ only in that value.
var groupCases = []struct {
	name, dims, unit, rate string
	a, b                   groupRequest
}{
	{"tokens per tenant and model", "[tenant, model]", "tokens", "rate: 50",
		groupRequest{key: "cg-acme", model: "gpt-4o"}, groupRequest{key: "cg-acme", model: "gpt-4o-mini"}},
	{"requests per user and model", "[user, model]", "requests", "rate: 10",
		groupRequest{key: "cg-acme", model: "gpt-4o"}, groupRequest{key: "cg-acme", model: "gpt-4o-mini"}},
	{"dollars per tenant and route", "[tenant, route]", "usd", `rate_usd: "0.00001"`,
		groupRequest{key: "cg-acme", route: "/v1/chat/completions"}, groupRequest{key: "cg-acme", route: "/v1/embeddings"}},
	{"input tokens per key and upstream", "[api_key, upstream]", "input_tokens", "rate: 30",
		groupRequest{key: "cg-acme", upstream: "openai"}, groupRequest{key: "cg-acme", upstream: "azure"}},
	{"output tokens per tenant, user, model and route", "[tenant, user, model, route]", "output_tokens", "rate: 20",
		groupRequest{key: "cg-acme", model: "gpt-4o", route: "/v1/chat/completions"}, groupRequest{key: "cg-acme", model: "gpt-4o", route: "/v1/responses"}},
}

// TestLimitLossAtkModelLimitsHold: the most common LLM-gateway limit is a
// tenant's (or user's) tokens, requests or dollars on one model, route or
// upstream. acme spends 4 of 10 requests' worth on one model (route,
// upstream) and 2 on another, bob 3 on the first, and Redis then loses
// its data (FLUSHALL): each counter must come back at what the ledger
// says its requests counted in the window, no more and no less: 6 more
// admitted on the first, 8 on the second (each restored apart), and bob
// 7 when the limit is his own; after a second loss, none. Before, only
// limits keyed by the caller alone were restored, and these came back
// empty: acme spent its day's gpt-4o tokens twice. On the embedded
// ledger and PostgreSQL, in every algorithm that counts an amount.
func TestLimitLossAtkModelLimitsHold(t *testing.T) {
	for _, c := range groupCases {
		for _, algo := range sharedAlgorithms {
			for _, store := range []string{"embedded", "postgres"} {
				t.Run(c.name+"/"+algo+"/"+store, func(t *testing.T) {
					t.Parallel()
					awayFromWindowEdge(t, 24*time.Hour)
					g, srv := groupGate(t, fmt.Sprintf("{name: allowance, dimensions: %s, unit: %s, %s, period: 24h, algorithm: %s}",
						c.dims, c.unit, c.rate, algo), store == "postgres")
					perUser := c.dims == "[user, model]" || c.dims == "[tenant, user, model, route]"
					bob := c.a
					bob.key = "cg-bob"
					if n := spendGroupUntil(t, g, c.a, 4, 429); n != 4 {
						t.Fatalf("before the loss: %d admitted of 4", n)
					}
					if n := spendGroupUntil(t, g, c.b, 2, 429); n != 2 {
						t.Fatalf("before the loss: %d admitted of 2", n)
					}
					if perUser {
						if n := spendGroupUntil(t, g, bob, 3, 429); n != 3 {
							t.Fatalf("bob before the loss: %d admitted of 3", n)
						}
					}
					flushRedis(t, srv)
					if n := spendGroupUntil(t, g, c.a, 20, 429); n != 6 {
						t.Fatalf("after Redis lost its data: %d admitted of the 6 requests' worth left of 10 on %+v", n, c.a)
					}
					if n := spendGroupUntil(t, g, c.b, 20, 429); n != 8 {
						t.Fatalf("after Redis lost its data: %d admitted of the 8 requests' worth left of 10 on %+v", n, c.b)
					}
					if perUser {
						if n := spendGroupUntil(t, g, bob, 20, 429); n != 7 {
							t.Fatalf("bob after Redis lost its data: %d admitted of the 7 requests' worth he had left", n)
						}
					}
					flushRedis(t, srv)
					for _, q := range []groupRequest{c.a, c.b} {
						if n := spendGroupUntil(t, g, q, 20, 429); n > 0 {
							t.Fatalf("after Redis lost its data again: %d more admitted on %+v, spent", n, q)
						}
					}
				})
			}
		}
	}
}

// TestLimitLossAtkModelKeyedAsTheGateNamesIt: a model limit's counter is
// keyed by the canonical name of the model asked for, and the restore
// must count each request on the counter it was debited on, whatever the
// entry's model column says: two requests for a dated alias
// (gpt-4o-2024-08-06) and one spelled GPT-4o count on gpt-4o; a request
// for gpt-4o that a policy downgraded to gpt-4o-mini (the entry records
// the model served, and the upstream's dated name at settlement) was
// debited on gpt-4o and counts there, not on gpt-4o-mini. After the loss
// gpt-4o admits 6 of 10, gpt-4o-mini 10. Before, an entry counted under
// the model it names: the aliases and the downgrade were lost to
// gpt-4o's counter (admitting 10), and the downgrade charged to
// gpt-4o-mini's.
func TestLimitLossAtkModelKeyedAsTheGateNamesIt(t *testing.T) {
	for _, store := range []string{"embedded", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := groupGate(t, "{name: model-tokens, dimensions: [tenant, model], unit: tokens, rate: 50, period: 24h, algorithm: fixed_window}", store == "postgres")
			ctx := context.Background()
			for _, m := range []string{"gpt-4o-2024-08-06", "gpt-4o-2024-08-06", "GPT-4o"} {
				if n := spendGroupUntil(t, g, groupRequest{key: "cg-acme", model: m}, 1, 429); n != 1 {
					t.Fatalf("%s refused before the loss", m)
				}
			}
			res, d := g.Reserve(ctx, groupRequest{key: "cg-acme", model: "gpt-4o"}.request(g))
			if res == nil {
				t.Fatalf("refused: %+v", d)
			}
			res.Applied(`downgrade_model; policy="thrift"`, "gpt-4o-mini")
			if d, ok := res.Record(ctx); !ok {
				t.Fatalf("record: %+v", d)
			}
			res.Settle(ctx, Charge{Usage: unitUsage, Cost: 1_000, HTTPStatus: 200, Model: "gpt-4o-mini-2024-07-18"})
			if err := g.ledger.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if e, ok, err := g.ledger.Lookup(ctx, res.Request().ID); err != nil || !ok || e.Model != "gpt-4o-mini-2024-07-18" {
				t.Fatalf("the downgraded request's entry: %+v, %v, %v; want the model served", e, ok, err)
			}
			flushRedis(t, srv)
			if n := spendGroupUntil(t, g, groupRequest{key: "cg-acme", model: "gpt-4o"}, 20, 429); n != 6 {
				t.Fatalf("after Redis lost its data: gpt-4o admitted %d of the 6 requests' worth left of 10", n)
			}
			if n := spendGroupUntil(t, g, groupRequest{key: "cg-acme", model: "gpt-4o-mini"}, 20, 429); n != 10 {
				t.Fatalf("after Redis lost its data: gpt-4o-mini admitted %d of 10, none debited on it", n)
			}
		})
	}
}

// TestLimitLossAtkRouteKeyedAsTheGateNamesIt: a limit keyed by route
// keys a reserve API request by the API's route (/v1/costgate/reserve),
// whatever name its caller gives it (which the ledger's route column
// records, and the policies see). acme spends 4 of 10 under names of
// its choosing; after the loss it is admitted 6, not 10: a caller that
// named its requests escaped the restore of its route limit.
func TestLimitLossAtkRouteKeyedAsTheGateNamesIt(t *testing.T) {
	for _, store := range []string{"embedded", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := groupGate(t, "{name: route-requests, dimensions: [tenant, route], unit: requests, rate: 10, period: 24h, algorithm: sliding_window}", store == "postgres")
			for i := range 4 {
				q := groupRequest{key: "cg-acme", route: "/v1/costgate/reserve", name: fmt.Sprintf("job-%d", i%2)}
				if n := spendGroupUntil(t, g, q, 1, 429); n != 1 {
					t.Fatalf("refused before the loss")
				}
			}
			flushRedis(t, srv)
			q := groupRequest{key: "cg-acme", route: "/v1/costgate/reserve", name: "job-0"}
			if n := spendGroupUntil(t, g, q, 20, 429); n != 6 {
				t.Fatalf("after Redis lost its data: %d admitted of the 6 requests left of 10 on the reserve API's route", n)
			}
		})
	}
}

// TestLimitLossAtkModelLimitsLedgerDown: a model limit's restore while
// the ledger's PostgreSQL is down answers from what this node knows, as
// the caller-only restore does. One process spends 2 of 10 on gpt-4o,
// Redis loses its data (the restore reads the ledger), acme spends 2 more
// with the database down (in this node's spool), and Redis loses its data
// again: the restore counts the last read plus the spool, 4, and admits 6
// (fail-open or fail-closed alike: the count is known). Then another
// process, which never read acme's counts, takes over with the database
// down again and Redis empty: a fail-closed limit refuses with 503
// (ErrSpendUnknown) until the database answers, then is restored (the 10
// spent: none admitted); a fail-open one keeps serving.
func TestLimitLossAtkModelLimitsLedgerDown(t *testing.T) {
	ledgerDownEveryUnit(t, "", "{name: allowance, dimensions: [tenant, model], unit: %s, %s, period: 24h, algorithm: fixed_window, on_store_failure: %s}")
}

// TestLimitLossAtkModelLimitsRegionsOwnEntries: with regions, each
// region's Redis counts its own requests on a model limit, and a region
// whose Redis loses its data restores its counter from its own entries
// only, as the caller-only restore does. On one ledger, eu spends 3 of
// 10 on gpt-4o and us 5; eu loses its data and is admitted 7 more, no
// fewer (the 5 of us are us's to count) and no more (before, 10).
func TestLimitLossAtkModelLimitsRegionsOwnEntries(t *testing.T) {
	regionsOwnEntriesLoss(t, "limits:\n  - {name: model-requests, dimensions: [tenant, model], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}\n")
}

// regionsOwnEntriesLoss is the scenario of the regions' own entries on
// limit, a configuration's limits section with one limit of 10 requests
// a day keyed by acme (and its model or region): on one ledger, regions
// eu and us, each on its own Redis, spend 3 and 5 of acme's gpt-4o
// requests; eu's Redis loses its data, and eu must admit the 7 left of
// its 10.
func regionsOwnEntriesLoss(t *testing.T, limit string) {
	t.Helper()
	awayFromWindowEdge(t, 24*time.Hour)
	dsn := pgtest.New(t)
	euRedis := redistest.New(t)
	region := func(name string, srv *redistest.Server) *Gate {
		return acmeGate(t, dsn, srv, fmt.Sprintf("region: %s\nregions: {names: [eu, us], interval: 1h}\n", name)+limit)
	}
	eu, us := region("eu", euRedis), region("us", redistest.New(t))
	q := groupRequest{key: "cg-acme", model: "gpt-4o"}
	if n := spendGroupUntil(t, eu, q, 3, 429); n != 3 {
		t.Fatalf("eu before the loss: %d admitted of 3", n)
	}
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
}

// TestLimitLossAtkModelLimitsOnTheFallback: Redis refuses writes and the
// local fallback of one of two replicas (fallback_replicas: 2) takes
// over, empty, restored from the ledger before its first decision, each
// counter at its share of what the ledger counted: acme had spent 4 of
// 10 requests on gpt-4o, the fallback holds 5 of them and counts 2
// spent, and admits 3. Before, a model limit came back empty on the
// fallback, which admitted 5.
func TestLimitLossAtkModelLimitsOnTheFallback(t *testing.T) {
	fallbackShareLoss(t, "", "{name: model-requests, dimensions: [tenant, model], unit: requests, rate: 10, period: 24h, algorithm: fixed_window}", groupRequest{model: "gpt-4o"}, "cg-acme")
}

// TestLimitLossAtkModelLimitsRateLimitServiceHits: the rate limit service
// names its route (rls:DOMAIN), its callers (eve, a user no list holds)
// and its model (here by a dated alias), and records a call in the
// ledger only when it costs money or counts on a limit the ledger
// restores (Reservation.Restorable). A debit of 60 unpriced hits of eve
// on gpt-4o, on a limit of 100 requests a day per user and model, must be
// recorded and counted after Redis loses its data: 40 hits are left, not
// 100. Before, a model limit was not restorable: the service recorded
// nothing of the hits, and eve had her 100 again.
func TestLimitLossAtkModelLimitsRateLimitServiceHits(t *testing.T) {
	awayFromWindowEdge(t, 24*time.Hour)
	g, srv := groupGate(t, "{name: model-hits, dimensions: [user, model], unit: requests, rate: 100, period: 24h, algorithm: fixed_window}", false)
	unpricedHitsRestored(t, g, srv)
}

// fallbackShareLoss opens a gate of two replicas' fallback
// (fallback_replicas: 2) on a private Redis, configured with top
// (top-level YAML lines, or none), tenants acme and beta, and limit (a
// YAML flow mapping of 10 of groupRequest's requests) as its one limit;
// spends 4 of q's requests, split evenly among keys; then requires the
// fallback, restored from the ledger at its share (2 of its 5 spent), to
// admit 3 (spendOnTheFallback, as acme).
func fallbackShareLoss(t *testing.T, top, limit string, q groupRequest, keys ...string) {
	t.Helper()
	awayFromWindowEdge(t, 24*time.Hour)
	srv := redistest.New(t)
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
%sstore: {redis: %q, fallback_replicas: 2, timeout: 5s, queue_timeout: 5s, breaker_failures: 1, breaker_cooldown: 1m}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
  - {name: beta, plan: small, keys: [{id: beta-key, key: cg-beta}]}
limits:
  - %s
`, t.TempDir(), top, srv.URL, limit))
	t.Cleanup(func() { g.Close() })
	q = q.as("cg-acme")
	n := 0
	for _, k := range keys {
		n += spendGroupUntil(t, g, q.as(k), 4/len(keys), 429)
	}
	if n != 4 {
		t.Fatalf("before the outage: %d admitted of 4", n)
	}
	if admitted := spendOnTheFallback(t, g, srv, q); admitted != 3 {
		t.Fatalf("on the fallback: %d admitted of the 3 left of its 5 (4 of 10 spent, halved)", admitted)
	}
}

// spendOnTheFallback makes srv refuse writes (maxmemory 1), so that g
// decides on its local fallback, and spends q there, recording and
// settling each admitted request at $0.000001, until a 429 (at most 20);
// it returns how many were admitted, each required to be degraded.
func spendOnTheFallback(t *testing.T, g *Gate, srv *redistest.Server, q groupRequest) int {
	t.Helper()
	ctx := context.Background()
	rc := srv.Client(t)
	if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.ConfigSet(context.Background(), "maxmemory", "0") })
	admitted := 0
	for range 20 {
		res, d := g.Reserve(ctx, q.request(g))
		if res == nil {
			if d.Status != http.StatusTooManyRequests {
				t.Fatalf("refused with %d: %+v", d.Status, d)
			}
			break
		}
		if !d.Degraded {
			t.Fatalf("admitted by Redis, which refuses writes: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, Charge{Usage: unitUsage, Cost: 1_000, HTTPStatus: 200})
		admitted++
	}
	return admitted
}

// unpricedHitsRestored debits 60 unpriced hits of eve (a rate limit
// service's caller) on gpt-4o by a dated alias, on g whose one limit of
// 100 requests a day is keyed by the model, requires them restorable,
// records and settles them, flushes srv, and requires that 41 hits are
// then refused and the 40 left admitted.
func unpricedHitsRestored(t *testing.T, g *Gate, srv *redistest.Server) {
	t.Helper()
	ctx := context.Background()
	hits := func(n int64) (*Reservation, Decision) {
		return g.Reserve(ctx, &Request{Caller: g.Trusted("acme", "eve", "", "small"), Route: "rls:llm", Requests: n,
			Estimate: costmodel.Estimate{Model: "gpt-4o-2024-08-06"}})
	}
	res, d := hits(60)
	if res == nil {
		t.Fatalf("60 hits refused: %+v", d)
	}
	ch := Charge{HTTPStatus: 200}
	if !res.Restorable(ch) {
		t.Fatalf("60 unpriced hits on a model limit: not restorable, so the rate limit service records none of them")
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatalf("record: %+v", d)
	}
	res.Settle(ctx, ch)
	flushRedis(t, srv)
	if res, d := hits(41); res != nil || d.Status != http.StatusTooManyRequests {
		t.Fatalf("after Redis lost its data, 41 hits of the 40 left: admitted %v, status %d; want a 429", res != nil, d.Status)
	}
	res, d = hits(40)
	if res == nil {
		t.Fatalf("after Redis lost its data, the 40 hits left refused: %+v", d)
	}
	res.Settle(ctx, ch)
}

// ledgerDownEveryUnit runs ledgerDownLoss, acme's gpt-4o requests as a
// and b, fail-closed and fail-open, on the limit of format limit (its
// unit, its rate and its on_store_failure, in that order) in dollars,
// requests and tokens, each a subtest.
func ledgerDownEveryUnit(t *testing.T, top, limit string) {
	for _, posture := range []string{"fail_closed", "fail_open"} {
		for _, u := range []struct{ unit, rate string }{
			{"usd", `rate_usd: "0.00001"`}, {"requests", "rate: 10"}, {"tokens", "rate: 50"},
		} {
			t.Run(posture+"/"+u.unit, func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				q := groupRequest{key: "cg-acme", model: "gpt-4o"}
				ledgerDownLoss(t, top, fmt.Sprintf(limit, u.unit, u.rate, posture), posture, q, q)
			})
		}
	}
}

// ledgerDownLoss runs the ledger-down scenario of a restorable limit of
// 10 a day (posture its on_store_failure, limit), with requests a and b
// of one unit each: a and b spend 1
// each, Redis loses its data and a spends 1, the database goes down and
// b spends 1, Redis loses its data again and b is admitted the 6 left
// (4 read and spooled); then another gate, which never read the counts,
// takes over with the database down and Redis empty: fail-closed, a is
// refused 503 until the database answers, then nothing is left;
// fail-open, a is served.
//
// Each gate is configured with top (top-level YAML lines, such as
// "region: eu\n", or none), tenants acme (key cg-acme of user ann) and
// beta (key cg-beta), and limit (a YAML flow mapping) as its one limit,
// on a private Redis and a private PostgreSQL ledger.
func ledgerDownLoss(t *testing.T, top, limit, posture string, a, b groupRequest) {
	t.Helper()
	ctx := context.Background()
	srv, pg := redistest.New(t), pgtest.NewPrivate(t)
	open := func() *Gate {
		return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
%sstore: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
  - {name: beta, plan: small, keys: [{id: beta-key, key: cg-beta}]}
limits:
  - %s
`, t.TempDir(), top, srv.URL, pg.URL(), limit))
	}
	g := open()
	if n := spendGroupUntil(t, g, a, 1, 429) + spendGroupUntil(t, g, b, 1, 429); n != 2 {
		t.Fatalf("before the loss: %d admitted of 2", n)
	}
	flushRedis(t, srv)
	if n := spendGroupUntil(t, g, a, 1, 429); n != 1 {
		t.Fatalf("after the first loss: %d admitted of 1", n)
	}
	pg.Stop()
	if n := spendGroupUntil(t, g, b, 1, 429); n != 1 {
		t.Fatalf("the database down: %d admitted of 1", n)
	}
	flushRedis(t, srv)
	if n := spendGroupUntil(t, g, b, 20, 429); n != 6 {
		t.Fatalf("the database down, after the second loss: %d admitted of the 6 left of 10 (4 read and spooled)", n)
	}
	// The database back long enough for this process's records
	// to reach it, then down again for the next process.
	pg.Start()
	if err := g.ledger.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	g = open()
	t.Cleanup(func() { g.Close() })
	pg.Stop()
	flushRedis(t, srv)
	res, d := g.Reserve(ctx, a.request(g))
	if posture == "fail_open" {
		if res == nil {
			t.Fatalf("fail-open, the ledger down: refused with %d", d.Status)
		}
		res.Cancel(ctx)
		return
	}
	if res != nil || d.Status != http.StatusServiceUnavailable {
		t.Fatalf("fail-closed, the ledger down and the count unknown: admitted %v, status %d; want 503", res != nil, d.Status)
	}
	pg.Start()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		check := a.request(g)
		check.Check = true
		res, d := g.Reserve(ctx, check)
		if res == nil && d.Status != http.StatusServiceUnavailable {
			break // decided: restored
		}
		if time.Now().After(end) {
			t.Fatalf("the database back for 20 s: still answered %d", d.Status)
		}
	}
	if n := spendGroupUntil(t, g, a, 20, 429); n != 0 {
		t.Fatalf("the database back: %d admitted of the none left of 10 (10 spent before the second loss and after it)", n)
	}
}
