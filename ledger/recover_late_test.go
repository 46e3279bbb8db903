package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// A reservation left open by a run is recovered at its estimate by the
// next Open; its real settlement then arrives late (the upstream's answer
// settled through another path, or a ticket settled after the restart).
// The entry must be charged once, at the settlement, and the spend must
// count it once.
func TestLateSettlementAfterRecovery(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		at := time.Now()
		if err := l.Reserve(ctx, reservation("late", at)); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2 := open(t, cfg)
		flush(t, l2)
		if err := l2.Settle(ctx, settlement("late", 40)); err != nil {
			t.Fatal(err)
		}
		// And once more, a duplicate of the same settlement.
		if err := l2.Settle(ctx, settlement("late", 40)); err != nil {
			t.Fatal(err)
		}
		flush(t, l2)
		es := all(t, l2, ledger.Query{})
		if len(es) != 1 || es[0].Status != ledger.StatusSettled || es[0].ActualCost != 40 {
			t.Fatalf("entries %+v", es)
		}
		sp, err := l2.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil {
			t.Fatal(err)
		}
		if sp != 40 {
			t.Fatalf("Spend = %d, want 40", sp)
		}
		if err := l2.Close(); err != nil {
			t.Fatal(err)
		}
		// A third run recovers nothing more and changes nothing.
		l3 := open(t, cfg)
		flush(t, l3)
		sp, err = l3.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil {
			t.Fatal(err)
		}
		if sp != 40 {
			t.Fatalf("Spend after a third open = %d, want 40", sp)
		}
	})
}
