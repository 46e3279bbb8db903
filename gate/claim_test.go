package gate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
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
	// Timeouts a loaded machine does not reach: this test is of the race,
	// not of a slow store (TestHeldEndOfUnknownOutcome is). One request a
	// script call, so that the monitor's count of calls tells whether it
	// saw them all (batched, concurrent ends share calls).
	store := fmt.Sprintf("{redis: %q, timeout: 5s, queue_timeout: 5s, max_batch: 1}", srv.URL)
	a, b := openGateStore(t, store, heldLimits), openGateStore(t, store, heldLimits)
	mon := redistest.NewMonitor(t, srv.Addr)
	ca, cb := a.Identify("cg-acme"), b.Identify("cg-acme")
	const n = 40
	ids, _ := hold(t, a, ca, n)
	settled := make([]bool, n)
	released := make([]bool, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			r, _, err := a.Resume(context.Background(), ca, id)
			if err != nil {
				t.Error(err)
				return
			}
			settled[i] = settleFirst(t, r, i)
		})
		wg.Go(func() {
			r, _, err := b.Resume(context.Background(), cb, id)
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
		r, _, err := b.Resume(context.Background(), cb, ids[i])
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
	mon.CaughtUp(t, srv.Addr)
	if n := mon.Count(`"set"`, `"nx"`); n != 0 {
		t.Errorf("%d claims made apart from their settlement (SET NX), want none", n)
	}
	if n := mon.Count(`"evalsha"`); n < 2*len(ids) {
		t.Errorf("%d script calls seen; the monitor misses calls", n)
	}
}

// TestHeldEndOfUnknownOutcome: a replica whose claimed settlement fails
// while Redis is up (its call shed from a busy queue, or unanswered in
// time) does not decide alone: it claims on its own, and a release on
// another replica that comes after it loses. Exactly one end per
// reservation, and the limit never gets back more than the winner's end
// returns. Redis is paused (CLIENT PAUSE) so that the
// settling replica's calls queue past its queue_timeout unsent, or, in
// the second case, get no reply within its timeout (a settlement that
// finds the store idle runs on its caller's goroutine, ended by the
// connection's deadline).
func TestHeldEndOfUnknownOutcome(t *testing.T) {
	for _, tc := range []struct {
		name, store string
		pause       int // ms
	}{
		{"shed unsent", "timeout: 5s, queue_timeout: 1ms", 300},
		{"unanswered", "timeout: 100ms, queue_timeout: 5s", 1000},
	} {
		t.Run(tc.name, func(t *testing.T) { heldEndOfUnknownOutcome(t, tc.store, tc.pause) })
	}
}

func heldEndOfUnknownOutcome(t *testing.T, store string, pause int) {
	ctx := context.Background()
	srv := redistest.New(t)
	h, b := openGateStore(t, patient(srv), heldLimits), openGateStore(t, patient(srv), heldLimits)
	a := openGateStore(t, fmt.Sprintf("{redis: %q, %s, breaker_failures: 100000}", srv.URL, store), heldLimits)
	const n = 20
	ids, _ := hold(t, h, h.Identify("cg-acme"), n)
	resume := func(g *gate.Gate, id string) *gate.Reservation {
		r, _, err := g.Resume(context.Background(), g.Identify("cg-acme"), id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", pause, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	// One settlement is sent and waits out the pause (or its timeout);
	// the others queue behind it and are shed unsent (or sent in turn).
	settled := make([]bool, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		r := resume(a, id)
		wg.Go(func() {
			settled[i] = settleFirst(t, r, i)
		})
	}
	wg.Wait()
	var used int64
	for i, id := range ids {
		err := resume(b, id).Release(ctx)
		released := err == nil
		if !released && !errors.Is(err, gate.ErrSettled) {
			t.Errorf("release %d: %v", i, err)
		}
		if settled[i] == released {
			t.Errorf("reservation %d: settled %v, released %v; want exactly one", i, settled[i], released)
		}
		if settled[i] {
			used += 30
		}
	}
	// A settlement the settling replica could not send leaves its
	// reservation at its estimate (more spent, never less); the limit must
	// never get back more than the ends returned.
	res, d := b.Reserve(ctx, &gate.Request{Caller: b.Identify("cg-acme"), Route: "/x", States: true, Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
	if res != nil {
		res.Cancel(ctx)
	}
	if len(d.Limits) != 1 || d.Limits[0].Remaining > 1000000-used-1 {
		t.Fatalf("after the ends: %+v; want at most %d tokens left", d, 1000000-used-1)
	}
}

// settleFirst settles held reservation i, r, at 30 input tokens and
// tells whether this settlement was its first end; a release that came
// first is no error.
func settleFirst(t *testing.T, r *gate.Reservation, i int) bool {
	_, again, err := r.SettleHeld(context.Background(), gate.Charge{Usage: costmodel.Usage{InputTokens: 30}, HTTPStatus: 200})
	switch {
	case err == nil && !again:
		return true
	case errors.Is(err, gate.ErrReleased):
	default:
		t.Errorf("settle %d: again %v, %v", i, again, err)
	}
	return false
}

// heldLimits is the limit and secret of the held-reservation races: a
// day's window (a fixed window ends with the wall clock's day), far from
// full.
const heldLimits = `  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000, period: 24h}
reservations: {secret: 0123456789abcdef0123}`

// patient is a store section on srv with timeouts no loaded machine
// reaches.
func patient(srv *redistest.Server) string {
	return fmt.Sprintf("{redis: %q, timeout: 5s, queue_timeout: 5s}", srv.URL)
}

// openGateStore is openRedisGate with store, a YAML flow mapping, as the
// store section.
func openGateStore(t *testing.T, store, limits string) *gate.Gate {
	t.Helper()
	return openGateStoreWith(t, store, limits, gate.Options{})
}

// openGateStoreWith is openGateStore with opts.
func openGateStoreWith(t *testing.T, store, limits string, opts gate.Options) *gate.Gate {
	t.Helper()
	return openYAMLWith(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: %s
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
%s`, t.TempDir(), store, limits), opts)
}

// TestHeldEndsThroughAnOutage: held reservations settled and released
// while Redis is down are decided by the replica alone and billed; after
// Redis comes back empty, a settlement claims and settles in one call;
// every later end is told the first one, and the ledger has one final
// entry per reservation with its own usage.
func TestHeldEndsThroughAnOutage(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	g := openRedisGate(t, srv.URL, `  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000, period: 24h}
reservations: {secret: 0123456789abcdef0123}`)
	c := g.Identify("cg-acme")
	ids, reqs := hold(t, g, c, 3)
	resume := func(i int) *gate.Reservation {
		r, _, err := g.Resume(context.Background(), c, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	srv.Stop(t)
	if got, again, err := resume(0).SettleHeld(ctx, gate.Charge{Usage: costmodel.Usage{InputTokens: 30}, HTTPStatus: 200}); err != nil || again || got.Usage.InputTokens != 30 {
		t.Fatalf("settle with Redis down: %+v again %v %v", got, again, err)
	}
	if err := resume(1).Release(ctx); err != nil {
		t.Fatalf("release with Redis down: %v", err)
	}
	srv.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, again, err := resume(2).SettleHeld(ctx, gate.Charge{Usage: costmodel.Usage{InputTokens: 50}, HTTPStatus: 200})
		if err == nil && !again && got.Usage.InputTokens == 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("settle after Redis came back: %+v again %v %v", got, again, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got, again, err := resume(0).SettleHeld(ctx, gate.Charge{Usage: costmodel.Usage{InputTokens: 99}, HTTPStatus: 200}); err != nil || !again || got.Usage.InputTokens != 30 {
		t.Errorf("a second settle: %+v again %v %v; want the first's 30 tokens", got, again, err)
	}
	if _, _, err := resume(1).SettleHeld(ctx, gate.Charge{Usage: costmodel.Usage{InputTokens: 99}, HTTPStatus: 200}); !errors.Is(err, gate.ErrReleased) {
		t.Errorf("settle after a release: %v, want ErrReleased", err)
	}
	if err := resume(2).Release(ctx); !errors.Is(err, gate.ErrSettled) {
		t.Errorf("release after a settle: %v, want ErrSettled", err)
	}
	if err := g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		status ledger.Status
		input  int64
	}{reqs[0]: {ledger.StatusSettled, 30}, reqs[1]: {ledger.StatusFailed, 0}, reqs[2]: {ledger.StatusSettled, 50}}
	seen := 0
	for _, e := range p.Entries {
		w, ok := want[e.RequestID]
		if !ok {
			continue
		}
		seen++
		if e.Status != w.status || e.Actual.InputTokens != w.input {
			t.Errorf("entry %s: %s with %d input tokens; want %s with %d", e.RequestID, e.Status, e.Actual.InputTokens, w.status, w.input)
		}
	}
	if seen != 3 {
		t.Errorf("%d of the 3 entries in the ledger", seen)
	}
}

// hold makes n held reservations of 100 input tokens each for c on g, for
// a minute, and returns their ids and request ids.
func hold(t *testing.T, g *gate.Gate, c *gate.Caller, n int) (ids, reqs []string) {
	t.Helper()
	ctx := context.Background()
	for range n {
		res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/costgate/reserve",
			Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 100}}})
		if res == nil {
			t.Fatalf("refused: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		id, _ := res.Hold(time.Minute)
		ids, reqs = append(ids, id), append(reqs, res.ID())
	}
	return ids, reqs
}
