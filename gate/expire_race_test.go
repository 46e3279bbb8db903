package gate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestSettleRacesExpiry: a held reservation settled or released at the
// moment this replica expires it ends once, either way: the settlement
// or the release wins (the ledger has its usage, or nothing) or the
// expiry does (the estimate, status expired), never neither, and the
// limit moves by the winner alone.
func TestSettleRacesExpiry(t *testing.T) {
	t.Run("memory", func(t *testing.T) { settleRacesExpiry(t, "") })
	// A patient store: a call past the default 100 ms timeout is an
	// outage, whose reservation is counted on the local fallback, not in
	// the Redis limit this test reads.
	t.Run("redis", func(t *testing.T) {
		settleRacesExpiry(t, fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}", redistest.New(t).URL))
	})
}

func settleRacesExpiry(t *testing.T, store string) {
	g := openAcme(t, store+`
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000, period: 24h}`)
	ctx := context.Background()
	c := g.Identify("cg-acme")
	const n = 40
	var used int64
	outcome := map[string]ledger.Status{}
	for i := range n {
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/v1/costgate/reserve",
			Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 100}}})
		if res == nil {
			t.Fatalf("refused: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		id, _ := res.Hold(time.Minute)
		r, _, err := g.Resume(context.Background(), c, id)
		if err != nil {
			t.Fatal(err)
		}
		var settleErr error
		release := i%3 == 2 // a release races the expiry instead
		var wg sync.WaitGroup
		wg.Go(func() {
			if release {
				settleErr = r.Release(ctx)
				return
			}
			_, _, settleErr = r.SettleHeld(ctx, Charge{Usage: costmodel.Usage{InputTokens: 30}, HTTPStatus: 200})
		})
		wg.Go(func() {
			if i%2 == 0 {
				time.Sleep(time.Duration(i) * 20 * time.Microsecond)
			}
			g.expireHolds(time.Now().Add(2 * time.Minute))
		})
		wg.Wait()
		switch {
		case settleErr == nil && release:
			outcome[res.ID()] = ledger.StatusFailed // released: nothing used
		case settleErr == nil:
			outcome[res.ID()], used = ledger.StatusSettled, used+30
		case errors.Is(settleErr, ErrExpired):
			outcome[res.ID()], used = ledger.StatusExpired, used+100
		default:
			t.Fatalf("reservation %d: %v", i, settleErr)
		}
	}
	if err := g.ledger.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := g.ledger.Entries(ctx, ledger.Query{Tenant: "acme", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seen, expired := 0, 0
	for _, e := range p.Entries {
		want, ok := outcome[e.RequestID]
		if !ok {
			continue
		}
		seen++
		if e.Status != want {
			t.Errorf("entry %s: %s, but the settlement was told %s", e.RequestID, e.Status, want)
		}
		if want == ledger.StatusExpired {
			expired++
		}
	}
	if seen != n {
		t.Fatalf("%d of %d entries", seen, n)
	}
	res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", States: true, Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
	if res != nil {
		res.Cancel(ctx)
	}
	if len(d.Limits) != 1 || d.Limits[0].Remaining != 1000000-used-1 {
		t.Fatalf("tpm %+v; want %d used", d.Limits, used)
	}
	t.Logf("%d expired first, %d settled or released first", expired, n-expired)
}

// openAcme opens a gate on a configuration of one tenant, acme (key
// cg-acme), a reservation secret and extra, in a temporary data
// directory, closed when tb ends.
func openAcme(tb testing.TB, extra string) *Gate {
	tb.Helper()
	return openAcmeWith(tb, extra, Options{})
}

// openAcmeWith is openAcme with opts.
func openAcmeWith(tb testing.TB, extra string, opts Options) *Gate {
	tb.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
tenants:
  - {name: acme, plan: p, keys: [{id: ka, key: cg-acme}]}
reservations: {secret: 0123456789abcdef0123}
%s
`, tb.TempDir(), extra)))
	if err != nil {
		tb.Fatal(err)
	}
	g, err := Open(context.Background(), cfg, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g
}
