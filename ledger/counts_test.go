package ledger_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestCountsOfCallers: Counts sums what a limiter counted of the entries
// a query selects, on both stores: a request per admitted entry, none for
// one cancelled (failed without an HTTP status) or of a decision that is
// no admission, and the tokens of the charged usage (the estimate while
// reserved, the actual usage once final). It agrees with Entry.Counts
// summed over the entries, for the tenant, a user, a key and a region.
func TestCountsOfCallers(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		reserve := func(id string, edit func(*ledger.Entry)) { t.Helper(); countsReserve(ctx, t, l, id, edit) }
		settle := func(e ledger.Entry) { t.Helper(); countsSettle(ctx, t, l, e) }
		reserve("settled", nil)
		settle(settlement("settled", 2_000)) // 90 in, 150 out
		reserve("open", nil)                 // its estimate: 100 in, 200 out
		reserve("cancelled", nil)
		settle(ledger.Entry{RequestID: "cancelled", Status: ledger.StatusFailed})
		reserve("failed", nil)
		settle(ledger.Entry{RequestID: "failed", Status: ledger.StatusFailed, HTTPStatus: 500,
			Actual: costmodel.Usage{InputTokens: 100}})
		reserve("hard", func(e *ledger.Entry) { e.Decision = "hard" })
		reserve("blocked", func(e *ledger.Entry) { e.Decision = "blocked" })
		settle(settlement("blocked", 1_000))
		reserve("bob", func(e *ledger.Entry) { e.User, e.KeyID, e.Region = "bob", "k2", "us" })
		settle(settlement("bob", 2_000))
		reserve("globex", func(e *ledger.Entry) { e.Tenant = "globex" })
		reserve("earlier", func(e *ledger.Entry) { e.CreatedAt = t0.Add(-2 * time.Hour) })
		flush(t, l)

		from, to := t0.Add(-time.Hour), t0.Add(time.Hour)
		entries := all(t, l, ledger.Query{Tenant: "acme", From: from, To: to})
		for _, c := range []struct {
			name string
			q    ledger.SpendQuery
			want ledger.Counts
		}{
			{"tenant", ledger.SpendQuery{Tenant: "acme"}, ledger.Counts{Requests: 4, InputTokens: 90 + 100 + 100 + 90, OutputTokens: 150 + 200 + 150}},
			{"user", ledger.SpendQuery{Tenant: "acme", User: "ann"}, ledger.Counts{Requests: 3, InputTokens: 290, OutputTokens: 350}},
			{"key", ledger.SpendQuery{Tenant: "acme", KeyID: "k2"}, ledger.Counts{Requests: 1, InputTokens: 90, OutputTokens: 150}},
			{"region", ledger.SpendQuery{Tenant: "acme", Region: "us"}, ledger.Counts{Requests: 1, InputTokens: 90, OutputTokens: 150}},
			{"no one", ledger.SpendQuery{Tenant: "acme", User: "carol"}, ledger.Counts{}},
		} {
			t.Run(c.name, func(t *testing.T) {
				c.q.From, c.q.To = from, to
				got, err := l.Counts(ctx, c.q)
				if err != nil || got != c.want {
					t.Fatalf("Counts = %+v, %v; want %+v", got, err, c.want)
				}
				var ref ledger.Counts
				for _, e := range entries {
					if (c.q.User == "" || e.User == c.q.User) && (c.q.KeyID == "" || e.KeyID == c.q.KeyID) &&
						(c.q.Region == "" || e.Region == c.q.Region) {
						n := e.Counts()
						ref.Requests += n.Requests
						ref.InputTokens += n.InputTokens
						ref.OutputTokens += n.OutputTokens
					}
				}
				if ref != got {
					t.Fatalf("Counts = %+v; the entries' Counts add up to %+v", got, ref)
				}
			})
		}
		// The range is exact: no bucket rounds it.
		if got, err := l.Counts(ctx, ledger.SpendQuery{Tenant: "acme", From: t0.Add(time.Microsecond), To: to}); err != nil || got != (ledger.Counts{}) {
			t.Fatalf("Counts after the entries = %+v, %v; want none", got, err)
		}
		if _, err := l.Counts(ctx, ledger.SpendQuery{Tenant: "acme", User: "a\x00", From: from, To: to}); !errors.Is(err, ledger.ErrInvalid) {
			t.Fatalf("Counts of a user no entry can have: %v, want ErrInvalid", err)
		}
	})
}

// TestCountsSaturate: token sums past the largest int64 answer it, on
// both stores and in Counts.Tokens, rather than wrap to a negative count
// that would restore a limiter's counter empty.
func TestCountsSaturate(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		for _, id := range []string{"a", "b", "c"} {
			e := reservation(id, t0)
			e.Estimated.InputTokens, e.Estimated.OutputTokens = math.MaxInt64-1, math.MaxInt64/2+1
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		got, err := l.Counts(ctx, ledger.SpendQuery{Tenant: "acme", From: t0, To: t0.Add(time.Second)})
		want := ledger.Counts{Requests: 3, InputTokens: math.MaxInt64, OutputTokens: math.MaxInt64}
		if err != nil || got != want {
			t.Fatalf("Counts = %+v, %v; want %+v", got, err, want)
		}
		if got.Tokens() != math.MaxInt64 {
			t.Fatalf("Tokens = %d, want %d", got.Tokens(), int64(math.MaxInt64))
		}
	})
}

// TestCountsWhileTheStoreIsDown: with PostgreSQL stopped after a read,
// Counts answers as Spend does, that read plus this node's records
// spooled since (a reservation at its estimate, raised by an extension, a
// settlement in the same records at its actual usage, a cancelled one and
// a refusal at nothing), with a *LocalSpendError that says so; a query
// never read says its store part is unknown. Once the store is back it
// answers from the store.
func TestCountsWhileTheStoreIsDown(t *testing.T) {
	l, pg, ctx := storeDownLedger(t, ledger.Config{})
	reserve := func(id, user string, edit func(*ledger.Entry)) {
		t.Helper()
		countsReserve(ctx, t, l, id, func(e *ledger.Entry) {
			e.User, e.KeyID = user, "k-"+user
			if edit != nil {
				edit(e)
			}
		})
	}
	settle := func(e ledger.Entry) { t.Helper(); countsSettle(ctx, t, l, e) }
	month := ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0}
	reserve("a1", "ann", nil)
	settle(settlement("a1", 1_000))
	reserve("a2", "ann", nil) // stays open into the outage
	flush(t, l)
	if c, err := l.Counts(ctx, month); err != nil || c != (ledger.Counts{Requests: 2, InputTokens: 190, OutputTokens: 350}) {
		t.Fatalf("Counts before the outage = %+v, %v", c, err)
	}

	pg.Stop()
	reserve("b1", "bob", nil)
	settle(settlement("b1", 2_000)) // reserved and settled in the spool: its actual usage
	reserve("b2", "ann", nil)       // open: its estimate, raised below
	e := reservation("b2", t0)
	e.User, e.KeyID, e.Estimated.OutputTokens, e.EstimatedCost = "ann", "k-ann", 500, 9_000
	if err := l.Extend(ctx, e); err != nil {
		t.Fatal(err)
	}
	reserve("c1", "ann", nil)
	settle(ledger.Entry{RequestID: "c1", Status: ledger.StatusFailed}) // cancelled: no request
	reserve("h1", "ann", func(e *ledger.Entry) { e.Decision = "hard" })
	settle(settlement("a2", 500)) // reserved in the store: stays at its estimate
	reserve("g1", "ann", func(e *ledger.Entry) { e.Tenant = "globex" })

	for _, c := range []struct {
		name          string
		q             ledger.SpendQuery
		want, pending ledger.Counts
		unknown       bool
	}{
		{"read before", month, ledger.Counts{Requests: 4, InputTokens: 380, OutputTokens: 1_000},
			ledger.Counts{Requests: 2, InputTokens: 190, OutputTokens: 650}, false},
		{"never read: only what the store lacks", ledger.SpendQuery{Tenant: "acme", User: "ann", Period: "month", At: t0},
			ledger.Counts{Requests: 1, InputTokens: 100, OutputTokens: 500}, ledger.Counts{Requests: 1, InputTokens: 100, OutputTokens: 500}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := l.Counts(ctx, c.q)
			var le *ledger.LocalSpendError
			if !errors.As(err, &le) {
				t.Fatalf("Counts = %+v, %v; want a *LocalSpendError", got, err)
			}
			if le.Err == nil || errors.Unwrap(err) != le.Err {
				t.Fatalf("the error does not wrap the store's: %v", err)
			}
			if got != c.want || le.Counts != c.want || le.PendingCounts != c.pending || le.Unknown != c.unknown || le.Spend != 0 {
				t.Fatalf("Counts = %+v, %+v; want %+v with %+v pending, unknown %v", got, *le, c.want, c.pending, c.unknown)
			}
		})
	}

	pg.Start()
	flush(t, l)
	want := ledger.Counts{Requests: 4, InputTokens: 90 + 90 + 90 + 100, OutputTokens: 150 + 150 + 150 + 500}
	if c, err := l.Counts(ctx, month); err != nil || c != want {
		t.Fatalf("Counts after the outage = %+v, %v; want %+v", c, err, want)
	}
}

// TestCountsRequestsTheLimiterCounted: an entry counts the requests the
// limiter counted it for (Entry.Requests), not one each, on both stores:
// an RLS debit of 60 hits counts 60 (its settlement, which names none,
// keeps them), a charge of usage already served none but its tokens, a
// reserve API's reservation of 3 requests 3 while open, a settlement with
// no reservation its own; a cancelled one and a refusal count nothing
// whatever they name. The entries read back carry it, and their
// Entry.Counts add up to the store's sum.
func TestCountsRequestsTheLimiterCounted(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		reserve := func(id string, requests int64, edit func(*ledger.Entry)) {
			t.Helper()
			countsReserve(ctx, t, l, id, func(e *ledger.Entry) {
				e.Requests = requests
				if edit != nil {
					edit(e)
				}
			})
		}
		settle := func(e ledger.Entry) { t.Helper(); countsSettle(ctx, t, l, e) }
		reserve("debit", 60, nil)
		settle(settlement("debit", 1_000)) // names no requests: the reservation's stay
		reserve("charge", 0, func(e *ledger.Entry) { e.Estimated = costmodel.Usage{} })
		settle(settlement("charge", 2_000)) // 90 in, 150 out, no request
		reserve("open", 3, nil)             // 100 in, 200 out
		reserve("cancelled", 5, nil)
		settle(ledger.Entry{RequestID: "cancelled", Status: ledger.StatusFailed})
		reserve("hard", 7, func(e *ledger.Entry) { e.Decision = "hard" })
		late := settlement("late", 500) // settled with no reservation: creates its entry
		late.Tenant, late.User, late.KeyID, late.Decision, late.Requests, late.CreatedAt = "acme", "ann", "k1", "allow", 4, t0
		settle(late)
		flush(t, l)

		from, to := t0.Add(-time.Hour), t0.Add(time.Hour)
		want := ledger.Counts{Requests: 60 + 3 + 4, InputTokens: 90 + 90 + 100 + 90, OutputTokens: 150 + 150 + 200 + 150}
		got, err := l.Counts(ctx, ledger.SpendQuery{Tenant: "acme", From: from, To: to})
		if err != nil || got != want {
			t.Fatalf("Counts = %+v, %v; want %+v", got, err, want)
		}
		var ref ledger.Counts
		for _, e := range all(t, l, ledger.Query{Tenant: "acme", From: from, To: to}) {
			if e.RequestID == "debit" && e.Requests != 60 {
				t.Fatalf("entry %q read back with Requests %d, want 60", e.RequestID, e.Requests)
			}
			n := e.Counts()
			ref.Requests += n.Requests
			ref.InputTokens += n.InputTokens
			ref.OutputTokens += n.OutputTokens
		}
		if ref != got {
			t.Fatalf("Counts = %+v; the entries' Counts add up to %+v", got, ref)
		}
	})
}

// TestCountsRequestsWhileTheStoreIsDown: with PostgreSQL stopped, the
// spooled records count the requests the limiter counted, as the store
// does once it is back: a debit of 60 hits 60 (its settlement keeps
// them), a charge of usage none.
func TestCountsRequestsWhileTheStoreIsDown(t *testing.T) {
	l, pg, ctx := storeDownLedger(t, ledger.Config{})
	month := ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0}
	if c, err := l.Counts(ctx, month); err != nil || c != (ledger.Counts{}) {
		t.Fatalf("Counts before the outage = %+v, %v", c, err)
	}
	pg.Stop()
	countsReserve(ctx, t, l, "debit", func(e *ledger.Entry) { e.Requests = 60 })
	countsSettle(ctx, t, l, settlement("debit", 1_000))
	countsReserve(ctx, t, l, "charge", func(e *ledger.Entry) { e.Requests, e.Estimated = 0, costmodel.Usage{} })
	countsSettle(ctx, t, l, settlement("charge", 2_000))
	want := ledger.Counts{Requests: 60, InputTokens: 90 + 90, OutputTokens: 150 + 150}
	got, err := l.Counts(ctx, month)
	var le *ledger.LocalSpendError
	if !errors.As(err, &le) || got != want || le.PendingCounts != want {
		t.Fatalf("Counts with the store down = %+v, %v; want %+v, all pending", got, err, want)
	}
	pg.Start()
	flush(t, l)
	if got, err := l.Counts(ctx, month); err != nil || got != want {
		t.Fatalf("Counts after the outage = %+v, %v; want %+v", got, err, want)
	}
}

// countsReserve reserves reservation(id, t0) on l, changed by edit when
// it is not nil.
func countsReserve(ctx context.Context, t *testing.T, l *ledger.Ledger, id string, edit func(*ledger.Entry)) {
	t.Helper()
	e := reservation(id, t0)
	if edit != nil {
		edit(&e)
	}
	if err := l.Reserve(ctx, e); err != nil {
		t.Fatal(err)
	}
}

// countsSettle settles e on l.
func countsSettle(ctx context.Context, t *testing.T, l *ledger.Ledger, e ledger.Entry) {
	t.Helper()
	if err := l.Settle(ctx, e); err != nil {
		t.Fatal(err)
	}
}
