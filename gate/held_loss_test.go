package gate

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestHeldSettledBeforeALossIsNotSettledAgain: a held reservation settled
// on one replica, its claim then lost with Redis's data, and settled again
// on another replica (any replica may settle): the ledger, shared, says it
// was settled, so the second settlement is answered as one already made
// and refunds nothing. A token bucket gives back whatever a settlement
// names: settled again, the reservation's 90 unused tokens were handed
// back a second time, past what the ledger says acme spent, which the
// bucket is restored to after the loss.
func TestHeldSettledBeforeALossIsNotSettledAgain(t *testing.T) {
	ctx := context.Background()
	dsn, srv := pgtest.New(t), redistest.New(t)
	const extra = `limits:
  - {name: tb, dimensions: [tenant], unit: tokens, algorithm: token_bucket, rate: 100, period: 1h}
reservations: {secret: 0123456789abcdef0123}
`
	a, b := acmeGate(t, dsn, srv, extra), acmeGate(t, dsn, srv, extra)
	tokens := func(n int64) costmodel.Estimate {
		return costmodel.Estimate{Usage: costmodel.Usage{InputTokens: n}}
	}
	admit := func(g *Gate, n int64) *Reservation {
		res, _ := g.Reserve(ctx, &Request{Caller: g.Identify("cg-acme"), Route: "/v1/costgate/reserve", Estimate: tokens(n)})
		if res != nil {
			if d, ok := res.Record(ctx); !ok {
				t.Fatal(d)
			}
		}
		return res
	}
	res := admit(a, 100)
	if res == nil {
		t.Fatal("the first reservation was refused")
	}
	id, _ := res.Hold(time.Minute)
	if _, again, err := res.SettleHeld(ctx, Charge{Usage: costmodel.Usage{InputTokens: 10}, HTTPStatus: 200}); err != nil || again {
		t.Fatalf("settle: again %v, %v", again, err)
	}
	if admit(a, 90) == nil {
		t.Fatal("the 90 tokens given back were refused")
	}
	if err := a.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// The bucket is restored from the ledger after the loss: acme spent
	// its 100 tokens (10 settled, 90 reserved) within the hour it takes
	// to refill.
	if admit(b, 10) != nil {
		t.Fatal("the bucket restored after the loss admitted 10 tokens of the 100 acme had spent")
	}
	r, _, err := b.Resume(ctx, b.Identify("cg-acme"), id)
	if err != nil {
		t.Fatal(err)
	}
	got, again, err := r.SettleHeld(ctx, Charge{Usage: costmodel.Usage{InputTokens: 10}, HTTPStatus: 200})
	if err != nil || !again || got.Usage.InputTokens != 10 {
		t.Errorf("the second settlement: %+v again %v, %v; want the first one's, again", got, again, err)
	}
	if err := r.Release(ctx); err != ErrSettled {
		t.Errorf("a release after it: %v, want ErrSettled", err)
	}
	// What a second settlement would have given back is not there.
	var n int64
	for admit(b, 10) != nil {
		if n += 10; n > 1000 {
			break
		}
	}
	if n > 0 {
		t.Errorf("%d tokens admitted past what acme spent: the settlement refunded its reservation again", n)
	}
}
