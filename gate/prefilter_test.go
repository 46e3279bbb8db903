package gate_test

import (
	"context"
	"testing"

	"github.com/costgate/costgate/gate"
)

// A denial of a request that counts for several requests says nothing of
// a smaller one: the prefilter refuses only what the store would, a
// request of fewer requests (or of none) goes on to the store, which
// admits it, and the prefilter's refusal of one as large carries the
// store's status and Retry-After.
func TestPrefilterRefusesOnlyWhatTheStoreWould(t *testing.T) {
	ctx := context.Background()
	g := openGate(t, "")
	c := g.Identify("cg-acme")
	req := func(n int64) *gate.Request { return &gate.Request{Caller: c, Route: "/x", Requests: n} }
	res, d := g.Reserve(ctx, req(2))
	if res == nil {
		t.Fatalf("two of three: %+v", d)
	}
	res.Settle(ctx, gate.Charge{HTTPStatus: 200})
	_, denied := g.Reserve(ctx, req(2))
	if denied.Status != 429 {
		t.Fatalf("two more of three: %+v", denied)
	}
	if d, refused := g.Prefilter(req(2)); !refused || d.Status != 429 || d.RetryAfter != denied.RetryAfter || d.Error.Code != "per-tenant" {
		t.Fatalf("prefilter of the same cost: refused %v, %+v; the store said %+v", refused, d, denied)
	}
	for _, r := range []*gate.Request{req(1), {Caller: c, Route: "/x", NoRequests: true}} {
		if d, refused := g.Prefilter(r); refused {
			t.Fatalf("prefilter of %d requests refused: %+v", r.Requests, d)
		}
	}
	if res, d := g.Reserve(ctx, req(1)); res == nil {
		t.Fatalf("the store refused the last request: %+v", d)
	}
}
