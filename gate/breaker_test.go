package gate

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// opRecorder is the guarded store's telemetry: it keeps the ops it is told.
type opRecorder struct{ ops []telemetry.StoreOp }

func (r *opRecorder) StoreOp(op telemetry.StoreOp, _ time.Duration, _ error) {
	r.ops = append(r.ops, op)
}

// Every call through the guarded store is recorded under its own op, lease
// renewals and resets included (not "other").
func TestGuardedStoreRecordsEachOp(t *testing.T) {
	ctx := context.Background()
	mem := weighted.NewMemory(weighted.MemoryConfig{})
	rec := &opRecorder{}
	g := &guardedStore{store: mem, restorer: mem, breaker: newBreaker(5, time.Second, time.Now), timeout: time.Second, tel: rec}
	lim := weighted.Limit{Name: "slots", Algorithm: weighted.Concurrency, Rate: 2, Period: time.Minute}
	items := []weighted.Item{{Limit: lim, Key: "{acme}:tenant=acme", Cost: 1}}

	steps := []struct {
		want telemetry.StoreOp
		call func() error
	}{
		{telemetry.StoreRestore, func() error { return g.Restore(ctx, items, []int64{0}) }},
		{telemetry.StoreDebit, func() error { _, err := g.Debit(ctx, "r1", items); return err }},
		{telemetry.StoreRenew, func() error { return g.Renew(ctx, "r1", items) }},
		{telemetry.StoreSettle, func() error { return g.Settle(ctx, "r1", items, []int64{1}) }},
		{telemetry.StoreCancel, func() error { return g.Cancel(ctx, "r1", items) }},
		{telemetry.StorePeek, func() error { _, err := g.Peek(ctx, items); return err }},
		{telemetry.StoreReset, func() error { return g.Reset(ctx, items) }},
	}
	var want []telemetry.StoreOp
	for _, s := range steps {
		if err := s.call(); err != nil {
			t.Fatalf("%s: %v", s.want, err)
		}
		want = append(want, s.want)
	}
	if !slices.Equal(rec.ops, want) {
		t.Errorf("recorded ops %v, want %v", rec.ops, want)
	}
	if got := g.breaker.State(); got != telemetry.BreakerClosed {
		t.Errorf("breaker %q after successful calls, want %q", got, telemetry.BreakerClosed)
	}
}
