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
