package ledger_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestSaturatedCosts: an upstream that reports absurd usage is charged the
// largest cost (costmodel saturates). The spend roll-up of two such entries
// saturates too: it must neither wrap nor make the store refuse the batch,
// which would stop the flusher for good with every later entry behind it.
func TestSaturatedCosts(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.Now = func() time.Time { return t0.Add(time.Hour) }
		l := open(t, cfg)
		settle := func(id string) {
			t.Helper()
			e := reservation(id, t0)
			e.HTTPStatus, e.ActualCost = 200, math.MaxInt64
			if err := l.Settle(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		settle("one") // one batch
		flush(t, l)
		settle("two") // the next batch, onto the stored roll-up
		flush(t, l)
		settle("three") // both in one batch
		settle("four")
		flush(t, l)
		if n := len(all(t, l, ledger.Query{})); n != 4 {
			t.Errorf("%d entries, want 4", n)
		}
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day", At: t0})
		if err != nil || sp != costmodel.NanoUSD(math.MaxInt64) {
			t.Errorf("Spend = %d, %v, want %d", sp, err, int64(math.MaxInt64))
		}
	})
}
