package ledger_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// TestExpiredIsFinal: a reservation settled as expired (the reserve/settle
// API's, left unsettled) is final at what it was charged, on every store,
// and a later settlement does not change it.
func TestExpiredIsFinal(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.Now = func() time.Time { return t0.Add(time.Hour) }
		l := open(t, cfg)
		e := reservation("held", t0)
		if err := l.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
		e.Status, e.Actual, e.ActualCost = ledger.StatusExpired, e.Estimated, e.EstimatedCost
		if err := l.Settle(ctx, e); err != nil {
			t.Fatal(err)
		}
		late := reservation("held", t0)
		late.ActualCost = 1
		if err := l.Settle(ctx, late); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		got := all(t, l, ledger.Query{})
		if len(got) != 1 || got[0].Status != ledger.StatusExpired || got[0].ActualCost != e.EstimatedCost || !got[0].Status.Final() {
			t.Fatalf("entries %+v; want one, expired at its estimate %v", got, e.EstimatedCost)
		}
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: got[0].Tenant, Period: "day", At: t0})
		if err != nil || sp != e.EstimatedCost {
			t.Errorf("Spend = %v, %v; want %v", sp, err, e.EstimatedCost)
		}
	})
}

// TestUpgradeKeepsEntries: an embedded ledger made by the first schema
// (whose status check knows no 'expired') opens with every entry, and then
// takes an expired settlement.
func TestUpgradeKeepsEntries(t *testing.T) {
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile("migrations/sqlite/001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(string(schema)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA user_version = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO ledger_entries VALUES ('old','n','acme','','k','r','u','m','', 'allow','','','settled',200,
		1,0,0,2,0,0, 1,0,0,2,0,0, 5,5,5, 1796000000000000, 1796000001000000)`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	ctx := context.Background()
	l := open(t, ledger.Config{Dir: dir})
	e := reservation("held", t0)
	if err := l.Reserve(ctx, e); err != nil {
		t.Fatal(err)
	}
	e.Status, e.Actual, e.ActualCost = ledger.StatusExpired, e.Estimated, e.EstimatedCost
	if err := l.Settle(ctx, e); err != nil {
		t.Fatal(err)
	}
	flush(t, l)
	got := map[string]ledger.Status{}
	for _, x := range all(t, l, ledger.Query{}) {
		got[x.RequestID] = x.Status
	}
	if got["old"] != ledger.StatusSettled || got["held"] != ledger.StatusExpired {
		t.Errorf("entries after the upgrade: %v; want old settled and held expired", got)
	}
}
