package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// TestLedAtkSettleRefusedIsHeld: a settlement the spool refuses for a
// cause that passes (here the process out of descriptors as the segment
// must rotate; a disk full likewise) is held and appended once the spool
// takes it, without a second call: the front door that settled has
// answered and moved on. Before, it was dropped, and the request was
// recovered at its estimate at the next start: $0.000003 for $0.000009
// used. Held settlements are appended at Close too, so a clean stop
// keeps them.
func TestLedAtkSettleRefusedIsHeld(t *testing.T) {
	for _, closeFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("close=%v", closeFirst), func(t *testing.T) {
			cfg := ledger.Config{Dir: t.TempDir(), SegmentSize: 64 << 10, RetryMax: 200 * time.Millisecond,
				Now: func() time.Time { return t0.Add(time.Hour) }}
			if closeFirst {
				// No retry before Close: Close must append it. The
				// flusher's read failed too and waits as long, so the
				// close's flush is cut short: the next open replays.
				cfg.RetryMin, cfg.RetryMax, cfg.CloseTimeout = time.Minute, time.Minute, 300*time.Millisecond
			}
			l, err := ledger.Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := l.Reserve(ctx, reservation("open", t0)); err != nil {
				t.Fatal(err)
			}
			restore, refused := ledAtkRotationRefused(t, l, cfg.Dir)
			if refused == nil {
				restore()
				t.Fatal("the spool rotated with no descriptor to spare")
			}
			settleErr := l.Settle(ctx, settlement("open", 9_000))
			if closeFirst {
				// The descriptors come back as the process stops.
				time.AfterFunc(100*time.Millisecond, restore)
				time.Sleep(300 * time.Millisecond)
			} else {
				restore()
			}
			if settleErr == nil {
				t.Fatal("the settlement was taken with no descriptor to rotate the spool")
			}
			t.Logf("while out of descriptors: %v", settleErr)
			if closeFirst {
				t.Logf("close: %v", l.Close())
				if l, err = ledger.Open(ctx, cfg); err != nil {
					t.Fatal(err)
				}
			}
			defer l.Close()
			deadline := time.Now().Add(10 * time.Second)
			for {
				flush(t, l)
				e := ledAtkByID(t, l)["open"]
				if e.Status == ledger.StatusSettled && e.ActualCost == 9_000 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the request whose settlement the spool refused: %s at %d, want settled at 9000 (its estimate is 3000)", e.Status, e.ActualCost)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
