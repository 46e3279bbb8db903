package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/ledger"
)

// TestSpendWhileTheStoreIsDown stops PostgreSQL after a read of the spend:
// Spend then answers that read plus this node's records since, says so with
// a *LocalSpendError, and answers from the store again once it is back.
func TestSpendWhileTheStoreIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("outage test in -short mode")
	}
	l, pg, ctx := storeDownLedger(t, ledger.Config{SegmentSize: 64 << 10})
	reserve := func(id, user string, est costmodel.NanoUSD) {
		t.Helper()
		e := reservation(id, t0)
		e.User, e.KeyID, e.EstimatedCost = user, "k-"+user, est
		if user == "bob" {
			e.Region = "us" // bob calls from the us region, ann from eu
		}
		if err := l.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	settle := func(id string, cost costmodel.NanoUSD) {
		t.Helper()
		if err := l.Settle(ctx, settlement(id, cost)); err != nil {
			t.Fatal(err)
		}
	}
	month := ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0}
	ann := ledger.SpendQuery{Tenant: "acme", User: "ann", Period: "month", At: t0}

	reserve("a1", "ann", 5_000)
	settle("a1", 1_000)
	reserve("a2", "ann", 3_000) // stays open into the outage
	flush(t, l)
	if sp, err := l.Spend(ctx, month); err != nil || sp != 4_000 {
		t.Fatalf("Spend before the outage = %d, %v; want 4000", sp, err)
	}
	from, to, err := ledger.Period("month", t0, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if ks, err := l.KeySpend(ctx, "acme", from, to); err != nil || !maps.Equal(ks, map[string]costmodel.NanoUSD{"k-ann": 4_000}) {
		t.Fatalf("KeySpend before the outage = %v, %v; want k-ann 4000", ks, err)
	}

	// Another tenant's records fill more than a segment, which reaches
	// the store and leaves the spool: the answer below is partial.
	for i := range 1000 {
		e := reservation(fmt.Sprintf("g%d", i), t0)
		e.Tenant = "globex"
		if err := l.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, l)

	pg.Stop()
	reserve("b1", "bob", 5_000)
	settle("b1", 2_000)         // reserved and settled in the spool: its actual cost
	reserve("b2", "ann", 7_000) // open: its estimate
	settle("a2", 500)           // reserved in the store: stays at its estimate
	e := reservation("c1", t0)
	e.Tenant = "globex" // another tenant's
	if err := l.Reserve(ctx, e); err != nil {
		t.Fatal(err)
	}
	e = reservation("d1", t0.AddDate(0, -1, 0)) // last month's
	if err := l.Reserve(ctx, e); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		q    ledger.SpendQuery
		want ledger.LocalSpendError
	}{
		{"read before", month, ledger.LocalSpendError{Spend: 13_000, Stored: 4_000, ReadAt: t0.Add(time.Hour), Pending: 9_000, Partial: true}},
		// A query never read counts only what the store lacks, and says
		// that the store's part is unknown: the store answered (a flush)
		// after the range began.
		{"never read: only what the store lacks", ann, ledger.LocalSpendError{Spend: 7_000, Pending: 7_000, Unknown: true}},
		{"one region", ledger.SpendQuery{Tenant: "acme", Region: "us", Period: "month", At: t0}, ledger.LocalSpendError{Spend: 2_000, Pending: 2_000, Unknown: true}},
		// A range that begins after the store last answered holds none of
		// this node's records there: what the spool holds is all of it.
		{"never read, begun after the store's last answer", ledger.SpendQuery{Tenant: "acme", From: t0.Add(2 * time.Hour), To: t0.Add(3 * time.Hour)}, ledger.LocalSpendError{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sp, err := l.Spend(ctx, c.q)
			var le *ledger.LocalSpendError
			if !errors.As(err, &le) {
				t.Fatalf("Spend = %d, %v; want a *LocalSpendError", sp, err)
			}
			if le.Err == nil || errors.Unwrap(err) != le.Err {
				t.Fatalf("the error does not wrap the store's: %v", err)
			}
			le.Err = nil
			if sp != c.want.Spend || *le != c.want {
				t.Fatalf("Spend = %d, %+v; want %+v", sp, *le, c.want)
			}
		})
	}

	t.Run("each key", func(t *testing.T) {
		ks, err := l.KeySpend(ctx, "acme", from, to)
		var le *ledger.LocalSpendError
		if !errors.As(err, &le) {
			t.Fatalf("KeySpend = %v, %v; want a *LocalSpendError", ks, err)
		}
		got := ledger.LocalSpendError{Spend: le.Spend, Stored: le.Stored, ReadAt: le.ReadAt, Pending: le.Pending, Partial: le.Partial, Unknown: le.Unknown}
		want := ledger.LocalSpendError{Spend: 13_000, Stored: 4_000, ReadAt: t0.Add(time.Hour), Pending: 9_000, Partial: true}
		if !maps.Equal(ks, map[string]costmodel.NanoUSD{"k-ann": 11_000, "k-bob": 2_000}) || got != want {
			t.Fatalf("KeySpend = %v, %+v; want k-ann 11000, k-bob 2000, %+v", ks, got, want)
		}
		// Each key's pending part is of its own value, and they make up
		// the whole's.
		var pending costmodel.NanoUSD
		for id, v := range ks {
			if p := le.PendingOf(id); p < 0 || p > v {
				t.Errorf("PendingOf(%s) = %d, of a value of %d", id, p, v)
			}
			pending += le.PendingOf(id)
		}
		if pending != le.Pending || le.PendingOf("k-none") != 0 {
			t.Errorf("the keys' pending parts add up to %d, Pending is %d; PendingOf an absent key %d", pending, le.Pending, le.PendingOf("k-none"))
		}
	})

	pg.Start()
	flush(t, l)
	if sp, err := l.Spend(ctx, month); err != nil || sp != 1_000+500+2_000+7_000 {
		t.Fatalf("Spend after the outage = %d, %v; want 10500", sp, err)
	}
}

// storeDownLedger opens, in parallel with the package's other tests, a
// ledger of cfg on a private PostgreSQL that the test may stop, retrying
// every 100 ms at most, on a clock fixed an hour after t0, and a context
// that ends a minute on.
func storeDownLedger(t *testing.T, cfg ledger.Config) (*ledger.Ledger, *pgtest.Private, context.Context) {
	t.Helper()
	t.Parallel()
	pg := pgtest.NewPrivate(t)
	now := t0.Add(time.Hour)
	cfg.Dir, cfg.DSN, cfg.RetryMax, cfg.Now = t.TempDir(), pg.URL(), 100*time.Millisecond, func() time.Time { return now }
	l := open(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return l, pg, ctx
}

// TestLocalSpendAtkReadsTheSpoolOnce: with the store down, a read goes
// through the records the spool still holds before the last read (for
// the estimates of reservations still open then) and through those
// since. It reads each byte of them about once: it read each record
// alone, with a chunk of up to 4 MiB from the file each time, so 36,000
// records took ten seconds, and every request that waited on the read
// (a restore after a loss) waited as long.
func TestLocalSpendAtkReadsTheSpoolOnce(t *testing.T) {
	l, pg, ctx := storeDownLedger(t, ledger.Config{})
	month := ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0}
	const n = 1_000
	for i := range n {
		id := fmt.Sprintf("r%d", i)
		countsReserve(ctx, t, l, id, nil)
		countsSettle(ctx, t, l, settlement(id, 1_000))
	}
	countsReserve(ctx, t, l, "open", nil) // open across the read
	flush(t, l)
	if _, err := l.Counts(ctx, month); err != nil {
		t.Fatal(err)
	}
	pg.Stop()
	countsReserve(ctx, t, l, "later", nil)
	end, was := ledger.SpoolEnd(l), ledger.SpoolReadBytes(l)
	c, err := l.Counts(ctx, month)
	var le *ledger.LocalSpendError
	if !errors.As(err, &le) || c.Requests != n+2 {
		t.Fatalf("Counts with the store down = %+v, %v; want %d requests and a *LocalSpendError", c, err, n+2)
	}
	if read := ledger.SpoolReadBytes(l) - was; read > 2*end {
		t.Errorf("a read with the store down took %d bytes from a spool of %d", read, end)
	}
}
