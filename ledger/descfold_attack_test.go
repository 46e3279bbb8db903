package ledger_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// The attack: since tallies, each ten seconds of a tenant's calls that
// cost nothing is an entry whose KeyDesc holds their sums, a text of its
// own. A tenant that calls every ten seconds for a few days has more
// distinct texts than MaxGroups in a limit's window; a grouped read by
// text that keeps MaxGroups of them restores part of each counter, and
// after the limiter loses its data the tenant is admitted past its
// limits. CountsBy grouped by Desc must sum every text, from the store,
// from this node's pending tallies and from its spool alike.

// descCounter is a counter of a user (a KeyDesc line's text before its
// amount).
type descCounter struct{ user, counter string }

// descCalls tallies n calls of user from at, each in a tally bucket of
// its own: amount first+i on the search counter (so that each bucket's
// KeyDesc is a text of its own) and 2 on one of three projects' counters.
// It adds what they count to want.
func descCalls(t *testing.T, l *ledger.Ledger, user string, at time.Time, n int, first int64, want map[descCounter]int64) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		desc := []string{descLine("search", "acme", first+int64(i)), descLine("per-project", "acme_p"+strconv.Itoa(i%3), 2)}
		if err := l.Tally(ctx, tallyCall(user+"-"+strconv.Itoa(i), at.Add(time.Duration(i)*ledger.TallyBucket), user, desc...)); err != nil {
			t.Fatal(err)
		}
		for _, d := range desc {
			i := strings.LastIndexByte(d, '\t')
			n, _ := strconv.ParseInt(d[i+1:], 10, 64)
			want[descCounter{user, d[:i]}] += n
		}
	}
}

// byCounter is what gs, an answer grouped by user and Desc, counted on
// each counter and the pending part of it, as gate's restore sums them:
// each line's amount times its group's Entries, and times its
// PendingEntries.
func byCounter(t *testing.T, gs []ledger.Group) (all, pending map[descCounter]int64) {
	t.Helper()
	all, pending = map[descCounter]int64{}, map[descCounter]int64{}
	for _, g := range gs {
		for _, line := range strings.Split(g.KeyDesc, "\n") {
			i := strings.LastIndexByte(line, '\t')
			n, err := strconv.ParseInt(line[i+1:], 10, 64)
			if err != nil || n <= 0 {
				t.Fatalf("group %+v: amount %v", g, err)
			}
			c := descCounter{g.User, line[:i]}
			all[c] += n * g.Entries
			pending[c] += n * g.PendingEntries
		}
	}
	return all, pending
}

// perCounter requires gs, an answer grouped by user and Desc, to be one
// line of one entry in each group, of no counts or charge, and at most
// one group of each counter with pending entries and one without.
func perCounter(t *testing.T, what string, gs []ledger.Group) {
	t.Helper()
	type seen struct {
		c       descCounter
		pending int64
	}
	twice := map[seen]bool{}
	for _, g := range gs {
		if strings.Contains(g.KeyDesc, "\n") || g.Entries != 1 || g.PendingEntries < 0 || g.PendingEntries > 1 ||
			g.Counts != (ledger.Counts{}) || g.Charge != 0 {
			t.Errorf("%s: group %+v: want one line of one entry, of no counts or charge", what, g)
			return
		}
		s := seen{descCounter{g.User, g.KeyDesc[:strings.LastIndexByte(g.KeyDesc, '\t')]}, g.PendingEntries}
		if twice[s] {
			t.Errorf("%s: counter %+v answered twice with %d pending entries", what, s.c, s.pending)
			return
		}
		twice[s] = true
	}
}

// sameByCounter requires got to be want exactly.
func sameByCounter(t *testing.T, what string, got, want map[descCounter]int64) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s's counter %q counted %d, want %d", what, k.user, k.counter, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok && v != 0 {
			t.Errorf("%s: %s's counter %q counted %d, want none", what, k.user, k.counter, v)
		}
	}
}

// ofEveryUser is want summed over its users, keyed by counter.
func ofEveryUser(want map[descCounter]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range want {
		out[k.counter] += v
	}
	return out
}

// TestCountsByDescPastMaxGroups: a tenant with more distinct KeyDesc
// texts than MaxGroups in the range (20,000 buckets of ann's tallies,
// each its own text, and 100 of bob's), on both stores: CountsBy grouped
// by Desc, and by user and Desc, answers each counter's exact sum, while
// the tallies are all pending (no tick yet) and once ticked into the
// store, one group per counter.
func TestCountsByDescPastMaxGroups(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		release := ledger.HoldTicks(l)
		t.Cleanup(release) // before Close, which ticks
		ctx := context.Background()
		const calls = 20_000
		want := map[descCounter]int64{}
		descCalls(t, l, "ann", t0, calls, 1, want)
		descCalls(t, l, "bob", t0, 100, 1, want)
		q := ledger.SpendQuery{Tenant: "acme", From: t0.Add(-time.Hour), To: t0.Add(calls*ledger.TallyBucket + time.Hour)}
		read := func(what string, pendingToo bool) {
			t.Helper()
			gs, err := l.CountsBy(ctx, q, ledger.GroupBy{User: true, Desc: true})
			if err != nil {
				t.Fatalf("%s: CountsBy: %v", what, err)
			}
			all, pending := byCounter(t, gs)
			sameByCounter(t, what, all, want)
			if pendingToo {
				sameByCounter(t, what+", pending", pending, want)
			} else {
				sameByCounter(t, what+", pending", pending, map[descCounter]int64{})
			}
			perCounter(t, what, gs)
			gs, err = l.CountsBy(ctx, q, ledger.GroupBy{Desc: true})
			if err != nil {
				t.Fatalf("%s: CountsBy: %v", what, err)
			}
			every, _ := descCounts(t, gs)
			sameCounts(t, what+", of every user", every, ofEveryUser(want))
			if most := 2 * len(ofEveryUser(want)); len(gs) > most {
				t.Errorf("%s: %d groups of %d counters; want at most %d", what, len(gs), most/2, most)
			}
		}
		read("the tallies pending", true)
		release()
		flush(t, l)
		// Counted by one grouped read: paging through 20,000 entries took
		// the embedded store most of a minute under the race detector.
		if gs, err := l.CountsBy(ctx, q, ledger.GroupBy{}); err != nil || len(gs) != 1 || gs[0].Entries <= ledger.MaxGroups {
			t.Fatalf("the store's entries: %+v %v; the test wants more than MaxGroups distinct texts", gs, err)
		}
		read("the tallies in the store", false)
	})
}

// TestCountsByDescPastMaxGroupsWhileTheStoreIsDown: CountsBy grouped by
// Desc while PostgreSQL is stopped answers from its last read (12,000
// texts, folded), this node's ticked tallies spooled since (3,000 texts)
// and its tallies not yet ticked (3,000 more): together past MaxGroups,
// each counter's sum is exact, the part of after the read pending. Once
// the store is back, it answers the same sums from the store.
func TestCountsByDescPastMaxGroupsWhileTheStoreIsDown(t *testing.T) {
	// Small segments, which the spool drops once the store holds them:
	// this node's read of its records while the store fails goes through
	// the records its spool still holds before the last read one at a
	// time, slowly.
	l, pg, ctx := storeDownLedger(t, ledger.Config{SegmentSize: 64 << 10})
	start := t0.Add(-18_001 * ledger.TallyBucket) // before storeDownLedger's now, t0 + 1h
	q := ledger.SpendQuery{Tenant: "acme", From: start.Add(-time.Hour), To: t0.Add(time.Hour)}
	stored := map[descCounter]int64{}
	descCalls(t, l, "ann", start, 12_000, 1, stored)
	flush(t, l)
	gs, err := l.CountsBy(ctx, q, ledger.GroupBy{User: true, Desc: true})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := byCounter(t, gs)
	sameByCounter(t, "before the outage", all, stored)
	perCounter(t, "before the outage", gs)

	pg.Stop()
	later := map[descCounter]int64{}
	descCalls(t, l, "ann", start.Add(12_000*ledger.TallyBucket), 3_000, 12_001, later)
	if err := ledger.Tick(l); err != nil { // entries in the spool only
		t.Fatal(err)
	}
	release := ledger.HoldTicks(l)
	t.Cleanup(release)
	descCalls(t, l, "ann", start.Add(15_000*ledger.TallyBucket), 3_000, 15_001, later)
	want := map[descCounter]int64{}
	for _, m := range []map[descCounter]int64{stored, later} {
		for k, v := range m {
			want[k] += v
		}
	}
	gs, err = l.CountsBy(ctx, q, ledger.GroupBy{User: true, Desc: true})
	var le *ledger.LocalSpendError
	if !errors.As(err, &le) || le.Unknown {
		t.Fatalf("CountsBy with the store down: %v; want a *LocalSpendError, the store's part known", err)
	}
	all, pending := byCounter(t, gs)
	sameByCounter(t, "the store down", all, want)
	sameByCounter(t, "the store down, pending", pending, later)
	perCounter(t, "the store down", gs)
	// Once more: the answer read from the last one and the spool again
	// is the same.
	gs, _ = l.CountsBy(ctx, q, ledger.GroupBy{User: true, Desc: true})
	all, pending = byCounter(t, gs)
	sameByCounter(t, "the store down, read again", all, want)
	sameByCounter(t, "the store down, read again, pending", pending, later)
	perCounter(t, "the store down, read again", gs)

	release()
	pg.Start()
	flush(t, l)
	gs, err = l.CountsBy(ctx, q, ledger.GroupBy{User: true, Desc: true})
	if err != nil {
		t.Fatal(err)
	}
	all, pending = byCounter(t, gs)
	sameByCounter(t, "after the outage", all, want)
	sameByCounter(t, "after the outage, pending", pending, map[descCounter]int64{})
	perCounter(t, "after the outage", gs)
}
