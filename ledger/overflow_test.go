package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestSaturatedCosts: an upstream that reports absurd usage (costmodel
// saturates its cost at math.MaxInt64) is recorded and charged MaxCost, so
// that the roll-up of several such entries stays exact: the batches of
// such settlements are applied (a sum the store refused would stop the
// flusher for good, with every later entry behind it), each entry's cost
// is MaxCost, and Spend is their exact sum.
func TestSaturatedCosts(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.Now = func() time.Time { return t0.Add(time.Hour) }
		l := open(t, cfg)
		settle := func(id string) {
			t.Helper()
			e := reservation(id, t0)
			e.HTTPStatus, e.ActualCost, e.EstimatedCost = 200, math.MaxInt64, math.MaxInt64
			if err := l.Settle(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		settle("one") // one batch
		flush(t, l)
		settle("two") // the next batch, onto the stored roll-up
		flush(t, l)
		settle("three") // both in one batch
		settle("four")
		flush(t, l)
		es := all(t, l, ledger.Query{})
		if len(es) != 4 {
			t.Errorf("%d entries, want 4", len(es))
		}
		for _, e := range es {
			if e.ActualCost != ledger.MaxCost || e.EstimatedCost != ledger.MaxCost || e.Charge() != ledger.MaxCost {
				t.Errorf("%s: estimated %d, actual %d, charge %d; want MaxCost (%d)",
					e.RequestID, e.EstimatedCost, e.ActualCost, e.Charge(), ledger.MaxCost)
			}
		}
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day", At: t0})
		if want := 4 * ledger.MaxCost; err != nil || sp != want {
			t.Errorf("Spend = %d, %v, want %d", sp, err, want)
		}
	})
}

// TestReserveMaxCost: Reserve takes an estimate of MaxCost and refuses one
// above it with ErrInvalid, recording nothing.
func TestReserveMaxCost(t *testing.T) {
	ctx := context.Background()
	cfg := ledger.Config{Dir: t.TempDir(), Now: func() time.Time { return t0.Add(time.Hour) }}
	l := open(t, cfg)
	at := reservation("at", t0)
	at.EstimatedCost = ledger.MaxCost
	if err := l.Reserve(ctx, at); err != nil {
		t.Fatalf("Reserve at MaxCost: %v", err)
	}
	above := reservation("above", t0)
	above.EstimatedCost = ledger.MaxCost + 1
	if err := l.Reserve(ctx, above); !errors.Is(err, ledger.ErrInvalid) {
		t.Fatalf("Reserve above MaxCost: %v, want ErrInvalid", err)
	}
	flush(t, l)
	if es := all(t, l, ledger.Query{}); len(es) != 1 || es[0].RequestID != "at" {
		t.Errorf("entries %+v, want only the reservation at MaxCost", es)
	}
}

// rawExec runs query on the store of cfg directly, beside the ledger.
func rawExec(t *testing.T, cfg ledger.Config, query string) {
	t.Helper()
	ctx := context.Background()
	if cfg.DSN != "" {
		conn, err := pgx.Connect(ctx, cfg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, query); err != nil {
			t.Fatal(err)
		}
		return
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(cfg.Dir, "ledger.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, query); err != nil {
		t.Fatal(err)
	}
}

// TestSaturatedStoreReads: a store whose entries and roll-up rows hold
// costs of math.MaxInt64 (as the roll-up's saturating upserts leave them)
// answers every read of summed costs at math.MaxInt64: Spend of a day, a
// month, a range that starts inside a bucket and a region, KeySpend and
// Summary saturate rather than fail (an error makes every budget read of
// the tenant, and Summary every tenant's billing, fail) or wrap to a
// negative spend.
func TestSaturatedStoreReads(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.Now = func() time.Time { return t0.Add(time.Hour) }
		l := open(t, cfg)
		for id, at := range map[string]time.Time{"a": t0, "b": t0.Add(-24 * time.Hour), "c": t0.Add(20 * time.Minute)} {
			if err := l.Reserve(ctx, reservation(id, at)); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		rawExec(t, cfg, `UPDATE ledger_spend SET cost = 9223372036854775807 WHERE tenant = 'acme'`)
		rawExec(t, cfg, `UPDATE ledger_entries SET cost = 9223372036854775807 WHERE tenant = 'acme'`)
		const max = costmodel.NanoUSD(math.MaxInt64)
		bucket := t0.Truncate(15 * time.Minute)
		for name, q := range map[string]ledger.SpendQuery{
			"day":    {Period: "day", At: t0},
			"month":  {Period: "month", At: t0},
			"range":  {From: bucket.Add(time.Minute), To: bucket.Add(time.Hour)},
			"user":   {User: "ann", Period: "month", At: t0},
			"key":    {KeyID: "k1", Period: "month", At: t0},
			"region": {Region: "eu", Period: "day", At: t0},
		} {
			q.Tenant = "acme"
			if sp, err := l.Spend(ctx, q); err != nil || sp != max {
				t.Errorf("Spend(%s) = %d, %v; want %d", name, sp, err, max)
			}
		}
		ks, err := l.KeySpend(ctx, "acme", bucket.Add(time.Minute), bucket.Add(time.Hour))
		if err != nil || len(ks) != 1 || ks["k1"] != max {
			t.Errorf("KeySpend = %v, %v; want k1 at %d", ks, err, max)
		}
		sum, err := l.Summary(ctx, "month", t0)
		if err != nil || len(sum) != 1 || sum[0].Spend != max || sum[0].Entries != 3 {
			t.Errorf("Summary(month) = %+v, %v; want acme at %d over 3 entries", sum, err, max)
		}
	})
}

// TestInvalidTextFilters: a tenant, user, key or region filter that no
// entry can have, because it is not valid text (NUL, invalid UTF-8), is
// refused with ErrInvalid by Entries, Export, Spend and KeySpend, never
// answered with a store error, which reads as an outage; Export writes
// nothing.
func TestInvalidTextFilters(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		if err := l.Reserve(ctx, reservation("r", t0)); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		for _, bad := range []string{"acme\x00", "\x00", "acm\xe9", "\xff\xfe"} {
			if _, err := l.Entries(ctx, ledger.Query{Tenant: bad}); !errors.Is(err, ledger.ErrInvalid) {
				t.Errorf("Entries(tenant %q): %v, want ErrInvalid", bad, err)
			}
			var buf bytesBuffer
			if err := l.Export(ctx, &buf, ledger.Query{Tenant: bad}, ledger.FormatCSV); !errors.Is(err, ledger.ErrInvalid) || buf.n != 0 {
				t.Errorf("Export(tenant %q): %v after %d bytes, want ErrInvalid and nothing written", bad, err, buf.n)
			}
			for name, q := range map[string]ledger.SpendQuery{
				"tenant": {Tenant: bad},
				"user":   {Tenant: "acme", User: bad},
				"key":    {Tenant: "acme", KeyID: bad},
				"region": {Tenant: "acme", Region: bad},
			} {
				q.Period, q.At = "day", t0
				if _, err := l.Spend(ctx, q); !errors.Is(err, ledger.ErrInvalid) {
					t.Errorf("Spend(%s %q): %v, want ErrInvalid", name, bad, err)
				}
			}
			if _, err := l.KeySpend(ctx, bad, t0.Truncate(time.Hour), t0.Add(time.Hour)); !errors.Is(err, ledger.ErrInvalid) {
				t.Errorf("KeySpend(tenant %q): %v, want ErrInvalid", bad, err)
			}
		}
	})
}

// bytesBuffer counts the bytes written to it.
type bytesBuffer struct{ n int }

func (b *bytesBuffer) Write(p []byte) (int, error) {
	b.n += len(p)
	return len(p), nil
}
