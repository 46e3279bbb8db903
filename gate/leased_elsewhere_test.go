package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// TestLeasedHeldEndedElsewhere: a tenant's leased daily budget of $1.00;
// a held reservation of $0.30 is made on replica a, spent from a's lease,
// and released, or settled at $0.05, on replica b. b refunds what Redis
// holds but not what a spent from its lease; a, told how b ended it (at
// the reservation's expiry, or at a later end asked of it), gives the
// difference back, so the budget admits what it has left: three more
// $0.30 reservations after a release or the settlement. Before, the
// $0.30 stayed spent for the day, and two were admitted.
func TestLeasedHeldEndedElsewhere(t *testing.T) {
	const budget = `  []
budgets:
  - {name: daily, plans: [small], amount: "1.00", lease: {max_share: 0.9, ttl: 30s}}
reservations: {secret: 0123456789abcdef0123}`
	for _, c := range []struct {
		name    string
		settle  bool
		expiry  bool // a learns at the reservation's expiry, not at an end asked of it
		another int  // $0.30 reservations the budget has room for afterwards
	}{
		{"released", false, false, 3},
		{"settled low", true, false, 3},
		{"released, learnt at expiry", false, true, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			store := patient(redistest.New(t))
			// a's expiry pass is the test's to run, after the expiry: its
			// own, once a second, could come later than any fixed wait on a
			// loaded machine.
			a, b := openGateStoreWith(t, store, budget, gate.ManualExpiry(gate.Options{})), openGateStore(t, store, budget)
			ca, cb := a.Identify("cg-acme"), b.Identify("cg-acme")
			reserve := func(cost string) (*gate.Reservation, bool) {
				res, d := a.Reserve(ctx, &gate.Request{Caller: ca, Route: "/v1/costgate/reserve",
					Estimate: costmodel.Estimate{Cost: usd(cost)}})
				return res, d.Allowed()
			}
			// Warm the key until a holds a lease on it that can pay the
			// held reservation: a cold key's first debits go to Redis. A
			// key's demand is measured over a millisecond at least: on a
			// quiet machine five requests took less, and no lease came.
			for leased, n := false, 0; !leased; n++ {
				if n > 0 {
					time.Sleep(2 * time.Millisecond)
				}
				warm, ok := reserve("0.01")
				if n == 5 {
					t.Fatal("no lease on the budget after five requests")
				}
				if !ok {
					t.Fatal("a warm-up request was refused")
				}
				warm.Settle(ctx, gate.Charge{Cost: usd("0.01"), HTTPStatus: 200})
				ls, _ := a.Leases()
				for _, l := range ls {
					for _, k := range l.Keys {
						leased = leased || l.Name == "daily" && k.Unspent >= int64(usd("0.30"))
					}
				}
			}
			res, ok := reserve("0.30")
			if !ok {
				t.Fatal("the held reservation was refused")
			}
			if _, ok := res.Record(ctx); !ok {
				t.Fatal("not recorded")
			}
			ttl := time.Minute
			if c.expiry {
				ttl = 2 * time.Second
			}
			id, exp := res.Hold(ttl)
			rb, _, err := b.Resume(ctx, cb, id)
			if err != nil {
				t.Fatal(err)
			}
			if c.settle {
				if _, _, err := rb.SettleHeld(ctx, gate.Charge{Cost: usd("0.05"), HTTPStatus: 200}); err != nil {
					t.Fatal(err)
				}
			} else if err := rb.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if c.expiry {
				time.Sleep(time.Until(exp) + time.Millisecond)
				a.ExpireHolds(time.Now())
			} else {
				ra, _, err := a.Resume(ctx, ca, id)
				if err != nil {
					t.Fatal(err)
				}
				switch err := ra.Release(ctx); {
				case c.settle && err != gate.ErrSettled, !c.settle && err != nil:
					t.Fatalf("a second end on a: %v", err)
				}
			}
			admitted := 0
			for range 5 {
				if r, ok := reserve("0.30"); ok {
					admitted++
					r.Settle(ctx, gate.Charge{Cost: usd("0.30"), HTTPStatus: 200})
				}
			}
			if admitted != c.another {
				t.Errorf("%d more $0.30 requests admitted, want %d: the held reservation's end, and at most $0.05 of warm-up, spent of $1.00", admitted, c.another)
			}
		})
	}
}
