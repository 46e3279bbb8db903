package gate

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
)

// The settlements the limiter store failed are kept in one table for all
// tenants, bounded by maxPending. A tenant with as many reservations in
// flight when Redis goes out as the table holds (long streams, held
// reservations) fills it with its settlements; another tenant's one
// settlement during the same outage must still be kept and made once
// Redis is back: its token limit then counts the actual tokens, not the
// estimate. Before, a full table refused every entry of a tenant that had
// none in it, and globex's 900 tokens were never counted.
func TestPendingAttackOneTenantFillsTheTable(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s, breaker_failures: 1, breaker_cooldown: 20ms}
tenants:
  - {name: acme, plan: small, keys: [{id: ka, key: cg-acme}]}
  - {name: globex, plan: small, keys: [{id: kg, key: cg-globex}]}
limits:
  - {name: tokens-day, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000000, period: 24h}
`, t.TempDir(), srv.URL)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ledger.DSN = ""
	g, err := Open(ctx, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	acme, globex := g.Identify("cg-acme"), g.Identify("cg-globex")
	reserve := func(c *Caller, tokens int64) *Reservation {
		t.Helper()
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/v1/chat/completions",
			Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: tokens}}})
		if res == nil || d.Degraded {
			t.Fatalf("%s's reservation with Redis up: %+v", c.Tenant, d)
		}
		return res
	}

	// acme has maxPending reservations in flight, globex one of 100 tokens.
	held := make([]*Reservation, maxPending)
	var wg sync.WaitGroup
	const workers = 16
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(held); i += workers {
				res, d := g.Reserve(ctx, &Request{Caller: acme, Route: "/v1/chat/completions",
					Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
				if res == nil || d.Degraded {
					t.Errorf("acme's reservation %d with Redis up: %+v", i, d)
					return
				}
				held[i] = res
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	first := reserve(globex, 100)

	// Redis refuses every write; every reservation is settled meanwhile,
	// acme's first.
	rc := srv.Client(t)
	if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for _, res := range held {
		res.Settle(ctx, Charge{Usage: costmodel.Usage{InputTokens: 2}, HTTPStatus: http.StatusOK})
	}
	first.Settle(ctx, Charge{Usage: costmodel.Usage{InputTokens: 900}, HTTPStatus: http.StatusOK})
	if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond) // past the cooldown

	// globex's counter is caught up before it decides: 900 of its tokens
	// are counted, whatever acme left in the table.
	var used int64
	for range 2 { // the first call may be the breaker's probe
		res, d := g.Reserve(ctx, &Request{Caller: globex, Route: "/v1/chat/completions", States: true,
			Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
		if res == nil {
			t.Fatalf("globex after the outage: %+v", d)
		}
		res.Cancel(ctx)
		if !d.Degraded && len(d.Limits) == 1 {
			used = d.Limits[0].Capacity - d.Limits[0].Remaining - 1
			break
		}
	}
	if used != 900 {
		t.Errorf("globex's tokens-day counts %d tokens after the outage, want 900: its settlement during the outage was dropped for acme's %d", used, maxPending)
	}
}

// A full table drops the oldest settlement of the tag that holds the
// most, whichever tag adds: tags with fewer keep all of theirs, each
// tag's settlements stay oldest first, and the table never holds more
// than maxPending.
func TestPendingTableEvictsTheLongest(t *testing.T) {
	tb := newQueues[pendingSettle](maxPending)
	id := func(tag string, i int) pendingSettle { return pendingSettle{id: fmt.Sprint(tag, i)} }
	for i := range maxPending - 2 {
		tb.add("acme", id("acme", i))
	}
	tb.add("globex", id("globex", 0))
	tb.add("initech", id("initech", 0))
	tb.add("globex", id("globex", 1)) // full: acme's oldest goes
	for i := range 3 {
		tb.add("initech", id("initech", 1+i))
	}
	if tb.n != maxPending {
		t.Fatalf("%d settlements kept, want %d", tb.n, maxPending)
	}
	if ps := tb.take("globex"); len(ps) != 2 || ps[0].id != "globex0" || ps[1].id != "globex1" {
		t.Errorf("globex's settlements: %v, want both, oldest first", ps)
	}
	if ps := tb.take("initech"); len(ps) != 4 || ps[0].id != "initech0" || ps[3].id != "initech3" {
		t.Errorf("initech's settlements: %v, want all four", ps)
	}
	ps := tb.take("acme")
	if want := maxPending - 6; len(ps) != want || ps[0].id != "acme4" || ps[len(ps)-1].id != fmt.Sprint("acme", maxPending-3) {
		t.Errorf("acme keeps %d settlements from %s, want %d from acme4", len(ps), ps[0].id, want)
	}
	if tb.n != 0 || len(tb.byKey) != 0 || len(tb.most) != 0 {
		t.Errorf("after every take: n %d, %d tags, heap of %d", tb.n, len(tb.byKey), len(tb.most))
	}
	// Two tags level: the one that adds may give up its own.
	for i := range maxPending {
		tb.add(fmt.Sprint("t", i%2), id("x", i))
	}
	tb.add("t0", id("y", 0))
	if tb.n != maxPending || len(tb.byKey["t0"].vs)+len(tb.byKey["t1"].vs) != maxPending ||
		max(len(tb.byKey["t0"].vs), len(tb.byKey["t1"].vs))-min(len(tb.byKey["t0"].vs), len(tb.byKey["t1"].vs)) > 1 {
		t.Errorf("two tags: t0 %d, t1 %d, n %d", len(tb.byKey["t0"].vs), len(tb.byKey["t1"].vs), tb.n)
	}
}
