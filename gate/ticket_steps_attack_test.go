package gate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// TestStepsAtkHeldTicketKeepsTheModel: a reservation held by the reserve
// API (a body with an Opus advisor, estimated) is settled on another
// replica, which rebuilds it from its ticket. The ticket carried each
// item's limit name and key, not the model it is for: the rebuilt Opus
// item was the limit itself, charged the whole answer (53,800 tokens
// where Opus ran 41,800), and before the items of other models it had no
// Opus item at all (the answer's Opus steps were never charged to Opus).
// The ticket carries the model of such an item.
func TestStepsAtkHeldTicketKeepsTheModel(t *testing.T) {
	ctx := context.Background()
	const full = 1_000_000
	srv := redistest.New(t)
	limit := fmt.Sprintf("{name: per-model, dimensions: [tenant, model], unit: tokens, rate: %d, period: 1h, algorithm: fixed_window}", full)
	a := stepsGate(t, srv.URL, t.TempDir(), limit)
	b := stepsGate(t, srv.URL, t.TempDir(), limit)
	ca := a.Identify("cg-acme")
	est := estimateBody(t, ca, `{"model":"claude-haiku-4-5","max_tokens":1000,"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}],`+stepsMsgs+`}`)
	res, d := a.Reserve(ctx, &gate.Request{Caller: ca, Route: "/v1/costgate/reserve", Estimate: est, Requests: 1, Open: true})
	if res == nil {
		t.Fatalf("refused: %+v", d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatal(d)
	}
	id, _ := res.Hold(time.Minute)
	cb := b.Identify("cg-acme")
	rb, _, err := b.Resume(ctx, cb, id)
	if err != nil {
		t.Fatal(err)
	}
	u, err := costmodel.ParseUsage(costmodel.AnthropicMessages, []byte(stepsAnswer))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rb.SettleHeld(ctx, gate.Charge{Usage: u, Cost: cb.Estimator().Cost("claude-haiku-4-5", u), HTTPStatus: 200}); err != nil {
		t.Fatal(err)
	}
	if got := full - remaining(t, b, "per-model", "{acme}:tenant=acme:model=claude-opus-4-6"); got != 41_800 {
		t.Errorf("Opus's key was charged %d tokens, want the 41,800 its advisor step ran", got)
	}
}
