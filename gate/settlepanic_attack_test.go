package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestSettleAtkChargePanics: the front door works out a request's charge
// from the upstream's answer when it settles (SettleLater's c); should
// that reading panic on some answer, the settlement's goroutine died
// with it (and with it the process), or, settled in process, the
// caller's: the entry stayed reserved and the limits kept the
// reservation alone, not the increments the stream had been extended by.
// Must hold: the entry is settled at the reservation and its increments,
// on both stores.
func TestSettleAtkChargePanics(t *testing.T) {
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const model = "gpt-4o-mini"
	u := costmodel.Usage{InputTokens: 100, OutputTokens: 100}
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			url := ""
			if store == "redis" {
				url = redistest.New(t).URL
			}
			g := openExtendGate(t, url)
			ctx := context.Background()
			res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions",
				Estimate: costmodel.Estimate{Model: model, Stream: true, Usage: u, Cost: est.Cost(model, u)}})
			if res == nil {
				t.Fatalf("refused: %+v", d)
			}
			if d, ok := res.Record(ctx); !ok {
				t.Fatalf("record: %+v", d)
			}
			if d, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: 100}); !ok {
				t.Fatalf("extend: %+v", d)
			}
			done := make(chan struct{})
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Errorf("SettleLater panicked: %v", v)
						close(done)
					}
				}()
				res.SettleLater(func() gate.Charge { panic("reading the answer") }, func() { close(done) })
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the settlement never ended")
			}
			if err := g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			e, found, err := g.Ledger().Lookup(ctx, res.ID())
			if err != nil || !found {
				t.Fatalf("entry: found %v, %v", found, err)
			}
			held := costmodel.Usage{InputTokens: 100, OutputTokens: 200}
			if e.Status != ledger.StatusSettled || e.Actual.OutputTokens < held.OutputTokens || e.ActualCost < est.Cost(model, held) {
				t.Errorf("entry %s, billed %d output tokens, %v; want settled at the reservation and its increment: %d, %v",
					e.Status, e.Actual.OutputTokens, e.ActualCost, held.OutputTokens, est.Cost(model, held))
			}
			if got := used(t, g)["output"]; got != held.OutputTokens {
				t.Errorf("the output limit holds %d, want %d", got, held.OutputTokens)
			}
		})
	}
}
