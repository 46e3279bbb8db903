package ledger_test

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestLostUsersUserSpend: UserSpend answers each user's spend of a tenant
// over a range, from the roll-up and, for a range that starts inside a
// bucket, from the entries; the entries without a user are under "";
// a user whose entries cost nothing is there at 0 (a restore counts its
// requests); another tenant's, another range's and keys' scopes do not
// count.
func TestLostUsersUserSpend(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		now := t0.Add(time.Hour)
		cfg.Now = func() time.Time { return now }
		l := open(t, cfg)
		ctx := context.Background()
		for _, e := range []struct {
			id, tenant, user, key string
			at                    time.Time
			cost                  costmodel.NanoUSD
		}{
			{"a1", "acme", "ann", "k-ann", t0, 1_000},
			{"a2", "acme", "ann", "k-ann2", t0.Add(-2 * time.Hour), 2_000},
			{"b1", "acme", "bob", "k-bob", t0, 5_000},
			{"f1", "acme", "fay", "k-fay", t0, 0}, // a rate limit service's unpriced hits
			{"n1", "acme", "", "k-none", t0, 7_000},
			{"k1", "acme", "k:x", "k-x", t0, 11_000}, // a user named like a key's scope
			{"g1", "globex", "ann", "k-g", t0, 13_000},
			{"old", "acme", "ann", "k-ann", t0.AddDate(0, -1, 0), 17_000},
		} {
			r := reservation(e.id, e.at)
			r.Tenant, r.User, r.KeyID, r.EstimatedCost = e.tenant, e.user, e.key, e.cost
			if err := l.Reserve(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		from, to, err := ledger.Period("month", t0, time.UTC)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name     string
			from, to time.Time
			want     map[string]costmodel.NanoUSD
		}{
			{"the month", from, to, map[string]costmodel.NanoUSD{"ann": 3_000, "bob": 5_000, "fay": 0, "": 7_000, "k:x": 11_000}},
			{"from inside a bucket", t0.Add(-time.Minute), to, map[string]costmodel.NanoUSD{"ann": 1_000, "bob": 5_000, "fay": 0, "": 7_000, "k:x": 11_000}},
			{"a range without spend", t0.Add(time.Hour), to, map[string]costmodel.NanoUSD{}},
		} {
			got, err := l.UserSpend(ctx, "acme", c.from, c.to)
			if err != nil || !maps.Equal(got, c.want) {
				t.Errorf("%s: UserSpend = %v, %v; want %v", c.name, got, err, c.want)
			}
		}
		if ks, err := l.KeySpend(ctx, "acme", from, to); err != nil || ks["k-ann"] != 1_000 || len(ks) != 6 {
			t.Errorf("KeySpend = %v, %v; want the tenant's six keys", ks, err)
		}
		if _, err := l.UserSpend(ctx, "", from, to); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("UserSpend without a tenant: %v, want ErrInvalid", err)
		}
		if _, err := l.UserSpend(ctx, "ac\x00me", from, to); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("UserSpend of a tenant with a NUL: %v, want ErrInvalid", err)
		}
		if _, err := l.UserSpend(ctx, "acme", from, from); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("UserSpend over an empty range: %v, want ErrInvalid", err)
		}
	})
}

// TestLostUsersUserSpendWhileTheStoreIsDown: with PostgreSQL stopped,
// UserSpend answers as KeySpend does: its last read for the tenant and
// range plus this node's records since, each user's own, with a
// *LocalSpendError whose Spend is their sum; and from the store again
// once it is back.
func TestLostUsersUserSpendWhileTheStoreIsDown(t *testing.T) {
	l, pg, ctx := storeDownLedger(t, ledger.Config{})
	reserve := func(id, user string, est costmodel.NanoUSD) {
		t.Helper()
		e := reservation(id, t0)
		e.User, e.KeyID, e.EstimatedCost = user, "k-"+user, est
		if err := l.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	from, to, err := ledger.Period("month", t0, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	reserve("a1", "ann", 4_000)
	reserve("a2", "ann", 3_000) // stays open into the outage
	flush(t, l)
	if us, err := l.UserSpend(ctx, "acme", from, to); err != nil || !maps.Equal(us, map[string]costmodel.NanoUSD{"ann": 7_000}) {
		t.Fatalf("UserSpend before the outage = %v, %v; want ann 7000", us, err)
	}

	pg.Stop()
	reserve("b1", "bob", 5_000)
	if err := l.Settle(ctx, settlement("b1", 2_000)); err != nil { // reserved and settled in the spool: its actual cost
		t.Fatal(err)
	}
	reserve("c1", "cara", 6_000)
	if err := l.Settle(ctx, settlement("a2", 500)); err != nil { // reserved in the store: stays at its estimate
		t.Fatal(err)
	}

	us, err := l.UserSpend(ctx, "acme", from, to)
	var le *ledger.LocalSpendError
	if !errors.As(err, &le) {
		t.Fatalf("UserSpend during the outage = %v, %v; want a *LocalSpendError", us, err)
	}
	want := map[string]costmodel.NanoUSD{"ann": 7_000, "bob": 2_000, "cara": 6_000}
	if !maps.Equal(us, want) || le.Spend != 15_000 || le.Stored != 7_000 || le.Pending != 8_000 {
		t.Errorf("UserSpend during the outage = %v, %+v; want %v, spend 15000 (stored 7000, pending 8000)", us, *le, want)
	}
	if ks, err := l.KeySpend(ctx, "acme", from, to); !errors.As(err, &le) || ks["k-bob"] != 2_000 {
		t.Errorf("KeySpend during the outage = %v, %v; want k-bob 2000 and a *LocalSpendError", ks, err)
	}
	// The reads do not share their last values: KeySpend's, never read
	// before, holds only what the store lacks.
	if le.Stored != 0 {
		t.Errorf("KeySpend during the outage stored %d, want 0 (no earlier read of it)", le.Stored)
	}
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if us, err := l.UserSpend(cctx, "acme", from, to); err == nil || errors.As(err, &le) {
		t.Errorf("UserSpend with ctx done during the outage = %v, %v; want the store's error, not a local answer", us, err)
	}

	pg.Start()
	flush(t, l)
	if us, err := l.UserSpend(ctx, "acme", from, to); err != nil || !maps.Equal(us, map[string]costmodel.NanoUSD{"ann": 4_500, "bob": 2_000, "cara": 6_000}) {
		t.Errorf("UserSpend after the outage = %v, %v; want ann 4500, bob 2000, cara 6000", us, err)
	}
}
