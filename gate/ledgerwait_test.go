package gate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/ledger"
)

// TestLedgerDownStartAndStop: a gate that starts with its ledger's
// database down serves at once; one that stops with the database down
// waits ledger.close_timeout for its spool, no longer (before, always
// 10 s), and the next start on the same data_dir writes what the spool
// kept, once.
func TestLedgerDownStartAndStop(t *testing.T) {
	ctx := context.Background()
	pg := pgtest.NewPrivate(t)
	yaml := fmt.Sprintf(`
admin_token: t
data_dir: %q
ledger: {dsn: %q, close_timeout: 3s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
`, t.TempDir(), pg.URL())
	// The schema is made while the database answers; then it goes down.
	first, err := gate.Open(ctx, mustParse(t, yaml), gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	pg.Stop()

	began := time.Now()
	g, err := gate.Open(ctx, mustParse(t, yaml), gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("a start with the database down took %v; want it to serve at once", d)
	}
	res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/x",
		Estimate: costmodel.Estimate{Cost: 2_000}})
	if res == nil {
		t.Fatalf("refused with the database down: %+v", d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatal(d)
	}
	res.Settle(ctx, gate.Charge{HTTPStatus: 200, Cost: 1_500})
	req := res.ID()

	began = time.Now()
	err = g.Close()
	if d := time.Since(began); d < 2900*time.Millisecond || d > 6*time.Second {
		t.Errorf("a stop with the database down took %v; want about close_timeout, 3s", d)
	}
	if err == nil {
		t.Error("a stop that left the spool undrained returned no error")
	}

	pg.Start()
	again := openYAML(t, yaml)
	if err := again.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e, ok, err := again.Ledger().Lookup(ctx, req)
	if err != nil || !ok {
		t.Fatalf("the entry the spool kept: %v %v", ok, err)
	}
	if e.Status != ledger.StatusSettled || e.ActualCost != 1_500 {
		t.Errorf("the entry the spool kept: %s at %v; want settled at 1500", e.Status, e.ActualCost)
	}
	if spend, err := again.Ledger().Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"}); err != nil || spend != 1_500 {
		t.Errorf("acme spent %v today (%v); want 1500, once", spend, err)
	}
}
