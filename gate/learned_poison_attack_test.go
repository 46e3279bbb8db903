package gate_test

import (
	"context"
	"testing"
)

// TestLearnedPoisonAttackStaysWithinTheTenant: what one tenant teaches and
// holds in flight moves no other tenant's reservations. Tenant acme teaches
// its key 10-token answers and then holds learned reservations until its
// max_exposure is used up; tenant globex, cold on the same model, route and
// shape, still reserves its whole output limit, and once taught it gets
// its own learned reservation however much of acme's exposure is held.
func TestLearnedPoisonAttackStaysWithinTheTenant(t *testing.T) {
	ctx := context.Background()
	// max_exposure covers one learned reservation of max_tokens 1000
	// (about $0.0098 unreserved), not two.
	g := openReserveGate(t, t.TempDir(), "", "p95", "", `max_exposure: "0.011"`)
	for range 25 {
		serve(t, g, chatRequest(t, g, "cg-acme", 1000), 10)
	}
	if got, _ := serve(t, g, chatRequest(t, g, "cg-globex", 1000), 900); got != 1000 {
		t.Fatalf("globex, cold, reserved %d output tokens after acme taught its own key 10; want its whole limit, 1000", got)
	}

	held, _ := g.Reserve(ctx, chatRequest(t, g, "cg-acme", 1000))
	if held == nil || held.Request().Estimate.Usage.OutputTokens >= 1000 {
		t.Fatal("acme's first reservation in flight is not learned")
	}
	defer held.Cancel(ctx)
	spent, _ := g.Reserve(ctx, chatRequest(t, g, "cg-acme", 1000))
	if spent == nil || spent.Request().Estimate.Usage.OutputTokens != 1000 {
		t.Fatal("acme's second reservation in flight passed its max_exposure")
	}
	defer spent.Cancel(ctx)

	for range 25 {
		serve(t, g, chatRequest(t, g, "cg-globex", 1000), 20)
	}
	res, d := g.Reserve(ctx, chatRequest(t, g, "cg-globex", 1000))
	if res == nil {
		t.Fatalf("globex refused: %+v", d)
	}
	defer res.Cancel(ctx)
	if got := res.Request().Estimate.Usage.OutputTokens; got > 100 {
		t.Errorf("globex reserved %d output tokens with its key learned at 20 and none of its own in flight: "+
			"acme's exposure in flight holds globex to its whole limit", got)
	}
}
