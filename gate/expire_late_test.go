package gate

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestExpiryClaimedByLateResume: a held reservation resumed on another
// replica before its expiry, and settled there only after it, ends once
// whatever comes between. When a second resume past the expiry was told
// it expired, the late settlement is told so too (not settled), and the
// maker's expiry pass charges the estimate; when the late settlement
// comes first, it wins, a resume after it is told the settlement, and
// the expiry pass charges nothing more. Before, the second resume
// answered expired without recording it, the late settlement then won:
// one reservation, answered expired to one caller and settled to another.
func TestExpiryClaimedByLateResume(t *testing.T) {
	srv := redistest.New(t)
	store := fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}", srv.URL)
	limits := store + `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000, period: 24h}`
	// The test runs the maker's expiry pass itself, after the late
	// settlement or the second resume: the gates' own passes, once a
	// second, could come between the expiry and either, whatever phase
	// the test aims at, on a loaded machine.
	manual := Options{expireEvery: -1}
	maker, other := openAcmeWith(t, limits, manual), openAcmeWith(t, limits, manual)
	ctx := context.Background()
	cm, co := maker.Identify("cg-acme"), other.Identify("cg-acme")
	var used int64
	for _, settleFirst := range []bool{false, true} {
		res, d := maker.Reserve(ctx, &Request{Caller: cm, Route: "/v1/costgate/reserve",
			Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 100}}})
		if res == nil {
			t.Fatalf("refused: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		id, exp := res.Hold(2 * time.Second)
		late, _, err := other.Resume(ctx, co, id) // before the expiry: open
		if err != nil {
			t.Fatalf("resume before the expiry (%v left): %v", time.Until(exp), err)
		}
		time.Sleep(time.Until(exp) + time.Millisecond) // Resume reads the wall clock
		settle := func() (Charge, bool, error) {
			return late.SettleHeld(ctx, Charge{Usage: costmodel.Usage{InputTokens: 30}, HTTPStatus: 200})
		}
		if settleFirst {
			if got, again, err := settle(); err != nil || again {
				t.Fatalf("a late settlement nobody raced: %+v again %v %v", got, again, err)
			}
			r, _, err := other.Resume(ctx, co, id)
			if err != nil {
				t.Fatalf("resume after the late settlement: %v; want it told the settlement", err)
			}
			if got, again, err := r.SettleHeld(ctx, Charge{Usage: costmodel.Usage{InputTokens: 90}, HTTPStatus: 200}); err != nil || !again || got.Cost != 0 && got.Usage.InputTokens != 30 {
				t.Errorf("a settlement after the late one: %+v again %v %v", got, again, err)
			}
			used += 30
		} else {
			if _, _, err := other.Resume(ctx, co, id); !errors.Is(err, ErrExpired) {
				t.Fatalf("resume past the expiry: %v; want ErrExpired", err)
			}
			if got, again, err := settle(); !errors.Is(err, ErrExpired) {
				t.Errorf("the late settlement after a resume was told it expired: %+v again %v %v; want ErrExpired", got, again, err)
			}
			used += 100
		}
		maker.expireHolds(time.Now())
		if err := maker.ledger.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		e, ok, err := maker.ledger.Lookup(ctx, res.ID())
		if !settleFirst && (err != nil || !ok || e.Status != ledger.StatusExpired || e.Actual.InputTokens != 100) {
			t.Errorf("the maker's entry of the expired reservation: %+v %v %v; want expired at its estimate", e, ok, err)
		}
		probe, d := maker.Reserve(ctx, &Request{Caller: cm, Route: "/x", States: true, Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
		if probe != nil {
			probe.Cancel(ctx)
		}
		if len(d.Limits) != 1 || d.Limits[0].Remaining != 1000000-used-1 {
			t.Fatalf("settle first %v: tpm %+v; want %d used", settleFirst, d.Limits, used)
		}
	}
}
