package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestFallbackAtkFlappingRedisWithTheLedgerDown: two replicas
// (fallback_replicas: 2) share Redis and a PostgreSQL ledger; a caller has
// spent $0.002 of its $0.01 day, which both replicas have read. The
// ledger's database goes down, then Redis refuses every write, comes back
// and refuses again, three times. Each outage starts a fallback restored
// from what the replica knows: its last read of the database plus its own
// records since, which include what it admitted on the earlier outages'
// fallbacks. Dividing that whole figure by the replicas forgot half of
// each replica's own fallback spend at each outage: the two replicas
// admitted $0.014 of the $0.008 left. The fallbacks together must stay
// within the budget: 8 requests of $0.001. So for a tenant's budget (read
// as one spend) and for a user's that only the rate limit service names
// (read with the tenant's other users, by user).
func TestFallbackAtkFlappingRedisWithTheLedgerDown(t *testing.T) {
	for _, tc := range budgetScopes {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fallbackAtkFlapping(t, tc.scope, tc.caller)
		})
	}
}

func fallbackAtkFlapping(t *testing.T, scope string, caller func(g *gate.Gate) *gate.Caller) {
	ctx := context.Background()
	replicas, srv, pg := ledgerDownReplicas(t, scope, caller)
	rc := srv.Client(t)
	admitted := 0
	for outage := range 3 {
		if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		for i, g := range replicas {
			n, d := admitN(t, g, caller(g), milli, 20)
			// After the first outage, Redis holds what the fallbacks
			// admitted (see TestFallbackAtkRedisBackWithTheLedgerDown), and
			// it answers a refusal itself, which writes nothing.
			if d.Status != http.StatusPaymentRequired || outage == 0 && !d.Degraded {
				t.Fatalf("outage %d, replica %d: %d admitted, then %d (degraded %v); want a 402", outage, i, n, d.Status, d.Degraded)
			}
			admitted += n
		}
		if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
		for i, g := range replicas {
			// Redis decides again once the breaker has let a call through
			// (a catch-up's may have failed while Redis refused writes,
			// and opened it for one cooldown more): a request of more than
			// is left is refused there, not on the fallback.
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				res, d := g.Reserve(ctx, &gate.Request{Caller: caller(g), Route: "/v1/chat/completions", Estimate: costmodel.Estimate{Cost: usd("0.0099")}})
				if res != nil {
					res.Cancel(ctx)
				}
				if res == nil && !d.Degraded && d.Status == http.StatusPaymentRequired {
					break
				}
				if res != nil || d.Status != http.StatusPaymentRequired || time.Now().After(end) {
					t.Fatalf("Redis back after outage %d, replica %d: %+v, want a 402 from Redis", outage, i, d)
				}
			}
		}
	}
	pg.Start() // the replicas' Close then flushes their spools at once
	t.Logf("the fallbacks of three outages admitted %d", admitted)
	if admitted > 8 {
		t.Errorf("%s: over three outages with the ledger down, the two replicas' fallbacks admitted %d requests of $0.001; $0.008 was left", scope, admitted)
	}
}

// TestFallbackAtkRedisBackWithTheLedgerDown: as above, two replicas with
// $0.008 of a $0.01 day left and the ledger's database down; Redis
// refuses writes while each replica's fallback admits its share (4 of
// $0.001), then comes back while the database stays out. Each replica
// caught Redis up to what it knew (the spend the database held at its
// last read and its own records since), which leaves out the other
// replica's fallback admissions: Redis then admitted 4 more, 12 of the 8
// left. Each replica now adds its own fallback spend to Redis's counters
// as soon as Redis is back, so that Redis then admits nothing more.
func TestFallbackAtkRedisBackWithTheLedgerDown(t *testing.T) {
	for _, tc := range budgetScopes {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			replicas, srv, pg := ledgerDownReplicas(t, tc.scope, tc.caller)
			rc := srv.Client(t)
			if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
			admitted := 0
			for i, g := range replicas {
				n, d := admitN(t, g, tc.caller(g), milli, 20)
				if !d.Degraded || d.Status != http.StatusPaymentRequired {
					t.Fatalf("replica %d: %d admitted, then %d (degraded %v); want a degraded 402", i, n, d.Status, d.Degraded)
				}
				admitted += n
			}
			if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			// Each replica adds its fallback's spend to Redis's counters
			// once its breaker has cooled down for one cooldown more
			// without a request.
			waitCaughtUp(t, replicas)
			onRedis := 0
			for i, g := range replicas {
				n, d := admitN(t, g, tc.caller(g), milli, 20)
				if d.Degraded || d.Status != http.StatusPaymentRequired {
					t.Fatalf("Redis back, replica %d: %d admitted, then %+v; want a 402 from Redis", i, n, d)
				}
				onRedis += n
			}
			pg.Start()
			t.Logf("the fallbacks admitted %d, Redis back %d", admitted, onRedis)
			if admitted+onRedis > 8 {
				t.Errorf("%s: with the ledger down, the fallbacks admitted %d and Redis back %d requests of $0.001; $0.008 was left", tc.scope, admitted, onRedis)
			}
		})
	}
}

var milli = costmodel.Estimate{Cost: usd("0.001")}

// budgetScopes are the budgets the fallback tests spend: a tenant's (read
// as one spend) and a user's that only the rate limit service names (read
// with the tenant's other users, by user).
var budgetScopes = []struct {
	name, scope string
	caller      func(g *gate.Gate) *gate.Caller
}{
	{"tenant", "tenant", func(g *gate.Gate) *gate.Caller { return g.Identify("cg-acme") }},
	{"user the RLS names", "user", func(g *gate.Gate) *gate.Caller { return g.Trusted("acme", "ann", "", "small") }},
}

// ledgerDownReplicas starts two replicas (fallback_replicas: 2) on one
// Redis and one PostgreSQL with a $0.01 day budget of scope, of which
// caller has spent $0.002, read by both; then stops the database and
// makes sure both replicas noticed.
func ledgerDownReplicas(t *testing.T, scope string, caller func(g *gate.Gate) *gate.Caller) ([]*gate.Gate, *redistest.Server, *pgtest.Private) {
	ctx := context.Background()
	srv, pg := redistest.New(t), pgtest.NewPrivate(t)
	replica := func() *gate.Gate {
		return fallbackGate(t, srv.URL, pg.URL(), scope, 2, "20ms")
	}
	replicas := []*gate.Gate{replica(), replica()}
	for _, g := range replicas {
		if n, d := admitN(t, g, caller(g), milli, 1); n != 1 {
			t.Fatalf("a first request: %+v", d)
		}
	}
	for _, g := range replicas {
		if err := g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range replicas { // both read the $0.002
		if err := g.ReconcileBudgets(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pg.Stop()
	for _, g := range replicas {
		// A request cancelled writes two records that the ledger cannot
		// store: it notices its database out, and charges nothing.
		res, d := g.Reserve(ctx, &gate.Request{Caller: caller(g), Route: "/v1/chat/completions", Estimate: milli})
		if res == nil {
			t.Fatalf("with the ledger down: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		res.Cancel(ctx)
		for end := time.Now().Add(10 * time.Second); g.Ledger().Stats().StoreErr == nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("the ledger did not notice its database out")
			}
		}
	}
	return replicas, srv, pg
}

// TestFallbackAtkLossAfterAnOutageCountsOnce: a replica's fallback admits
// 3 requests of $0.001 while Redis refuses writes, then Redis comes back
// empty (FLUSHALL). The catch-up's replay of those admissions finds the
// tenant's counters lost and is dropped: the restore from the ledger,
// which holds them, counts them. Replayed after it, they would count
// twice, and the tenant be refused $0.003 short of its budget: of the
// $0.01 day, $0.002 spent before and $0.003 on the fallback, Redis must
// admit 5 more (2 when the replay is kept for after the restore).
func TestFallbackAtkLossAfterAnOutageCountsOnce(t *testing.T) {
	ctx := context.Background()
	srv, pg := redistest.New(t), pgtest.NewPrivate(t)
	g := fallbackGate(t, srv.URL, pg.URL(), "tenant", 1, "300ms")
	c := g.Identify("cg-acme")
	if n, d := admitN(t, g, c, milli, 2); n != 2 {
		t.Fatalf("before: %d admitted, then %+v", n, d)
	}
	rc := srv.Client(t)
	if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	admitOnFallback(t, g, c, milli, 3)
	if err := g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// Past the cooldown, before the catch-up loop's turn (a cooldown and
	// one more): the next request is the breaker's probe, and catches up.
	time.Sleep(350 * time.Millisecond)
	n, d := admitN(t, g, c, milli, 20)
	if d.Degraded || d.Status != http.StatusPaymentRequired {
		t.Fatalf("Redis back empty: %d admitted, then %+v; want a 402 from Redis", n, d)
	}
	if n != 5 {
		t.Errorf("Redis back empty admitted %d of the $0.005 left, want 5 (the fallback's $0.003 counted %s)", n, map[bool]string{true: "twice", false: "not at all"}[n < 5])
	}
}

// TestFallbackAtkManyAdmissionsOneReplay: a replica's fallback admits 200
// requests of a tenant while Redis refuses writes; when Redis is back,
// their spend is added to its counters, and the tenant's requests wait
// for that. Replayed one by one, it took two script calls per request
// (400); the spend on the same limits is added at once, in a few, and
// counts whole: of the $0.01 day, a nano-dollar went before and $0.002 on
// the fallback, and Redis back admits 7 more of $0.001.
func TestFallbackAtkManyAdmissionsOneReplay(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	g := fallbackGate(t, srv.URL, "", "tenant", 1, "20ms")
	c := g.Identify("cg-acme")
	if n, d := admitN(t, g, c, costmodel.Estimate{Cost: 1}, 1); n != 1 {
		t.Fatalf("before: %+v", d)
	}
	rc := srv.Client(t)
	if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	tenth := costmodel.Estimate{Cost: usd("0.00001")}
	admitOnFallback(t, g, c, tenth, 200)
	addr, _, _ := strings.Cut(strings.TrimPrefix(srv.URL, "redis://"), "/")
	mon := redistest.NewMonitor(t, addr)
	if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the catch-up loop's turn
	n, d := admitN(t, g, c, milli, 20)
	if d.Degraded || d.Status != http.StatusPaymentRequired {
		t.Fatalf("Redis back: %d admitted, then %+v; want a 402 from Redis", n, d)
	}
	calls := mon.Count("evalsha") + mon.Count(`"eval"`)
	t.Logf("Redis back: %d admitted; %d script calls in all", n, calls)
	if n != 7 {
		t.Errorf("Redis back admitted %d requests of $0.001, want 7 (of the $0.01 day, a nano-dollar and the fallback's $0.002 spent)", n)
	}
	if calls > 40 {
		t.Errorf("%d script calls to catch up 200 fallback admissions and decide %d requests", calls, n+1)
	}
}

// fallbackGate opens a replica on Redis at redisURL whose tenant acme
// has a $0.01 day budget of scope, with fallback_replicas replicas, a
// breaker that opens at the first failure and cools down for cooldown,
// and its ledger in PostgreSQL at dsn ("" for the embedded one).
func fallbackGate(t *testing.T, redisURL, dsn, scope string, replicas int, cooldown string) *gate.Gate {
	t.Helper()
	ledger := ""
	if dsn != "" {
		ledger = fmt.Sprintf("ledger: {dsn: %q}\n", dsn)
	}
	return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, fallback_replicas: %d, timeout: 5s, queue_timeout: 5s, breaker_failures: 1, breaker_cooldown: %s}
%stenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {name: daily, scope: %s, amount: "0.01"}
`, t.TempDir(), redisURL, replicas, cooldown, ledger, scope))
}

// admitOnFallback has n requests of est admitted on the local fallback,
// each recorded and settled at its estimate.
func admitOnFallback(t *testing.T, g *gate.Gate, c *gate.Caller, est costmodel.Estimate, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: est})
		if res == nil || !d.Degraded {
			t.Fatalf("fallback request %d: %+v, want admitted on the fallback", i, d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		res.Settle(ctx, gate.Charge{Cost: est.Cost, HTTPStatus: http.StatusOK})
	}
}

// TestFallbackAtkStreamsExtendedOnTheFallback: as above, two replicas
// with $0.008 of a $0.01 day left and the ledger's database down; Redis
// refuses writes while each replica's fallback admits a stream that
// grows past its reservation in five increments (its output debited as
// it runs, Extend) and settles at about $0.0031; or Redis starts refusing
// after the stream was reserved there, and the increments go to the
// fallback. Redis back, each replica must add what its fallback let the
// stream spend to Redis's counters, as it does for a request that did
// not grow: a stream's spend was not kept for the catch-up at all, so
// Redis counted only what each replica's restore knew (its own stream),
// and admitted the other's again. Of the $0.008 left, the streams spent
// $0.0061: Redis back admits at most one request of $0.001 more (it
// admitted 4).
func TestFallbackAtkStreamsExtendedOnTheFallback(t *testing.T) {
	for _, tc := range budgetScopes {
		for _, reserved := range []string{"on the fallback", "on Redis"} {
			t.Run(tc.name+"/reserved "+reserved, func(t *testing.T) {
				t.Parallel()
				fallbackAtkStreams(t, tc.scope, tc.caller, reserved == "on Redis")
			})
		}
	}
}

func fallbackAtkStreams(t *testing.T, scope string, caller func(g *gate.Gate) *gate.Caller, onRedis bool) {
	ctx := context.Background()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const model = "gpt-4o-mini"
	estimate := func(out int64) costmodel.Estimate {
		u := costmodel.Usage{InputTokens: 10, OutputTokens: out}
		return costmodel.Estimate{Model: model, Stream: true, Usage: u, Cost: est.Cost(model, u)}
	}
	replicas, srv, pg := ledgerDownReplicas(t, scope, caller)
	rc := srv.Client(t)
	refuse := func(mem string) {
		if err := rc.ConfigSet(ctx, "maxmemory", mem).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if !onRedis {
		refuse("1")
	}
	var spent costmodel.NanoUSD
	for i, g := range replicas {
		res, d := g.Reserve(ctx, &gate.Request{Caller: caller(g), Route: "/v1/chat/completions", Estimate: estimate(100)})
		if res == nil || d.Degraded == onRedis {
			t.Fatalf("replica %d: %+v, want a stream admitted %s", i, d, map[bool]string{true: "on Redis", false: "on the fallback"}[onRedis])
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		if onRedis {
			refuse("1")
		}
		for range 5 {
			if d, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: 1000}); !ok {
				t.Fatalf("replica %d: an increment was refused: %+v %+v", i, d, d.Error)
			}
		}
		actual := estimate(5100)
		res.Settle(ctx, gate.Charge{Usage: actual.Usage, Cost: actual.Cost, HTTPStatus: http.StatusOK})
		spent += actual.Cost
		if onRedis {
			refuse("0") // the next replica reserves on Redis
		}
	}
	refuse("0")
	waitCaughtUp(t, replicas) // see TestFallbackAtkRedisBackWithTheLedgerDown
	admitted := 0
	for i, g := range replicas {
		n, d := admitN(t, g, caller(g), milli, 20)
		if d.Degraded || d.Status != http.StatusPaymentRequired {
			t.Fatalf("Redis back, replica %d: %d admitted, then %+v; want a 402 from Redis", i, n, d)
		}
		admitted += n
	}
	pg.Start()
	left := usd("0.008") - spent
	t.Logf("the streams spent %d nano-USD of the 8,000,000 left; Redis back admitted %d of $0.001", spent, admitted)
	if want := int(left / milli.Cost); admitted > want {
		t.Errorf("%s: with the ledger down, after the streams spent $%.7f of the $0.008 left, Redis back admitted %d requests of $0.001; at most %d", scope, float64(spent)/1e9, admitted, want)
	}
}

// waitCaughtUp waits until each replica has added what its fallback
// admitted to the store's counters (see gate.WaitCaughtUp).
func waitCaughtUp(t *testing.T, replicas []*gate.Gate) {
	t.Helper()
	for i, g := range replicas {
		if err := g.WaitCaughtUp(10 * time.Second); err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
}
