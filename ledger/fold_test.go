package ledger_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// foldSpans are the calls of TestFoldTallies*: every step over span, the
// span ending ago before the test's now, at each fold level's ages and
// at one too young to fold.
var foldSpans = []struct{ ago, span, step time.Duration }{
	{5 * 24 * time.Hour, 12 * time.Hour, 37 * time.Second}, // six-hour buckets
	{6 * time.Hour, 4 * time.Hour, 23 * time.Second},       // quarter hours
	{20 * time.Minute, 40 * time.Minute, 7 * time.Second},  // minutes
	{0, 10 * time.Minute, 11 * time.Second},                // not folded
}

// foldWindows are the windows TestFoldTallies reads, each with the most
// a fold may add to its start: a bucket of the level whose age is the
// window's length.
var foldWindows = []struct{ w, bucket time.Duration }{
	{time.Minute, 0}, {5 * time.Minute, 0}, {15 * time.Minute, 0},
	{30 * time.Minute, time.Minute}, {time.Hour, time.Minute}, {5 * time.Hour, 15 * time.Minute},
	{24 * time.Hour, 15 * time.Minute}, {7 * 24 * time.Hour, 6 * time.Hour}, {30 * 24 * time.Hour, 0},
}

// foldCalls tallies foldSpans' calls of ann and bob (two shapes) before
// now, on two counters each, and flushes.
func foldCalls(t *testing.T, l *ledger.Ledger, now time.Time) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, s := range foldSpans {
		for at := now.Add(-s.ago - s.span); at.Before(now.Add(-s.ago)); at = at.Add(s.step) {
			user := []string{"ann", "bob"}[n%2]
			e := tallyCall("c"+strconv.Itoa(n), at, user, descLine("search", "acme", 1), descLine("per-project", "acme_p"+strconv.Itoa(n%3), int64(1+n%4)))
			if err := l.Tally(ctx, e); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	flush(t, l)
	return n
}

// windowCounts reads what acme's entries counted on each counter over
// each of foldWindows before now, and over each window widened by its
// bucket.
func windowCounts(t *testing.T, l *ledger.Ledger, now time.Time) (exact, wider []map[string]int64) {
	t.Helper()
	for _, w := range foldWindows {
		for i, from := range []time.Time{now.Add(-w.w), now.Add(-w.w - w.bucket)} {
			gs, err := l.CountsBy(context.Background(), ledger.SpendQuery{Tenant: "acme", From: from, To: now}, ledger.GroupBy{Desc: true})
			if err != nil {
				t.Fatalf("CountsBy: %v", err)
			}
			all, _ := descCounts(t, gs)
			if i == 0 {
				exact = append(exact, all)
			} else {
				wider = append(wider, all)
			}
		}
	}
	return exact, wider
}

// foldLedger sets cfg's clock to stand at the now of foldCalls, and opens
// a ledger of it.
func foldLedger(t *testing.T, cfg *ledger.Config) (*ledger.Ledger, time.Time) {
	t.Helper()
	now := t0.Add(10 * 24 * time.Hour).Truncate(time.Minute).Add(17 * time.Second)
	cfg.Now = func() time.Time { return now }
	return open(t, *cfg), now
}

// tickRows counts acme's tick entries, and checks that the spend roll-up
// counts as many entries as the store holds.
func tickRows(t *testing.T, l *ledger.Ledger, now time.Time) int {
	t.Helper()
	es := all(t, l, ledger.Query{Tenant: "acme"})
	n := 0
	for _, e := range es {
		if strings.HasPrefix(e.RequestID, "tly_") {
			n++
		}
	}
	sum, err := l.Summary(context.Background(), "month", now)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sum {
		if s.Tenant == "acme" && s.Entries != int64(len(es)) {
			t.Errorf("the roll-up counts %d entries of acme in the month; the store holds %d", s.Entries, len(es))
		}
	}
	return n
}

// TestFoldTalliesBoundsStorage: 3,000 calls a tick entry each, over 12
// days, are folded into a few hundred entries: every counter's total is
// the same, a window that reaches back only to calls too young to fold
// counts the same, and every other counts no less, and no more than the
// same window reaching back one bucket further did before. The spend
// roll-up's entry count follows the store's.
func TestFoldTalliesBoundsStorage(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l, now := foldLedger(t, &cfg)
		calls := foldCalls(t, l, now)
		before := tickRows(t, l, now)
		if before != calls {
			t.Fatalf("%d tick entries of %d calls each a second of its own; want one each", before, calls)
		}
		exact, wider := windowCounts(t, l, now)

		dropped, put, err := ledger.FoldTallies(l)
		if err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		after := tickRows(t, l, now)
		t.Logf("%d calls: %d tick entries, %d after the fold (%d dropped, %d put)", calls, before, after, dropped, put)
		if after > 250 || after != before-dropped+put {
			t.Errorf("%d tick entries after the fold, of %d (%d dropped, %d put); want at most 250", after, before, dropped, put)
		}
		checkWindows(t, "after the fold", l, now, exact, wider)

		// A second pass at the same time finds nothing more to fold.
		if d, p, err := ledger.FoldTallies(l); err != nil || d != 0 || p != 0 {
			t.Errorf("a second pass: %d dropped, %d put, %v; want none", d, p, err)
		}
	})
}

// checkWindows checks what acme's entries count over foldWindows against
// what they counted before a fold.
func checkWindows(t *testing.T, what string, l *ledger.Ledger, now time.Time, exact, wider []map[string]int64) {
	t.Helper()
	got, _ := windowCounts(t, l, now)
	for i, w := range foldWindows {
		if w.bucket == 0 {
			sameCounts(t, what+": window "+w.w.String(), got[i], exact[i])
			continue
		}
		for k, v := range exact[i] {
			if got[i][k] < v || got[i][k] > wider[i][k] {
				t.Errorf("%s: window %v: counter %q counts %d; want %d to %d", what, w.w, k, got[i][k], v, wider[i][k])
			}
		}
	}
}

// TestFoldTalliesReplayCountsOnce: the spool replayed from its first
// record after a fold (its "applied" hint lost) inserts the folded
// entries again from their records, and the fold's record after them
// deletes them again: every window counts what it counted after the fold,
// and the store holds as many entries.
func TestFoldTalliesReplayCountsOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l, now := foldLedger(t, &cfg)
		foldCalls(t, l, now)
		if _, _, err := ledger.FoldTallies(l); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		folded := tickRows(t, l, now)
		exact, _ := windowCounts(t, l, now)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(cfg.Dir, "spool", "applied")); err != nil {
			t.Fatal(err)
		}
		l = open(t, cfg)
		flush(t, l)
		if n := tickRows(t, l, now); n != folded {
			t.Errorf("%d tick entries after the replay, %d before", n, folded)
		}
		got, _ := windowCounts(t, l, now)
		for i, w := range foldWindows {
			sameCounts(t, "after the replay: window "+w.w.String(), got[i], exact[i])
		}
	})
}

// TestFoldTalliesAsTimePasses: the same calls, folded by a pass every 97
// minutes of the clock over 12 days, the flusher slow to apply (a batch a
// minute, so that a pass finds the folds of the one before still in the
// spool): every level folds what the level before it folded, and no
// entry is folded twice. The windows count as TestFoldTalliesBoundsStorage
// requires.
func TestFoldTalliesAsTimePasses(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		var clock atomic.Int64
		now := t0.Add(10 * 24 * time.Hour).Truncate(time.Minute).Add(17 * time.Second)
		start := now.Add(-foldSpans[0].ago - foldSpans[0].span)
		clock.Store(start.UnixMicro())
		cfg.Now = func() time.Time { return time.UnixMicro(clock.Load()).UTC() }
		cfg.BatchDelay = time.Minute
		l := open(t, cfg)
		calls := foldCalls(t, l, now)
		exact, wider := windowCounts(t, l, now)
		dropped, put := 0, 0
		for at := start; ; at = at.Add(97 * time.Minute) {
			if at.After(now) {
				at = now // the last pass at now
			}
			clock.Store(at.UnixMicro())
			d, p, err := ledger.FoldTallies(l)
			if err != nil {
				t.Fatal(err)
			}
			dropped, put = dropped+d, put+p
			if at.Equal(now) {
				break
			}
		}
		flush(t, l)
		n := tickRows(t, l, now)
		t.Logf("%d calls: %d tick entries after %d dropped and %d put", calls, n, dropped, put)
		if n != calls-dropped+put || n > 250 {
			t.Errorf("%d tick entries of %d calls, %d dropped and %d put; want their difference, at most 250", n, calls, dropped, put)
		}
		checkWindows(t, "after the passes", l, now, exact, wider)
	})
}

// TestFoldTalliesOwnNodeOnly: two nodes on one PostgreSQL; the one that
// tallied nothing folds none of the other's entries (their records are
// in the other's spool, whose replay would insert them again after this
// node's fold: counted twice), and the one that tallied folds its own.
func TestFoldTalliesOwnNodeOnly(t *testing.T) {
	cfg := postgresConfig(t)
	var clock atomic.Int64
	now := t0.Add(10 * 24 * time.Hour).Truncate(time.Minute).Add(17 * time.Second)
	clock.Store(now.UnixMicro())
	cfg.Now = func() time.Time { return time.UnixMicro(clock.Load()).UTC() }
	a := open(t, cfg)
	other := cfg
	other.Dir = t.TempDir()
	b := open(t, other)
	calls := foldCalls(t, a, now)
	if d, p, err := ledger.FoldTallies(b); err != nil || d != 0 || p != 0 {
		t.Errorf("the other node's pass: %d dropped, %d put, %v; want none of a's entries", d, p, err)
	}
	flush(t, b)
	if n := tickRows(t, a, now); n != calls {
		t.Errorf("%d tick entries after the other node's pass, of %d", n, calls)
	}
	if d, _, err := ledger.FoldTallies(a); err != nil || d == 0 {
		t.Errorf("a's own pass: %d dropped, %v; want its entries folded", d, err)
	}
}

// TestFoldTalliesResumeAfterRestart: a replica stopped for three hours
// (longer than the minute level reads back) goes on folding where its
// last pass ended, from the file Dir/folded: the calls of its last 16
// minutes before the stop are folded into minutes after the restart,
// where without the file they stayed an entry a second until the quarter
// hours took them. A file that does not read is no progress, and no
// error.
func TestFoldTalliesResumeAfterRestart(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		var clock atomic.Int64
		stop := t0.Add(10 * 24 * time.Hour).Truncate(time.Minute)
		clock.Store(stop.UnixMicro())
		cfg.Now = func() time.Time { return time.UnixMicro(clock.Load()).UTC() }
		l := open(t, cfg)
		for s := range 30 * 60 { // the last half hour before the stop
			at := stop.Add(-30*time.Minute + time.Duration(s)*time.Second)
			if err := l.Tally(ctx, tallyCall("c"+strconv.Itoa(s), at, "ann", descLine("search", "acme", 1))); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		if _, _, err := ledger.FoldTallies(l); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		recent := func(l *ledger.Ledger) int {
			n := 0
			for _, e := range all(t, l, ledger.Query{Tenant: "acme", From: stop.Add(-16 * time.Minute), To: stop}) {
				if strings.HasPrefix(e.RequestID, "tly_") {
					n++
				}
			}
			return n
		}
		clock.Store(stop.Add(3 * time.Hour).UnixMicro())
		l = open(t, cfg)
		if n := recent(l); n < 16*6-6 {
			t.Fatalf("%d entries of the last 16 minutes before the stop, before the restart's pass; want one a bucket", n)
		}
		if _, _, err := ledger.FoldTallies(l); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		if n := recent(l); n > 17 {
			t.Errorf("%d entries of the last 16 minutes before the stop after the restart's pass; want one a minute", n)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}

		if err := os.WriteFile(filepath.Join(cfg.Dir, "folded"), []byte("not\na\ntime\n!\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		clock.Store(stop.Add(9 * time.Hour).UnixMicro())
		l = open(t, cfg)
		if _, _, err := ledger.FoldTallies(l); err != nil {
			t.Errorf("a pass after a folded file that does not read: %v", err)
		}
	})
}

// TestFoldTalliesLeavesWhatCosts: a tick entry the store holds with a
// request and a charge (no tick writes one; an older version's entry, or
// an operator's change) is not folded: a fold sums the counters alone,
// and would delete the request and the charge with it.
func TestFoldTalliesLeavesWhatCosts(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l, now := foldLedger(t, &cfg)
		foldCalls(t, l, now)
		var id string
		for _, e := range all(t, l, ledger.Query{Tenant: "acme", To: now.Add(-24 * time.Hour)}) {
			if strings.HasPrefix(e.RequestID, "tly_") {
				id = e.RequestID
				break
			}
		}
		if id == "" {
			t.Fatal("no tick entry older than a day")
		}
		rawExec(t, cfg, "UPDATE ledger_entries SET requests = 1, actual_cost = 5000, cost = 5000 WHERE request_id = '"+id+"'")
		if _, _, err := ledger.FoldTallies(l); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		e, ok, err := l.Lookup(context.Background(), id)
		if err != nil || !ok || e.Requests != 1 || e.Charge() != 5000 {
			t.Errorf("the entry of a request and a charge after the fold: %+v, %v, %v; want it kept", e, ok, err)
		}
	})
}
