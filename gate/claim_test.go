package gate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// TestHeldEndsRaceAcrossReplicas: two replicas share Redis and the
// reservation secret; each held reservation is settled on one and
// released on the other at the same moment, and a third end (a second
// settle) follows. Exactly one end wins per reservation, the others are
// told which, and the limit moves by the winner's settlement alone. The
// claim and the settlement go to Redis in one script call: no separate
// SETNX claim is made.
func TestHeldEndsRaceAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	const limits = `  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000, period: 1h}
reservations: {secret: 0123456789abcdef0123}`
	a, b := openRedisGate(t, srv.URL, limits), openRedisGate(t, srv.URL, limits)
	ca, cb := a.Identify("cg-acme"), b.Identify("cg-acme")
	const n = 40
	ids := make([]string, n)
	for i := range ids {
		res, d := a.Reserve(ctx, &gate.Request{Caller: ca, Route: "/v1/costgate/reserve",
			Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 100}}})
		if res == nil {
			t.Fatalf("refused: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		ids[i], _ = res.Hold(time.Minute)
	}
	settled := make([]bool, n)
	released := make([]bool, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			r, _, err := a.Resume(ca, id)
			if err != nil {
				t.Error(err)
				return
			}
			_, again, err := r.SettleHeld(ctx, gate.Charge{Usage: costmodel.Usage{InputTokens: 30}, HTTPStatus: 200})
			switch {
			case err == nil && !again:
				settled[i] = true
			case errors.Is(err, gate.ErrReleased):
			default:
				t.Errorf("settle %d: again %v, %v", i, again, err)
			}
		})
		wg.Go(func() {
			r, _, err := b.Resume(cb, id)
			if err != nil {
				t.Error(err)
				return
			}
			switch err := r.Release(ctx); {
			case err == nil:
				released[i] = true
			case errors.Is(err, gate.ErrSettled):
			default:
				t.Errorf("release %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	var used int64
	for i := range ids {
		if settled[i] == released[i] {
			t.Fatalf("reservation %d: settled %v, released %v; want exactly one", i, settled[i], released[i])
		}
		if settled[i] {
			used += 30
		}
		// A later settle on either replica is told the first end.
		r, _, err := b.Resume(cb, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		got, again, err := r.SettleHeld(ctx, gate.Charge{Usage: costmodel.Usage{InputTokens: 90}, HTTPStatus: 200})
		if settled[i] && (err != nil || !again) || released[i] && !errors.Is(err, gate.ErrReleased) {
			t.Errorf("reservation %d, a third end: %+v again %v %v", i, got, again, err)
		}
	}
	res, d := b.Reserve(ctx, &gate.Request{Caller: cb, Route: "/x", States: true, Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
	if res != nil {
		res.Cancel(ctx)
	}
	if len(d.Limits) != 1 || d.Limits[0].Remaining != 1000000-used-1 {
		t.Fatalf("after the races: %+v; want %d tokens used", d, used)
	}
	t.Logf("%d settled first, %d released first", used/30, n-used/30)
	if !srv.Private() {
		return // a shared server's statistics count other tests' calls
	}
	stats, err := srv.Client(t).Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stats, "cmdstat_setnx:") {
		t.Errorf("a claim was made apart from its settlement:\n%s", stats)
	}
}
