package ledger_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/ledger"
)

// TestLocalAnswerFromAWiderRead: a limit's restore asks for a range that
// moves with the clock (a sliding window's period back, rounded to the
// minute, to an open end a century on). With the store down, a range
// this node never read exactly, but that a read of a wider range covers,
// is answered from that read plus the spool: an upper bound of the
// spend, its store part known. Before, every read method answered it
// with its store part unknown, and a fail-closed limit restored a minute
// after its last read refused every request until the database came
// back. A range no read covers (one that starts earlier, another grouping,
// another filter) stays unknown.
func TestLocalAnswerFromAWiderRead(t *testing.T) {
	t.Parallel()
	var clock atomic.Pointer[time.Time]
	set := func(at time.Time) { clock.Store(&at) }
	set(t0.Add(time.Hour))
	pg := pgtest.NewPrivate(t)
	l := open(t, ledger.Config{Dir: t.TempDir(), DSN: pg.URL(), RetryMax: 100 * time.Millisecond, Now: func() time.Time { return *clock.Load() }})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reserve := func(id, user string, at time.Time) {
		t.Helper()
		countsReserve(ctx, t, l, id, func(e *ledger.Entry) { e.User, e.KeyID, e.CreatedAt = user, "k-"+user, at })
	}
	from := t0.Add(-10 * time.Minute).Truncate(time.Minute)
	open := func(from time.Time) ledger.SpendQuery {
		return ledger.SpendQuery{Tenant: "acme", From: from, To: from.AddDate(100, 0, 0)}
	}
	reserve("a1", "ann", t0)
	reserve("b1", "bob", t0.Add(time.Second))
	flush(t, l)
	// The reads of the limits' restores, while the store answers.
	if _, err := l.Spend(ctx, open(from)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CountsBy(ctx, open(from), ledger.GroupBy{User: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.KeySpend(ctx, "acme", from, from.AddDate(100, 0, 0)); err != nil {
		t.Fatal(err)
	}
	closed := ledger.SpendQuery{Tenant: "acme", From: from, To: t0.Add(time.Minute)}
	if _, err := l.Spend(ctx, closed); err != nil {
		t.Fatal(err)
	}

	pg.Stop()
	reserve("a2", "ann", t0.Add(2*time.Second))
	later := from.Add(time.Minute)
	local := func(what string, err error, unknown bool) {
		t.Helper()
		var le *ledger.LocalSpendError
		if !errors.As(err, &le) || le.Unknown != unknown {
			t.Fatalf("%s with the store down: %v; want a *LocalSpendError, its store part unknown %v", what, err, unknown)
		}
	}

	sp, err := l.Spend(ctx, open(later))
	local("Spend a minute later", err, false)
	if sp != 9_000 {
		t.Fatalf("Spend a minute later = %d; want 9000 (6000 read, 3000 spooled)", sp)
	}
	gs, err := l.CountsBy(ctx, open(later), ledger.GroupBy{User: true})
	local("CountsBy a minute later", err, false)
	want := map[ledger.Group]ledger.Group{
		{User: "ann"}: {User: "ann", Counts: ledger.Counts{Requests: 2, InputTokens: 200, OutputTokens: 400}, Charge: 6_000,
			PendingCounts: ledger.Counts{Requests: 1, InputTokens: 100, OutputTokens: 200}, PendingCharge: 3_000},
		{User: "bob"}: {User: "bob", Counts: ledger.Counts{Requests: 1, InputTokens: 100, OutputTokens: 200}, Charge: 3_000},
	}
	sameGroups(t, gs, want)
	ks, err := l.KeySpend(ctx, "acme", later, later.AddDate(100, 0, 0))
	local("KeySpend a minute later", err, false)
	if ks["k-ann"] != 6_000 || ks["k-bob"] != 3_000 {
		t.Fatalf("KeySpend a minute later = %v; want k-ann 6000, k-bob 3000", ks)
	}
	// A closed range inside the closed read.
	sp, err = l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", From: later, To: t0.Add(30 * time.Second)})
	local("Spend of a range inside a closed read", err, false)
	if sp != 9_000 {
		t.Fatalf("Spend of a range inside a closed read = %d; want 9000", sp)
	}

	// No read covers these: still unknown.
	_, err = l.Spend(ctx, open(from.Add(-time.Minute)))
	local("Spend from before every read", err, true)
	_, err = l.CountsBy(ctx, open(later), ledger.GroupBy{Model: true})
	local("CountsBy of another grouping", err, true)
	_, err = l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", User: "ann", From: later, To: later.AddDate(100, 0, 0)})
	local("Spend of one user", err, true)

	// A window begun after every read (a fixed window that turned), the
	// store having answered since: the reads are of the window before.
	pg.Start()
	set(t0.Add(3 * time.Hour))
	reserve("a3", "ann", t0.Add(3*time.Hour))
	flush(t, l)
	pg.Stop()
	_, err = l.Spend(ctx, open(t0.Add(2*time.Hour)))
	local("Spend of a window begun after the reads", err, true)
}
