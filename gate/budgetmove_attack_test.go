package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// budgetMoveAtkReserve reserves cost for key on g and records it; the
// test ends it.
func budgetMoveAtkReserve(t *testing.T, g *gate.Gate, key string, cost costmodel.NanoUSD) *gate.Reservation {
	t.Helper()
	ctx := context.Background()
	res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify(key), Route: "/v1/chat/completions", Estimate: costmodel.Estimate{Cost: cost}})
	if res == nil {
		t.Fatalf("reserving %v: refused %+v", cost, d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatalf("record: %+v", d)
	}
	return res
}

// TestBudgetMoveAtkInflightEndsOnOldCounter: a request recorded before a
// reload renames (or makes monthly) a $0.01 budget ends after it: the
// restore counted its estimate on the new counter, and its settlement
// (or cancellation) goes to the old one. A request reserved at $0.005 that
// costs $0.001 (or fails upstream: nothing) must leave $0.009 (or $0.01)
// of the day to the tenant, also after a reconciliation; one reserved at
// $0.001 that costs $0.006 must leave $0.004, before the next scheduled
// reconciliation too.
func TestBudgetMoveAtkInflightEndsOnOldCounter(t *testing.T) {
	type end struct {
		name            string
		reserve, actual string
		cancel          bool
		noReconcile     bool // no scheduled reconciliation runs before the requests
		left            int  // $0.001 requests that fit after it
	}
	for _, move := range []struct{ name, after string }{
		{"renamed", "name: daily-usd"},
		{"monthly", "name: daily, period: month"},
	} {
		for _, e := range []end{
			{name: "settled low", reserve: "0.005", actual: "0.001", left: 9},
			{name: "cancelled", reserve: "0.005", cancel: true, left: 10},
			{name: "settled high", reserve: "0.001", actual: "0.006", left: 4},
			{name: "settled high before a reconciliation", reserve: "0.001", actual: "0.006", noReconcile: true, left: 4},
		} {
			t.Run(move.name+"/"+e.name, func(t *testing.T) {
				srv, dir := redistest.New(t), t.TempDir()
				store := fmt.Sprintf("redis: %q", srv.URL)
				g := openYAML(t, newCtrAtkYAML(dir, store, "", "name: daily"))
				res := budgetMoveAtkReserve(t, g, "cg-acme", usd(e.reserve))
				if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", move.after))); err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				if e.cancel {
					res.Cancel(ctx)
				} else {
					res.Settle(ctx, gate.Charge{Cost: usd(e.actual), HTTPStatus: http.StatusOK})
				}
				if err := g.Ledger().Flush(ctx); err != nil {
					t.Fatal(err)
				}
				if !e.noReconcile {
					if err := g.ReconcileBudgets(ctx); err != nil {
						t.Fatal(err)
					}
				}
				n, d := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 20)
				if n != e.left {
					t.Errorf("a $0.01 budget %s while a request reserved at $%s was in flight, %s: %d of $0.001 admitted after it (then %d), want %d",
						move.name, e.reserve, e.name, n, d.Status, e.left)
				}
			})
		}
	}
}

// TestBudgetMoveAtkSecondReloadBeforeRestore: the ledger's database is
// out; a reload renames a spent $0.01 budget (its restore cannot run: the
// ledger is failing), and a second reload changes something that moves no
// budget (its posture) before a request came. The new counter must still
// be restored before it is debited: the renamed query was read before the
// outage, so the restore knows the day is spent, and no request may be
// admitted, during the outage or after it.
func TestBudgetMoveAtkSecondReloadBeforeRestore(t *testing.T) {
	s := spentLedgerDown(t, "name: daily")
	g, pg, dir, store, ledger := s.g, s.pg, s.dir, s.store, s.ledger
	acme := g.Identify("cg-acme")
	// A refused request writes nothing: a Served one is recorded, so the
	// ledger notices its database out.
	res, _ := g.Reserve(context.Background(), &gate.Request{Caller: acme, Route: "/x", Served: true})
	if res != nil {
		res.Record(context.Background())
		res.Settle(context.Background(), gate.Charge{HTTPStatus: http.StatusOK})
	}
	for end := time.Now().Add(15 * time.Second); g.Ledger().Stats().StoreErr == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the ledger did not notice its database out")
		}
	}
	for _, after := range []string{"name: daily-usd", "name: daily-usd, on_store_failure: fail_open"} {
		if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, ledger, after))); err != nil {
			t.Fatal(err)
		}
	}
	during := newCtrAtkHammer(t, g, "cg-acme", 4, 5)
	pg.Start()
	after := 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		n, _ := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 1)
		after += n
		if g.Ledger().Stats().StoreErr == nil {
			break
		}
	}
	m, _ := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 10)
	if during != 0 || after+m != 0 {
		t.Errorf("a spent $0.01 day budget renamed, then reloaded again (no budget moved) while the ledger is down: %d of $0.001 admitted during the outage, %d after it", during, after+m)
	}
}

// budgetMoveAtkTenantsYAML is newCtrAtkYAML with tenants acme (cg-acme)
// and other (cg-globex), and more tenants' lines.
func budgetMoveAtkTenantsYAML(dir, store, other, more string) string {
	return fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {%s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
  - {name: %s, plan: small, keys: [{id: globex-key, key: cg-globex}]}
%sbudgets:
  - {name: daily, amount: "0.01"}
`, dir, store, other, more)
}

// TestBudgetMoveAtkDrainWaitsForOtherTenants: a reload that adds a tenant
// moves budgets (the tenants changed), and every tenant's counters are
// restored after the requests decided on the old configuration reach the
// ledger. One request of globex is held before its record (a friction
// delay of 3 s). acme's restore has nothing to wait for: none of acme's
// requests is in flight. acme's first request after the reload must not
// wait for globex's. A restore waits for the requests of the tenants
// that share its tenant's stripe of the in-flight count (1 in 64, by a
// seed each process draws): the second tenant is named so that it does
// not share acme's.
func TestBudgetMoveAtkDrainWaitsForOtherTenants(t *testing.T) {
	srv, dir := redistest.New(t), t.TempDir()
	store := fmt.Sprintf("redis: %q", srv.URL)
	globex := "globex"
	for i := 1; gate.SharesInflightStripe("acme", globex); i++ {
		globex = fmt.Sprintf("globex%d", i)
	}
	g := openYAML(t, budgetMoveAtkTenantsYAML(dir, store, globex, ""))
	ctx := context.Background()
	held, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-globex"), Route: "/v1/chat/completions", Estimate: costmodel.Estimate{Cost: usd("0.001")}})
	if held == nil {
		t.Fatalf("globex refused: %+v", d)
	}
	const hold = 3 * time.Second
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(hold) // the friction delay
		held.Record(ctx)
		held.Settle(ctx, gate.Charge{Cost: usd("0.001"), HTTPStatus: http.StatusOK})
	}()
	cfg := mustParse(t, budgetMoveAtkTenantsYAML(dir, store, globex, "  - {name: initech, plan: small, keys: [{id: initech-key, key: cg-initech}]}\n"))
	applied := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		if err := g.Apply(cfg); err != nil {
			t.Error(err)
		}
		applied <- time.Since(start)
	}()
	for g.Config() != cfg {
		time.Sleep(time.Millisecond)
	}
	// 1 s into the reload: acme's request.
	time.Sleep(time.Second)
	t0 := time.Now()
	n, _ := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 1)
	took := time.Since(t0)
	reload := <-applied
	<-released
	t.Logf("acme's request took %v; the reload %v; globex's request held %v", took.Round(time.Millisecond), reload.Round(time.Millisecond), hold)
	if n != 1 {
		t.Errorf("acme's request refused")
	}
	if took > 500*time.Millisecond {
		t.Errorf("a reload that added a tenant: acme's first request took %v, waiting for another tenant's request held before its record", took.Round(time.Millisecond))
	}
}

// TestBudgetMoveAtkLedgerDownKeyScope: TestNewCtrAtkLedgerDownReload for
// a budget keyed by API key: a key spends its $0.01 day budget, the
// ledger's database goes down, and a reload renames the budget (the same
// grouped read of the key's spend, read before the outage: known) or
// makes it monthly (never read: unknown). The renamed budget admits
// nothing; the monthly one, fail-closed, answers 503.
func TestBudgetMoveAtkLedgerDownKeyScope(t *testing.T) {
	for _, tc := range []struct {
		name, after string
		want        int // the status of the first request after the reload
	}{
		{"renamed", "name: daily-usd, scope: api_key, on_store_failure: fail_closed", http.StatusPaymentRequired},
		{"monthly", "name: daily, scope: api_key, period: month, on_store_failure: fail_closed", http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, pg, dir := redistest.New(t), pgtest.NewPrivate(t), t.TempDir()
			store := fmt.Sprintf("redis: %q", srv.URL)
			ledger := fmt.Sprintf("dsn: %q", pg.URL())
			g := openYAML(t, newCtrAtkYAML(dir, store, ledger, "name: daily, scope: api_key, on_store_failure: fail_closed"))
			if n, d := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 20); n != 10 || d.Status != http.StatusPaymentRequired {
				t.Fatalf("spending the budget: %d admitted, then %d", n, d.Status)
			}
			if err := g.Ledger().Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			pg.Stop()
			if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, ledger, tc.after))); err != nil {
				t.Fatal(err)
			}
			n := newCtrAtkHammer(t, g, "cg-acme", 4, 5)
			_, d := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 1)
			if n != 0 || d.Status != tc.want {
				t.Errorf("a key's spent $0.01 day budget %s while the ledger is down: %d of $0.001 admitted, then %d, want none and %d", tc.name, n, d.Status, tc.want)
			}
		})
	}
}

// TestBudgetMoveAtkNoInflightLeak: requests end every way a front door
// ends them on one configuration (a check; a refusal; a cost no limit
// admits; a caller gone before the debit; usage served, recorded or not;
// a reservation cancelled, or settled at nothing, without its record (a
// front door records what spends money before it settles); a record the
// ledger refuses; a reservation recorded, then cancelled); then a reload
// renames the budget. None of them holds a reservation without its ledger
// entry, so the reload's restore has nothing to wait for: it must not
// wait its 2 s bound.
func TestBudgetMoveAtkNoInflightLeak(t *testing.T) {
	srv, dir := redistest.New(t), t.TempDir()
	store := fmt.Sprintf("redis: %q", srv.URL)
	g := openYAML(t, newCtrAtkYAML(dir, store, "", "name: daily"))
	ctx := context.Background()
	est := costmodel.Estimate{Cost: usd("0.001")}
	req := func(mod func(*gate.Request)) *gate.Request {
		r := &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions", Estimate: est}
		if mod != nil {
			mod(r)
		}
		return r
	}
	ends := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"check", func(t *testing.T) {
			if res, _ := g.Reserve(ctx, req(func(r *gate.Request) { r.Check = true })); res != nil {
				t.Error("a check got a reservation")
			}
		}},
		{"cost too big", func(t *testing.T) {
			if res, _ := g.Reserve(ctx, req(func(r *gate.Request) { r.Estimate.Cost = usd("1") })); res != nil {
				t.Error("a cost above the budget got a reservation")
			}
		}},
		{"caller gone", func(t *testing.T) {
			gone, cancel := context.WithCancel(ctx)
			cancel()
			if res, _ := g.Reserve(gone, req(nil)); res != nil {
				res.Cancel(ctx)
			}
		}},
		{"served, recorded", func(t *testing.T) {
			res, _ := g.Reserve(ctx, req(func(r *gate.Request) { r.Served = true }))
			res.Record(ctx)
			res.Settle(ctx, gate.Charge{Cost: est.Cost, HTTPStatus: http.StatusOK})
		}},
		{"served, spending nothing, settled at once", func(t *testing.T) {
			res, _ := g.Reserve(ctx, req(func(r *gate.Request) { r.Served = true }))
			res.Settle(ctx, gate.Charge{HTTPStatus: http.StatusOK})
		}},
		{"cancelled unrecorded", func(t *testing.T) {
			res, _ := g.Reserve(ctx, req(nil))
			res.Cancel(ctx)
		}},
		{"settled unrecorded, spending nothing", func(t *testing.T) {
			res, _ := g.Reserve(ctx, req(nil))
			res.Settle(ctx, gate.Charge{HTTPStatus: http.StatusBadGateway, Unreached: true})
		}},
		{"record refused", func(t *testing.T) {
			res, _ := g.Reserve(ctx, req(func(r *gate.Request) { r.Route = "/v1/\x00" }))
			if res == nil {
				return
			}
			if _, ok := res.Record(ctx); ok {
				res.Settle(ctx, gate.Charge{Cost: est.Cost, HTTPStatus: http.StatusOK})
			}
		}},
		{"recorded, cancelled", func(t *testing.T) {
			res, _ := g.Reserve(ctx, req(nil))
			res.Record(ctx)
			res.Cancel(ctx)
		}},
		{"refused", func(t *testing.T) {
			admitN(t, g, g.Identify("cg-acme"), est, 20)
		}},
	}
	for _, e := range ends {
		e.run(t)
	}
	start := time.Now()
	if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", "name: daily-usd"))); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("a reload that renamed the budget took %v after requests that all ended: a reservation's count was not given back", took.Round(time.Millisecond))
	}
	if n, d := admitN(t, g, g.Identify("cg-acme"), est, 1); n != 0 || d.Status != http.StatusPaymentRequired {
		t.Errorf("the spent budget renamed: %d admitted, then %d", n, d.Status)
	}
}

// TestBudgetMoveAtkTwoReloadsUnderLoad: $0.006 of a $0.01 budget spent,
// two reloads that move it follow each other while 8 callers reserve
// $0.001 each (renamed then made monthly; renamed and back): at most the
// $0.004 left may be admitted.
func TestBudgetMoveAtkTwoReloadsUnderLoad(t *testing.T) {
	for _, tc := range []struct{ name, first, second string }{
		{"renamed then monthly", "name: daily-usd", "name: daily-usd, period: month"},
		{"renamed and back", "name: daily-usd", "name: daily"},
	} {
		for _, lease := range []string{"", ", lease: {max_share: 0.5, ttl: 1m}"} {
			t.Run(fmt.Sprintf("%s/lease=%v", tc.name, lease != ""), func(t *testing.T) {
				srv, dir := redistest.New(t), t.TempDir()
				store := fmt.Sprintf("redis: %q", srv.URL)
				g := openYAML(t, newCtrAtkYAML(dir, store, "", "name: daily"+lease))
				if n, _ := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 6); n != 6 {
					t.Fatalf("spending $0.006: %d admitted", n)
				}
				done := make(chan int64)
				go func() { done <- newCtrAtkHammer(t, g, "cg-acme", 8, 10) }()
				for _, b := range []string{tc.first, tc.second} {
					if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", b+lease))); err != nil {
						t.Error(err)
					}
				}
				n := <-done
				n += newCtrAtkHammer(t, g, "cg-acme", 4, 5)
				if n > 4 {
					t.Errorf("$0.006 of a $0.01 budget spent, %s under load: %d of $0.001 admitted, at most 4 fit", tc.name, n)
				}
			})
		}
	}
}

// TestBudgetMoveAtkLeasedRenamedBack: a leased $0.01 budget, $0.006
// spent on it (this replica holds a lease of it); renamed, $0.002 spent
// on the new name; renamed back. The old counter and its lease have not
// counted the $0.002: at most $0.002 more fits.
func TestBudgetMoveAtkLeasedRenamedBack(t *testing.T) {
	const lease = ", lease: {max_share: 0.5, ttl: 1m}"
	srv, dir := redistest.New(t), t.TempDir()
	store := fmt.Sprintf("redis: %q", srv.URL)
	g := openYAML(t, newCtrAtkYAML(dir, store, "", "name: daily"+lease))
	est := costmodel.Estimate{Cost: usd("0.001")}
	if n, _ := admitN(t, g, g.Identify("cg-acme"), est, 6); n != 6 {
		t.Fatalf("spending $0.006: %d admitted", n)
	}
	if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", "name: daily-usd"+lease))); err != nil {
		t.Fatal(err)
	}
	if n, _ := admitN(t, g, g.Identify("cg-acme"), est, 2); n != 2 {
		t.Fatalf("spending $0.002 on the new name: %d admitted", n)
	}
	if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", "name: daily"+lease))); err != nil {
		t.Fatal(err)
	}
	if n, _ := admitN(t, g, g.Identify("cg-acme"), est, 10); n > 2 {
		t.Errorf("a leased $0.01 budget, $0.006 spent, renamed, $0.002 spent, renamed back: %d of $0.001 admitted, at most 2 fit", n)
	}
}

// TestBudgetMoveAtkHeldAcrossRename: a reservation of the reserve/settle
// API (held, $0.005) outlives a reload that renames its $0.01 budget; it
// is resumed and settled at $0.001. The new counter, restored while the
// ledger held the reservation at its estimate, must come to $0.001:
// $0.009 is left.
func TestBudgetMoveAtkHeldAcrossRename(t *testing.T) {
	srv, dir := redistest.New(t), t.TempDir()
	yaml := func(budget string) string {
		return fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
reservations: {secret: 0123456789abcdef0123}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {amount: "0.01", %s}
`, dir, srv.URL, budget)
	}
	g := openYAML(t, yaml("name: daily"))
	ctx := context.Background()
	res := budgetMoveAtkReserve(t, g, "cg-acme", usd("0.005"))
	id, _ := res.Hold(time.Minute)
	if err := g.Apply(mustParse(t, yaml("name: daily-usd"))); err != nil {
		t.Fatal(err)
	}
	held, _, err := g.Resume(ctx, g.Identify("cg-acme"), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := held.SettleHeld(ctx, gate.Charge{Cost: usd("0.001"), HTTPStatus: http.StatusOK}); err != nil {
		t.Fatal(err)
	}
	if n, d := admitN(t, g, g.Identify("cg-acme"), costmodel.Estimate{Cost: usd("0.001")}, 20); n != 9 {
		t.Errorf("a held $0.005 reservation settled at $0.001 after its budget was renamed: %d of $0.001 admitted after it (then %d), want 9", n, d.Status)
	}
}
