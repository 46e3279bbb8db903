package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// newCtrAtkYAML is a configuration of tenant acme (key cg-acme) with a
// tenant budget of $0.01 per day; budget is the budget's YAML flow
// mapping's fields after its amount (its name first), store and ledger
// are flow mappings' fields.
func newCtrAtkYAML(dir, store, ledger, budget string) string {
	return fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {%s}
ledger: {%s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {amount: "0.01", %s}
`, dir, store, ledger, budget)
}

// newCtrAtkHammer makes workers goroutines reserve $0.001 with key on g,
// per requests each, identified anew each (as the proxy does), each
// admitted one recorded and settled at its estimate, and returns how many
// were admitted.
func newCtrAtkHammer(t *testing.T, g *gate.Gate, key string, workers, per int) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	est := costmodel.Estimate{Cost: usd("0.001")}
	for range workers {
		wg.Go(func() {
			ctx := context.Background()
			for range per {
				res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify(key), Route: "/v1/chat/completions", Estimate: est})
				if res == nil {
					if d.Status != http.StatusPaymentRequired && d.Status != http.StatusServiceUnavailable {
						t.Errorf("refusal %d, want 402 or 503", d.Status)
					}
					continue
				}
				admitted.Add(1)
				if d, ok := res.Record(ctx); !ok {
					t.Errorf("record: %+v", d)
				}
				res.Settle(ctx, gate.Charge{Cost: est.Cost, HTTPStatus: http.StatusOK})
			}
		})
	}
	wg.Wait()
	return admitted.Load()
}

// TestNewCtrAtkRedisDownReload: a tenant spends its $0.01 day budget;
// Redis goes down (the breaker opens; the local fallback, brought up to
// the ledger's spend, refuses); a reload then renames the budget or makes
// it monthly. The restore the fix runs before the first debit cannot
// reach Redis, and the request is decided on the fallback, whose tenant
// was restored before the change: its new counter starts at 0. Every
// request must still be refused, during the outage and after Redis is
// back.
func TestNewCtrAtkRedisDownReload(t *testing.T) {
	for _, tc := range []struct{ name, after string }{
		{"unchanged", "name: daily"},
		{"renamed", "name: daily-usd"},
		{"monthly", "name: daily, period: month"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, dir := redistest.New(t), t.TempDir()
			store := fmt.Sprintf("redis: %q, breaker_failures: 1, breaker_cooldown: 50ms, timeout: 300ms", srv.URL)
			g := openYAML(t, newCtrAtkYAML(dir, store, "", "name: daily"))
			acme := g.Identify("cg-acme")
			if n, d := admitN(t, g, acme, costmodel.Estimate{Cost: usd("0.001")}, 20); n != 10 || d.Status != http.StatusPaymentRequired {
				t.Fatalf("spending the budget: %d admitted, then %d", n, d.Status)
			}
			srv.Stop(t)
			if n, d := admitN(t, g, acme, costmodel.Estimate{Cost: usd("0.001")}, 5); n != 0 || !d.Degraded {
				t.Fatalf("on the fallback before the change: %d admitted, then %+v", n, d)
			}
			if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", tc.after))); err != nil {
				t.Fatal(err)
			}
			during := newCtrAtkHammer(t, g, "cg-acme", 8, 10)
			srv.Restart(t)
			time.Sleep(200 * time.Millisecond) // the breaker half-opens after 50 ms; a probe closes it
			after := newCtrAtkHammer(t, g, "cg-acme", 8, 10)
			if during != 0 || after != 0 {
				t.Errorf("a $0.01 day budget spent, then %s while Redis is down: %d of $0.001 admitted during the outage, %d after it", tc.name, during, after)
			}
		})
	}
}

// TestNewCtrAtkLedgerDownChangeAnswers: a budget renamed while the
// ledger's database is out, with records waiting in the spool, is
// restored from what this node knows, at once: the restore does not wait
// for a flush the database cannot take (it waited the restore's whole 10
// s bound, request after request).
func TestNewCtrAtkLedgerDownChangeAnswers(t *testing.T) {
	srv, pg, dir := redistest.New(t), pgtest.NewPrivate(t), t.TempDir()
	store := fmt.Sprintf("redis: %q", srv.URL)
	ledger := fmt.Sprintf("dsn: %q", pg.URL())
	g := openYAML(t, newCtrAtkYAML(dir, store, ledger, "name: daily"))
	acme := g.Identify("cg-acme")
	if n, _ := admitN(t, g, acme, costmodel.Estimate{Cost: usd("0.001")}, 5); n != 5 {
		t.Fatalf("spending: %d admitted", n)
	}
	if err := g.Ledger().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	pg.Stop()
	if n, _ := admitN(t, g, acme, costmodel.Estimate{Cost: usd("0.001")}, 2); n != 2 {
		t.Fatalf("spending with the database out: %d admitted", n)
	}
	for end := time.Now().Add(15 * time.Second); g.Ledger().Stats().StoreErr == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the ledger did not notice its database out")
		}
	}
	if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, ledger, "name: daily-usd"))); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n, _ := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 1)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the first request after the change took %v", d)
	}
	if n != 1 {
		t.Fatalf("$0.001 of the $0.003 left refused after the rename")
	}
}

// TestNewCtrAtkLedgerDownReload: a tenant spends its $0.01 day budget
// (recorded in a PostgreSQL ledger, flushed); the ledger's database goes
// down; a reload renames the budget, makes it monthly, or keys it by
// user. The restore before the first debit of the new counter cannot
// read the ledger: it answers from this node's last read of the same
// query plus its own records since. A query never read before (another
// period, another scope) is unknown spend: a fail-closed budget must not
// admit on it, and says so with a 503 (the limiter cannot decide), not a
// 402 (gate.ErrSpendUnknown); a fail-open one keeps serving on what this
// node knows, at most its amount once more. Once the database is back,
// the restore reads it and the spent budget answers 402.
func TestNewCtrAtkLedgerDownReload(t *testing.T) {
	for _, posture := range []string{"fail_closed", "fail_open"} {
		for _, tc := range []struct{ name, after string }{
			{"renamed", "name: daily-usd"},
			{"monthly", "name: daily, period: month"},
			{"user scope", "name: daily, scope: user"},
		} {
			t.Run(posture+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				budget := func(fields string) string { return fields + ", on_store_failure: " + posture }
				s := spentLedgerDown(t, budget("name: daily"))
				g, pg := s.g, s.pg
				if err := g.Apply(mustParse(t, newCtrAtkYAML(s.dir, s.store, s.ledger, budget(tc.after)))); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				n := newCtrAtkHammer(t, g, "cg-acme", 4, 5)
				t.Logf("20 requests in %v: %d admitted", time.Since(start).Round(time.Millisecond), n)
				known := tc.name == "renamed" // its query was read before the outage
				switch {
				case (known || posture == "fail_closed") && n != 0:
					t.Errorf("a spent $0.01 day budget, %s while the ledger is down: %d of $0.001 admitted on its new counter", tc.name, n)
				case n > 10:
					t.Errorf("a spent $0.01 day budget, %s while the ledger is down: %d of $0.001 admitted on its new counter, more than its amount again", tc.name, n)
				}
				_, d := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 1)
				want := http.StatusPaymentRequired
				if !known && posture == "fail_closed" {
					want = http.StatusServiceUnavailable // unknown spend
				}
				if d.Status != want {
					t.Errorf("%s while the ledger is down: answered %d, want %d", tc.name, d.Status, want)
				}
				if !known && posture == "fail_open" {
					return // its new counter holds what it admitted meanwhile
				}
				pg.Start()
				for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
					n, d := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 1)
					if n != 0 {
						t.Fatalf("%s, the database back: $0.001 admitted on a spent budget", tc.name)
					}
					if d.Status == http.StatusPaymentRequired {
						break
					}
					if time.Now().After(end) {
						t.Fatalf("%s, the database back for 20 s: still answered %d, want 402", tc.name, d.Status)
					}
				}
			})
		}
	}
}

// TestNewCtrAtkRegionsReload: two regions (eu, us) share acme's $0.01 day
// budget; acme spends what it can of it ($0.001 a request) in both for a
// while, rebalances included; then the shared file renames the budget or
// makes it monthly, and both regions reload it. The ledger holds the
// day's spend; the new budget's caps and counters must count it: the
// requests admitted before and after the change together fit $0.01 (10).
// Also when eu's Redis then loses its data (FLUSHALL): its new key's
// counters are restored from the ledger and the caps.
func TestNewCtrAtkRegionsReload(t *testing.T) {
	for _, tc := range []struct{ name, after string }{
		{"renamed", "name: daily-usd"},
		{"monthly", "name: daily, period: month"},
	} {
		for _, loss := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/data loss=%v", tc.name, loss), func(t *testing.T) {
				dsn := pgtest.New(t)
				type region struct {
					name, dir string
					redis     *redistest.Server
					g         *gate.Gate
				}
				rs := []*region{{name: "eu"}, {name: "us"}}
				for _, r := range rs {
					r.dir, r.redis = t.TempDir(), redistest.New(t)
					r.g = openYAML(t, regionYAML(r.dir, r.name, r.redis.URL, dsn, "name: daily"))
				}
				spend := func(d time.Duration, most int) (n int) {
					for end := time.Now().Add(d); time.Now().Before(end) && n < most; {
						for _, r := range rs {
							if regAtkSpend(t, r.g, usd("0.001")) {
								n++
							} else {
								time.Sleep(5 * time.Millisecond)
							}
						}
					}
					return n
				}
				flush := func() {
					for _, r := range rs {
						if err := r.g.Ledger().Flush(context.Background()); err != nil {
							t.Fatal(err)
						}
					}
				}
				before := 0
				if loss {
					before = spend(time.Second, 5)
				} else {
					before = spend(2*time.Second, 20)
				}
				flush()
				for _, r := range rs {
					if err := r.g.Apply(mustParse(t, regionYAML(r.dir, r.name, r.redis.URL, dsn, tc.after))); err != nil {
						t.Fatal(err)
					}
				}
				after := 0
				if loss {
					after = spend(time.Second, 2)
					flush()
					if err := rs[0].redis.Client(t).FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
				}
				after += spend(2*time.Second, 20)
				t.Logf("admitted: %d before the reload, %d after", before, after)
				if before+after > 10 {
					t.Errorf("two regions sharing a $0.01 day budget (data loss after the reload: %v) admitted %d of $0.001 before it was %s and %d after: %d in all", loss, before, tc.name, after, before+after)
				}
			})
		}
	}
}

// TestNewCtrAtkLeasedReload: the same change on a leased budget
// (lease:), whose decisions come from this replica's local leases: 0.006
// of the $0.01 spent, a reload renames it or makes it monthly while 8
// callers reserve $0.001 each; at most the $0.004 left may be admitted.
func TestNewCtrAtkLeasedReload(t *testing.T) {
	const lease = ", lease: {max_share: 0.5, ttl: 1m}"
	for _, tc := range []struct{ name, after string }{
		{"renamed", "name: daily-usd" + lease},
		{"monthly", "name: daily, period: month" + lease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, dir := redistest.New(t), t.TempDir()
			store := fmt.Sprintf("redis: %q", srv.URL)
			g := openYAML(t, newCtrAtkYAML(dir, store, "", "name: daily"+lease))
			acme := g.Identify("cg-acme")
			if n, _ := admitN(t, g, acme, costmodel.Estimate{Cost: usd("0.001")}, 6); n != 6 {
				t.Fatalf("spending $0.006: %d admitted", n)
			}
			var wg sync.WaitGroup
			var n int64
			wg.Go(func() { n = newCtrAtkHammer(t, g, "cg-acme", 8, 10) })
			if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", tc.after))); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			n += newCtrAtkHammer(t, g, "cg-acme", 4, 5)
			if n > 4 {
				t.Errorf("a leased $0.01 budget with $0.006 spent, %s under load: %d of $0.001 admitted, at most 4 fit", tc.name, n)
			}
		})
	}
}

// TestNewCtrAtkIdentifiedBeforeReload: callers identified before a
// reload renames a budget (a proxy reads the key, then the body) reserve
// after it, once the new counter is restored: they are decided on the new
// counter, not the old one, which the restore did not count again: $0.006
// of $0.01 spent, then 4 callers identified before and 4 after fit $0.004
// in all. Also leased, and with a reload that moves no budget (the
// budget's posture) before the one that renames it.
func TestNewCtrAtkIdentifiedBeforeReload(t *testing.T) {
	const lease = ", lease: {max_share: 0.5, ttl: 1m}"
	for _, tc := range []struct {
		name, before string
		reloads      []string
	}{
		{"strict", "name: daily", []string{"name: daily-usd"}},
		{"leased", "name: daily" + lease, []string{"name: daily-usd" + lease}},
		{"two reloads", "name: daily", []string{"name: daily, on_store_failure: fail_closed", "name: daily-usd, on_store_failure: fail_closed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, dir := redistest.New(t), t.TempDir()
			store := fmt.Sprintf("redis: %q", srv.URL)
			g := openYAML(t, newCtrAtkYAML(dir, store, "", tc.before))
			est := costmodel.Estimate{Cost: usd("0.001")}
			if n, _ := admitN(t, g, g.Identify("cg-acme"), est, 6); n != 6 {
				t.Fatalf("spending $0.006: %d admitted", n)
			}
			var early []*gate.Caller
			for range 4 {
				early = append(early, g.Identify("cg-acme"))
			}
			for _, b := range tc.reloads {
				if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", b))); err != nil {
					t.Fatal(err)
				}
			}
			n := 0
			for _, c := range early {
				res, d := g.Reserve(context.Background(), &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: est})
				if res == nil {
					continue
				}
				if d.RateLimit == nil || d.RateLimit.Name != "daily-usd" {
					t.Errorf("a caller identified before the reload was decided on %+v, want the budget's new counter daily-usd", d.RateLimit)
				}
				n++
				res.Record(context.Background())
				res.Settle(context.Background(), gate.Charge{Cost: est.Cost, HTTPStatus: http.StatusOK})
			}
			m, _ := admitN(t, g, g.Identify("cg-acme"), est, 4)
			if n+m > 4 {
				t.Errorf("$0.004 left: %d admitted to callers identified before the rename, %d after", n, m)
			}
		})
	}
}

// ledgerDown is a gate on Redis and a private PostgreSQL ledger, stopped.
type ledgerDown struct {
	g                  *gate.Gate
	pg                 *pgtest.Private
	dir, store, ledger string // for newCtrAtkYAML
}

// spentLedgerDown opens a gate with the $0.01 budget of budget's fields,
// spends it (10 of $0.001 admitted, then 402), flushes the ledger and
// stops its database.
func spentLedgerDown(t *testing.T, budget string) ledgerDown {
	t.Helper()
	srv, pg, dir := redistest.New(t), pgtest.NewPrivate(t), t.TempDir()
	s := ledgerDown{pg: pg, dir: dir, store: fmt.Sprintf("redis: %q", srv.URL), ledger: fmt.Sprintf("dsn: %q", pg.URL())}
	s.g = openYAML(t, newCtrAtkYAML(dir, s.store, s.ledger, budget))
	if n, d := admitN(t, s.g, s.g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 20); n != 10 || d.Status != http.StatusPaymentRequired {
		t.Fatalf("spending the budget: %d admitted, then %d", n, d.Status)
	}
	if err := s.g.Ledger().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	pg.Stop()
	return s
}
