package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestExtendRaisesTheEstimate: a stream's increments (Extend) raise its
// open entry's estimate (and the tenant's spend), so that a process that dies mid-stream is recovered at what its
// limits were debited, not at its first reservation; an extension below
// the estimate, or of an entry already final, changes nothing.
func TestExtendRaisesTheEstimate(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		at := time.Now()
		spend := func() costmodel.NanoUSD {
			t.Helper()
			sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
			if err != nil {
				t.Fatal(err)
			}
			return sp
		}
		extend := func(l *ledger.Ledger, id string, out int64, cost costmodel.NanoUSD) {
			t.Helper()
			e := reservation(id, at)
			e.Estimated.OutputTokens, e.EstimatedCost = out, cost
			if err := l.Extend(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []string{"stream", "done"} {
			if err := l.Reserve(ctx, reservation(id, at)); err != nil {
				t.Fatal(err)
			}
		}
		extend(l, "stream", 456, 5_000) // the guard let 256 more output tokens through
		flush(t, l)
		if sp := spend(); sp != 5_000+3_000 {
			t.Fatalf("spend: %d, want the extended estimate counted (8000)", sp)
		}
		extend(l, "stream", 300, 4_000) // late, below: nothing
		if err := l.Settle(ctx, settlement("done", 7)); err != nil {
			t.Fatal(err)
		}
		extend(l, "done", 999, 9_999) // after its settlement: nothing
		flush(t, l)
		byID := map[string]ledger.Entry{}
		for _, e := range all(t, l, ledger.Query{Tenant: "acme"}) {
			byID[e.RequestID] = e
		}
		if e := byID["stream"]; e.Status != ledger.StatusReserved || e.EstimatedCost != 5_000 || e.Estimated.OutputTokens != 456 {
			t.Errorf("stream after its extensions: %+v, want reserved at 5000 with 456 output tokens", e)
		}
		if e := byID["done"]; e.Status != ledger.StatusSettled || e.ActualCost != 7 || e.EstimatedCost != 3_000 {
			t.Errorf("done: %+v, want settled at 7, its estimate 3000 kept", e)
		}
		if sp := spend(); sp != 5_000+7 {
			t.Fatalf("spend after a flush: %d, want 5007", sp)
		}
		// Extended again, then the process dies before the flush: the
		// next one replays the spool and recovers the stream at its last
		// extension.
		extend(l, "stream", 712, 7_000)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2 := open(t, cfg)
		flush(t, l2)
		e, ok, err := l2.Lookup(ctx, "stream")
		if err != nil || !ok || e.Status != ledger.StatusRecovered || e.ActualCost != 7_000 || e.Actual.OutputTokens != 712 {
			t.Errorf("stream after a restart: %+v %v %v, want recovered at its last extension (7000, 712 output tokens)", e, ok, err)
		}
	})
}
