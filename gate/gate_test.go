package gate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/weighted"
)

// openGate opens a gate on the in-memory store and an embedded ledger in
// a temporary directory: no socket.
func openGate(t *testing.T, extra string) *gate.Gate {
	t.Helper()
	return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: alice}]}
  - {name: globex, plan: small, keys: [{id: globex-key, key: cg-globex}]}
limits:
  - {name: per-tenant, dimensions: [tenant], unit: requests, rate: 3, period: 1h}
budgets:
  - {name: daily, scope: tenant, amount: "0.01"}
%s`, t.TempDir(), extra))
}

// openYAML opens a gate on the configuration yaml, closed when the test
// ends.
func openYAML(tb testing.TB, yaml string) *gate.Gate {
	tb.Helper()
	return openYAMLWith(tb, yaml, gate.Options{})
}

// openYAMLWith is openYAML with opts.
func openYAMLWith(tb testing.TB, yaml string, opts gate.Options) *gate.Gate {
	tb.Helper()
	g, err := gate.Open(context.Background(), mustParse(tb, yaml), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g
}

func usd(s string) costmodel.NanoUSD {
	n, err := costmodel.ParseUSD(s)
	if err != nil {
		panic(err)
	}
	return n
}

// A request limit admits three, then refuses with 429, the RateLimit
// fields of the limit and a Retry-After; a Check request debits nothing.
func TestReserveRefusesWithTheLimitsFields(t *testing.T) {
	ctx := context.Background()
	g := openGate(t, "")
	c := g.Identify("cg-acme")
	if c == nil || c.Tenant != "acme" || c.User != "alice" || g.Identify("nope") != nil || g.Identify("") != nil {
		t.Fatalf("identify: %+v", c)
	}
	check := &gate.Request{Caller: c, Route: "/x", Check: true, States: true}
	for i := range 3 {
		if _, d := g.Reserve(ctx, check); !d.Allowed() || len(d.Limits) != 2 {
			t.Fatalf("check %d: %+v", i, d)
		}
		res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x"})
		if res == nil || !d.Allowed() {
			t.Fatalf("request %d refused: %+v", i, d)
		}
		res.Settle(ctx, gate.Charge{HTTPStatus: 200})
	}
	res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x"})
	if res != nil || d.Status != 429 || d.Error.Code != "per-tenant" || d.RetryAfter < 1 || d.RateLimit == nil {
		t.Fatalf("fourth: %+v", d)
	}
	if got, want := d.RateLimit.PolicyField(), `"per-tenant";q=3;w=3600;qu="requests"`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if !strings.HasPrefix(d.RateLimit.Field(), `"per-tenant";r=0;t=`) {
		t.Errorf("RateLimit %q", d.RateLimit.Field())
	}
	if _, d := g.Reserve(ctx, check); d.Status != 429 {
		t.Errorf("a check on a spent limit: %d, want 429", d.Status)
	}
	// The other tenant is untouched.
	if res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-globex"), Route: "/x"}); res == nil {
		t.Errorf("globex refused: %+v", d)
	}
}

// A request's extra limits are debited with its configured ones, all or
// nothing: a denial by one leaves the others as they were.
func TestExtraLimitsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	g := openGate(t, "")
	c := g.Trusted("acme", "", "", "")
	if c.Plan != "small" {
		t.Fatalf("trusted caller's plan %q", c.Plan)
	}
	one := weighted.Limit{Name: "one", Algorithm: weighted.FixedWindow, Rate: 1, Period: time.Hour}
	ten := weighted.Limit{Name: "ten", Algorithm: weighted.FixedWindow, Rate: 10, Period: time.Hour}
	req := func() *gate.Request {
		return &gate.Request{Caller: c, Route: "rls:test", States: true, Extra: []gate.Extra{
			{Limit: ten, Unit: "requests", Key: "{acme}:ten", Cost: 1},
			{Limit: one, Unit: "requests", Key: "{acme}:one", Cost: 1},
		}}
	}
	if res, d := g.Reserve(ctx, req()); res == nil {
		t.Fatalf("first refused: %+v", d)
	}
	_, d := g.Reserve(ctx, req())
	if d.Status != 429 || d.Error.Code != "one" {
		t.Fatalf("second: %+v", d)
	}
	_, d = g.Reserve(ctx, &gate.Request{Caller: c, Route: "rls:test", Check: true, States: true,
		Extra: []gate.Extra{{Limit: ten, Unit: "requests", Key: "{acme}:ten", Cost: 1}}})
	last := d.Limits[len(d.Limits)-1]
	if last.Name != "ten" || last.Remaining != 9 {
		t.Errorf("limit ten after a refused request: %+v; want 9 left (the refusal took nothing)", last)
	}
}

// A held reservation settles once, on any gate that shares the secret;
// it is another tenant's unknown reservation; a tampered id is unknown;
// release after settle is refused; an expired one is settled at its
// estimate with ledger status expired.
func TestHeldReservations(t *testing.T) {
	ctx := context.Background()
	g := openGate(t, "reservations: {secret: 0123456789abcdef0123}\n")
	c := g.Identify("cg-acme")
	res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/costgate/reserve",
		Estimate: costmodel.Estimate{Cost: usd("0.004")}})
	if res == nil {
		t.Fatalf("refused: %+v", d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatal(d)
	}
	id, exp := res.Hold(time.Minute)
	if time.Until(exp) < 50*time.Second {
		t.Errorf("expires %v", exp)
	}
	if _, _, err := g.Resume(context.Background(), g.Identify("cg-globex"), id); !errors.Is(err, gate.ErrUnknownReservation) {
		t.Errorf("another tenant resumed it: %v", err)
	}
	// Another character in the MAC (replacing it with a fixed one was no
	// change when it was that one already: 1 run in 256).
	tampered := []byte(id)
	if tampered[len(id)-2] == 'B' {
		tampered[len(id)-2] = 'C'
	} else {
		tampered[len(id)-2] = 'B'
	}
	if _, _, err := g.Resume(context.Background(), c, string(tampered)); !errors.Is(err, gate.ErrUnknownReservation) {
		t.Errorf("a tampered id: %v", err)
	}
	r, _, err := g.Resume(context.Background(), c, id)
	if err != nil {
		t.Fatal(err)
	}
	got, again, err := r.SettleHeld(ctx, gate.Charge{Cost: usd("0.001"), HTTPStatus: 200})
	if err != nil || again || got.Cost != usd("0.001") {
		t.Fatalf("settle: %+v %v %v", got, again, err)
	}
	got, again, err = r.SettleHeld(ctx, gate.Charge{Cost: usd("0.009"), HTTPStatus: 200})
	if err != nil || !again || got.Cost != usd("0.001") {
		t.Errorf("second settle: %+v %v %v; want the first's figures", got, again, err)
	}
	if err := r.Release(ctx); !errors.Is(err, gate.ErrSettled) {
		t.Errorf("release after settle: %v", err)
	}

	// Expiry.
	res2, _ := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/costgate/reserve",
		Estimate: costmodel.Estimate{Cost: usd("0.002")}})
	if d, ok := res2.Record(ctx); !ok {
		t.Fatal(d)
	}
	id2, _ := res2.Hold(time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, err := g.Resume(context.Background(), c, id2)
		if errors.Is(err, gate.ErrExpired) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reservation never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var e ledger.Entry
	for time.Now().Before(deadline) {
		if err := g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		p, err := g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range p.Entries {
			if x.RequestID == res2.ID() {
				e = x
			}
		}
		if e.Status == ledger.StatusExpired {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if e.Status != ledger.StatusExpired || e.ActualCost != usd("0.002") {
		t.Errorf("expired entry: status %q cost %v; want expired at its estimate $0.002", e.Status, e.ActualCost)
	}
}

// A settlement that calls no remote store (here the in-memory store) runs
// before SettleLater returns: the unit an unreached request gives back is
// back at once, and done has run.
func TestSettleLaterInProcess(t *testing.T) {
	ctx := context.Background()
	g := openGate(t, "")
	c := g.Identify("cg-acme")
	remaining := func() int64 {
		_, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x", Check: true, States: true})
		for _, l := range d.Limits {
			if l.Name == "per-tenant" {
				return l.Remaining
			}
		}
		t.Fatalf("no per-tenant state: %+v", d)
		return 0
	}
	before := remaining()
	res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x"})
	if res == nil {
		t.Fatalf("refused: %+v", d)
	}
	if got := remaining(); got != before-1 {
		t.Fatalf("remaining %d after the reservation, want %d", got, before-1)
	}
	done := false
	res.SettleLater(func() gate.Charge { return gate.Charge{HTTPStatus: 502, Unreached: true} }, func() { done = true })
	if !done || remaining() != before {
		t.Fatalf("after SettleLater: done %v, remaining %d, want %d", done, remaining(), before)
	}
}

// A reload that changes ledger.peer_wait or ledger.close_timeout is
// refused, as one that changes the ledger's database: the ledger reads
// them once, when it opens, and a reload that took one would report a
// wait it does not keep.
func TestReloadRefusesAnotherPeerWait(t *testing.T) {
	for _, key := range []string{"peer_wait", "close_timeout"} {
		t.Run(key, func(t *testing.T) {
			dir := t.TempDir()
			conf := func(wait string) string {
				return fmt.Sprintf("admin_token: t\ndata_dir: %q\nledger: {%s: %s}\n", dir, key, wait)
			}
			g := openYAML(t, conf("5s"))
			if err := g.Apply(mustParse(t, conf("3s"))); err == nil || !strings.Contains(err.Error(), "ledger."+key) {
				t.Fatalf("a reload to another %s: %v, want refused naming ledger.%s", key, err, key)
			}
			if err := g.Apply(mustParse(t, conf("5s"))); err != nil {
				t.Fatalf("a reload that keeps %s: %v", key, err)
			}
		})
	}
}
