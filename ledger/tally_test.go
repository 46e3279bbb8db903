package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// tallyCall is a call that counts only on descriptor limits: search 1 (or
// n) and project p, a KeyDesc as the gate writes it.
func tallyCall(id string, at time.Time, user string, desc ...string) ledger.Entry {
	return ledger.Entry{
		RequestID: id, Tenant: "acme", User: user, Route: "edge", Region: "eu", Decision: "allow", Requests: 1,
		KeyDesc: strings.Join(desc, "\n"), CreatedAt: at,
	}
}

// descLine is a KeyDesc line of n on limit name's counter key.
func descLine(name, key string, n int64) string {
	return fmt.Sprintf("%s\t0\t10\t86400000000000\t10\t0\t%s\t%d", name, key, n)
}

// descCounts sums what groups counted on each counter (a KeyDesc line's
// text before its amount), whatever their user: byCounter's sums, of
// every user.
func descCounts(t *testing.T, gs []ledger.Group) (all, pending map[string]int64) {
	t.Helper()
	byUser, pendingByUser := byCounter(t, gs)
	return ofEveryUser(byUser), ofEveryUser(pendingByUser)
}

func descRead(t *testing.T, l *ledger.Ledger) []ledger.Group {
	t.Helper()
	gs, err := l.CountsBy(context.Background(), ledger.SpendQuery{Tenant: "acme", From: t0.Add(-time.Hour), To: t0.Add(time.Hour)},
		ledger.GroupBy{Desc: true})
	if err != nil {
		t.Fatalf("CountsBy: %v", err)
	}
	return gs
}

// tallyEntries returns acme's entries that tallies made.
func tallyEntries(t *testing.T, l *ledger.Ledger) []ledger.Entry {
	t.Helper()
	page, err := l.Entries(context.Background(), ledger.Query{Tenant: "acme", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []ledger.Entry
	for _, e := range page.Entries {
		if strings.HasPrefix(e.RequestID, "tly_") {
			out = append(out, e)
		}
	}
	return out
}

func sameCounts(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: counter %q counted %d, want %d", what, k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok && v != 0 {
			t.Errorf("%s: counter %q counted %d, want none", what, k, v)
		}
	}
}

// TestTallyAggregates: 100 calls of ann over two seconds and 10 of bob
// become one entry per shape and bucket, with the counters summed;
// CountsBy grouping by Desc sees them at once as pending entries, and
// after Flush from the store, never twice.
func TestTallyAggregates(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		want := map[string]int64{}
		add := func(desc ...string) {
			for _, d := range desc {
				i := strings.LastIndexByte(d, '\t')
				n, _ := strconv.ParseInt(d[i+1:], 10, 64)
				want[d[:i]] += n
			}
		}
		for i := range 100 {
			at := t0.Add(time.Duration(i) * 20 * time.Millisecond) // over two seconds
			desc := []string{descLine("search", "acme", 1), descLine("per-project", "acme_p"+strconv.Itoa(i%3), 2)}
			if err := l.Tally(ctx, tallyCall("ann-"+strconv.Itoa(i), at, "ann", desc...)); err != nil {
				t.Fatal(err)
			}
			add(desc...)
		}
		for i := range 10 {
			desc := []string{descLine("search", "acme", 3)}
			if err := l.Tally(ctx, tallyCall("bob-"+strconv.Itoa(i), t0, "bob", desc...)); err != nil {
				t.Fatal(err)
			}
			add(desc...)
		}
		all, pending := descCounts(t, descRead(t, l))
		// The ticker may have ticked some already: all is exact, pending
		// at most all.
		sameCounts(t, "before Flush", all, want)
		for k, v := range pending {
			if v > all[k] {
				t.Errorf("before Flush: counter %q pending %d of %d", k, v, all[k])
			}
		}
		flush(t, l)
		all, pending = descCounts(t, descRead(t, l))
		sameCounts(t, "after Flush", all, want)
		sameCounts(t, "pending after Flush", pending, map[string]int64{})
		es := tallyEntries(t, l)
		if n := len(es); n < 2 || n > 4 {
			t.Errorf("%d entries of 110 tallies; want one per shape and bucket: 2 (up to 4 when a tick fell between)", n)
		}
		for _, e := range es {
			if e.Requests != 0 || e.Charge() != 0 || e.Status != ledger.StatusSettled {
				t.Errorf("entry %s: requests %d, charge %d, status %s; want 0, 0, settled", e.RequestID, e.Requests, e.Charge(), e.Status)
			}
			if e.CreatedAt.Before(t0) || e.CreatedAt.After(t0.Add(2*time.Second)) {
				t.Errorf("entry %s created at %s: not the time of one of its calls", e.RequestID, e.CreatedAt)
			}
		}
	})
}

// TestTallyLatestCall: an aggregate entry is created at the latest call it
// holds, so that a sliding window counts it a second too long rather than
// a second too short.
func TestTallyLatestCall(t *testing.T) {
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	for _, ms := range []int{900, 100, 500} {
		at := t0.Truncate(time.Second).Add(time.Duration(ms) * time.Millisecond)
		if err := l.Tally(ctx, tallyCall("x", at, "ann", descLine("search", "acme", 1))); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, l)
	es := tallyEntries(t, l)
	if len(es) != 1 {
		t.Fatalf("%d entries, want 1", len(es))
	}
	if want := t0.Truncate(time.Second).Add(900 * time.Millisecond); !es[0].CreatedAt.Equal(want) {
		t.Errorf("created at %s, want the latest call's %s", es[0].CreatedAt, want)
	}
}

// TestTallyKeyDescBound: counters that would take an aggregate's KeyDesc
// past MaxKeyDesc go to another entry of the same shape, never dropped.
func TestTallyKeyDescBound(t *testing.T) {
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	want := map[string]int64{}
	for i := range 200 {
		line := descLine("per-project", "acme_"+strings.Repeat("p", 40)+strconv.Itoa(i), 1)
		if err := l.Tally(ctx, tallyCall("x", t0, "ann", line)); err != nil {
			t.Fatal(err)
		}
		want[line[:strings.LastIndexByte(line, '\t')]] = 1
	}
	splitCountsExact(t, l, want)
}

// splitCountsExact checks that l's tallies of acme count want, pending
// and stored, in several entries (want's counters take more than one
// aggregate), none with a KeyDesc past MaxKeyDesc.
func splitCountsExact(t *testing.T, l *ledger.Ledger, want map[string]int64) {
	t.Helper()
	all, _ := descCounts(t, descRead(t, l))
	sameCounts(t, "pending", all, want)
	flush(t, l)
	all, _ = descCounts(t, descRead(t, l))
	sameCounts(t, "stored", all, want)
	es := tallyEntries(t, l)
	if len(es) < 2 {
		t.Errorf("%d entries for %d counters of about 80 bytes; want several", len(es), len(want))
	}
	for _, e := range es {
		if len(e.KeyDesc) > ledger.MaxKeyDesc {
			t.Errorf("entry %s: KeyDesc of %d bytes, past MaxKeyDesc", e.RequestID, len(e.KeyDesc))
		}
	}
}

// TestTallySumsGrowAcrossSplits: counters enough for two aggregates of
// one shape, each tallied again and again with amounts ten times the last
// (so every sum gains a digit a round and a full aggregate has no room
// for it), some calls carrying several counters: each counter's sum goes
// on in the line it was last given, or a new one when that one is full,
// and every counter counts exactly what it was given, pending and
// stored, no KeyDesc past MaxKeyDesc.
func TestTallySumsGrowAcrossSplits(t *testing.T) {
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	const counters, rounds = 250, 10
	key := func(i int) string { return "acme_" + strings.Repeat("q", 40) + strconv.Itoa(i) }
	want := map[string]int64{}
	amount := int64(1)
	for r := range rounds {
		for i := 0; i < counters; {
			// 1 to 3 counters a call.
			n := min(1+(i+r)%3, counters-i)
			lines := make([]string, n)
			for j := range lines {
				line := descLine("per-project", key(i+j), amount*int64(1+(i+j)%7))
				lines[j] = line
				want[line[:strings.LastIndexByte(line, '\t')]] += amount * int64(1+(i+j)%7)
			}
			if err := l.Tally(ctx, tallyCall("x", t0, "ann", lines...)); err != nil {
				t.Fatal(err)
			}
			i += n
		}
		amount *= 10
	}
	splitCountsExact(t, l, want)
}

// TestTallyRefused: a tally of no counters, or of a line of no amount, is
// invalid, and counts nothing.
func TestTallyRefused(t *testing.T) {
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	for name, desc := range map[string]string{
		"none":      "",
		"no amount": "search\tacme",
		"zero":      descLine("search", "acme", 0),
		"negative":  descLine("search", "acme", -1),
	} {
		if err := l.Tally(ctx, tallyCall("x", t0, "ann", desc)); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if e := tallyCall("", t0, "ann", descLine("search", "acme", 1)); !errors.Is(l.Tally(ctx, e), ledger.ErrInvalid) {
		t.Errorf("a tally of no request id: not ErrInvalid")
	}
	flush(t, l)
	if es := tallyEntries(t, l); len(es) != 0 {
		t.Errorf("%d entries of refused tallies", len(es))
	}
}

// TestTallyTogether: a call's tallies of two tenants (acme's and a rate
// limit domain's, as the gate writes them) are recorded together: both,
// also through a crash before any tick, or, when one is invalid,
// neither.
func TestTallyTogether(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		domain := func(n int64) ledger.Entry {
			e := tallyCall("x", t0, "", descLine("per-address", "{rls:edge}:10.0.0.1", n))
			e.Tenant = "rls:edge"
			return e
		}
		if err := l.Tally(ctx, tallyCall("x", t0, "ann", descLine("search", "acme", 1)), domain(0)); !errors.Is(err, ledger.ErrInvalid) {
			t.Fatalf("a tally of an invalid second entry: %v, want ErrInvalid", err)
		}
		for range 3 {
			if err := l.Tally(ctx, tallyCall("x", t0, "ann", descLine("search", "acme", 1)), domain(2)); err != nil {
				t.Fatal(err)
			}
		}
		if err := ledger.Crash(l); err != nil {
			t.Fatal(err)
		}
		l = open(t, cfg)
		flush(t, l)
		acme, _ := descCounts(t, descRead(t, l))
		sameCounts(t, "acme", acme, map[string]int64{"search\t0\t10\t86400000000000\t10\t0\tacme": 3})
		gs, err := l.CountsBy(ctx, ledger.SpendQuery{Tenant: "rls:edge", From: t0.Add(-time.Hour), To: t0.Add(time.Hour)}, ledger.GroupBy{Desc: true})
		if err != nil {
			t.Fatal(err)
		}
		edge, _ := descCounts(t, gs)
		sameCounts(t, "the domain", edge, map[string]int64{"per-address\t0\t10\t86400000000000\t10\t0\t{rls:edge}:10.0.0.1": 6})
	})
}

// TestTallyCrash: tallies that no tick wrote when the process died are
// written by the next Open, once; those a tick wrote before are not
// written again. Segments the store applied are kept while a tally in
// them is not in an entry.
func TestTallyCrash(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		cfg.SegmentSize = 64 << 10
		ctx := context.Background()
		want := map[string]int64{}
		tally := func(l *ledger.Ledger, n int) {
			t.Helper()
			for i := range n {
				line := descLine("per-project", "acme_p"+strconv.Itoa(i%7), 1)
				if err := l.Tally(ctx, tallyCall("x", t0.Add(time.Duration(i)*time.Millisecond), "ann", line)); err != nil {
					t.Fatal(err)
				}
				want[line[:strings.LastIndexByte(line, '\t')]]++
			}
		}
		crash := func(l *ledger.Ledger) {
			t.Helper()
			if err := ledger.Crash(l); err != nil {
				t.Fatal(err)
			}
		}
		check := func(what string) *ledger.Ledger {
			t.Helper()
			l := open(t, cfg)
			flush(t, l)
			all, _ := descCounts(t, descRead(t, l))
			sameCounts(t, what, all, want)
			return l
		}

		// No tick: the tallies of three segments, applied by the flusher
		// (which writes nothing for them) before the crash.
		l := open(t, cfg)
		tally(l, 3000)
		for l.Stats().Pending > 0 {
			time.Sleep(time.Millisecond) // the flusher reads past them
		}
		crash(l)
		l = check("after a crash before any tick")

		// A tick (Flush), more tallies, a crash.
		tally(l, 500)
		flush(t, l)
		tally(l, 200)
		crash(l)
		l = check("after a crash after a tick")

		// A crash just after a tick.
		tally(l, 100)
		flush(t, l)
		crash(l)
		check("after a crash just after a tick")
	})
}

// TestTallyTicksAmidTallies: tallies from many goroutines at once, while
// ticks (Flush) run beside them, then a crash with the last tick's
// tallies pending: the next open counts every call exactly once. A tally
// whose record a tick's position covers while its counters land in a
// later tick's aggregate would be lost by the recovery; one whose
// counters a tick wrote while its record lies after that tick's position
// would be counted twice.
func TestTallyTicksAmidTallies(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		cfg.SegmentSize = 64 << 10
		ctx := context.Background()
		l := open(t, cfg)
		const workers, calls = 16, 400
		var (
			tallying sync.WaitGroup
			ticking  sync.WaitGroup
			stop     atomic.Bool
		)
		ticking.Add(1)
		go func() {
			defer ticking.Done()
			for !stop.Load() {
				if err := l.Flush(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		want := map[string]int64{}
		for w := range workers {
			line := descLine("per-project", "acme_p"+strconv.Itoa(w), 1)
			want[line[:strings.LastIndexByte(line, '\t')]] = calls
			tallying.Add(1)
			go func() {
				defer tallying.Done()
				for i := range calls {
					if err := l.Tally(ctx, tallyCall("x", t0.Add(time.Duration(i)*time.Millisecond), "ann", line)); err != nil {
						t.Error(err)
						return
					}
					if i == calls/2 && w == 0 {
						// The last ticks end while half the calls are
						// still to come.
						stop.Store(true)
					}
				}
			}()
		}
		ticking.Wait()
		tallying.Wait()
		if err := ledger.Crash(l); err != nil {
			t.Fatal(err)
		}
		l = open(t, cfg)
		flush(t, l)
		all, _ := descCounts(t, descRead(t, l))
		sameCounts(t, "after ticks amid tallies and a crash", all, want)
	})
}

// tallyUsers tallies one call of each of n users, each on a counter of
// its own, with the ticks held (so that one tick then writes them all),
// and returns what each counter counted.
func tallyUsers(t *testing.T, l *ledger.Ledger, n int) map[string]int64 {
	t.Helper()
	release := ledger.HoldTicks(l)
	defer release()
	want := map[string]int64{}
	for i := range n {
		line := descLine("per-user", "acme_u"+strconv.Itoa(i), 1)
		if err := l.Tally(context.Background(), tallyCall("x", t0, "u"+strconv.Itoa(i), line)); err != nil {
			t.Fatal(err)
		}
		want[line[:strings.LastIndexByte(line, '\t')]]++
	}
	return want
}

// TestTallyTickIsOneAppend: a tick's entries and its tick record go to
// the spool in one write, all or none. It appended each entry's two
// records and then the tick record one by one (601 writes for 300
// aggregates): a process that died between them left entries whose
// tallies the recovery aggregated again, counted twice, and each tick
// cost a write(2) per record.
func TestTallyTickIsOneAppend(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		want := tallyUsers(t, l, 300)
		was := ledger.SpoolWrites(l)
		if err := ledger.Tick(l); err != nil {
			t.Fatal(err)
		}
		if n := ledger.SpoolWrites(l) - was; n != 1 {
			t.Errorf("a tick of 300 aggregates made %d writes; want 1", n)
		}
		flush(t, l)
		all, _ := descCounts(t, descRead(t, l))
		sameCounts(t, "after the tick", all, want)
	})
}

// TestTallyCrashMidTick: a process that dies while a tick's write is
// under way leaves some of its entries, or all of them without their
// tick record, at the spool's end, which the flusher never read. The
// next Open cuts them off and the recovery tick counts their tallies
// once; kept, they held the tallies the recovery counted again.
func TestTallyCrashMidTick(t *testing.T) {
	for _, c := range []struct {
		name string
		cut  func(start, end int64) int64 // the spool position the write stopped at
	}{
		{"the tick record torn", func(_, end int64) int64 { return end - 1 }},
		{"half the entries", func(start, end int64) int64 { return start + (end-start)/2 }},
		{"one byte", func(start, _ int64) int64 { return start + 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, cfg ledger.Config) {
				cfg.BatchDelay = time.Minute // the flusher reads nothing of the tick before the crash
				l := open(t, cfg)
				want := tallyUsers(t, l, 300)
				start := ledger.SpoolEnd(l)
				if err := ledger.Tick(l); err != nil {
					t.Fatal(err)
				}
				end := ledger.SpoolEnd(l)
				if err := ledger.Crash(l); err != nil {
					t.Fatal(err)
				}
				segs, err := filepath.Glob(filepath.Join(cfg.Dir, "spool", "*.spool"))
				if err != nil || len(segs) == 0 {
					t.Fatalf("spool segments: %v, %v", segs, err)
				}
				last := segs[len(segs)-1]
				fi, err := os.Stat(last)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(last, fi.Size()-(end-c.cut(start, end))); err != nil {
					t.Fatal(err)
				}
				l = open(t, cfg)
				flush(t, l)
				all, _ := descCounts(t, descRead(t, l))
				sameCounts(t, "after a crash amid a tick's write", all, want)
			})
		})
	}
}

// TestTickEntryIDsAreTheLedgers: a request id that starts as a tick's
// entries' do is refused, so that no request's records are taken for a
// tick's entries cut short (see TestTallyCrashMidTick).
func TestTickEntryIDsAreTheLedgers(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		e := reservation("tly_n_12345678_1_0", t0)
		if err := l.Reserve(ctx, e); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("Reserve of a tick entry's id: %v; want ErrInvalid", err)
		}
		if err := l.Settle(ctx, settlement("tly_x", 1)); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("Settle of a tick entry's id: %v; want ErrInvalid", err)
		}
	})
}

// TestTallyBucketsOfTenSeconds: a shape called every second for two
// minutes is twelve entries, one per ten seconds of the UTC clock, each
// created at the latest call it holds. A window that starts on the
// minute counts exactly its calls; one that starts within a bucket
// counts no fewer than its calls, and no more than the calls since that
// bucket's start.
func TestTallyBucketsOfTenSeconds(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		release := ledger.HoldTicks(l) // the test's buckets written in one tick
		t.Cleanup(release)
		ctx := context.Background()
		start := t0.Truncate(time.Minute).Add(time.Minute)
		const calls = 120
		for i := range calls {
			if err := l.Tally(ctx, tallyCall("c"+strconv.Itoa(i), start.Add(time.Duration(i)*time.Second), "ann", descLine("search", "acme", 1))); err != nil {
				t.Fatal(err)
			}
		}
		release()
		flush(t, l)
		es := tallyEntries(t, l)
		if len(es) != calls/10 {
			t.Fatalf("%d entries of %d calls a second apart; want one per ten seconds: %d", len(es), calls, calls/10)
		}
		latest := map[time.Time]bool{}
		for i := 9; i < calls; i += 10 {
			latest[start.Add(time.Duration(i)*time.Second)] = true
		}
		for _, e := range es {
			if !latest[e.CreatedAt] {
				t.Errorf("entry %s created at %s: not the latest call of a bucket", e.RequestID, e.CreatedAt)
			}
		}
		count := func(from, to time.Time) int64 {
			t.Helper()
			gs, err := l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", From: from, To: to}, ledger.GroupBy{Desc: true})
			if err != nil {
				t.Fatalf("CountsBy: %v", err)
			}
			all, _ := descCounts(t, gs)
			var n int64
			for _, v := range all {
				n += v
			}
			return n
		}
		for _, m := range []time.Time{start, start.Add(time.Minute)} {
			if n := count(m, m.Add(time.Minute)); n != 60 {
				t.Errorf("the minute from %s counts %d calls; want 60", m, n)
			}
		}
		for _, off := range []time.Duration{5 * time.Second, 25 * time.Second, 61 * time.Second, 99 * time.Second} {
			from := start.Add(off)
			since := int64(calls - off/time.Second)
			bucket := int64(calls - off.Truncate(ledger.TallyBucket)/time.Second)
			if n := count(from, start.Add(time.Hour)); n < since || n > bucket {
				t.Errorf("the window from %s counts %d calls; want %d to %d", from, n, since, bucket)
			}
		}
	})
}

// TestTallyTicksEarlyPastMaxPendingShapes: tallies of more shapes than
// the aggregates may hold (a caller that sends another user on every
// call) are written without waiting for their bucket's end.
func TestTallyTicksEarlyPastMaxPendingShapes(t *testing.T) {
	defer ledger.SetMaxPendingShapes(100)()
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	justAfterATick()
	for i := range 200 {
		if err := l.Tally(ctx, tallyCall("u"+strconv.Itoa(i), time.Time{}, "u"+strconv.Itoa(i), descLine("search", "acme", 1))); err != nil {
			t.Fatal(err)
		}
	}
	storeHoldsSoon(t, l, 100, "200 shapes were tallied; want the first 100 ticked early")
}

// TestTallyAtkOneShapeManyCountersTicksEarly: one caller that sends
// another project on every call adds a counter to its one shape's
// aggregates each time. Counted by shapes, the aggregates grew with the
// calls' rate until their bucket ended; counted by the memory they take,
// they are written early.
func TestTallyAtkOneShapeManyCountersTicksEarly(t *testing.T) {
	defer ledger.SetMaxPendingBytes(64 << 10)()
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	justAfterATick()
	for i := range 2000 {
		if err := l.Tally(ctx, tallyCall("x", time.Time{}, "ann", descLine("per-project", "acme_p"+strconv.Itoa(i), 1))); err != nil {
			t.Fatal(err)
		}
	}
	storeHoldsSoon(t, l, 1, "2,000 counters of one shape were tallied; want them ticked early")
}

// justAfterATick waits until the host's clock is just after a tick: the
// next one is 5 s away or more.
func justAfterATick() {
	for time.Since(time.Now().Truncate(ledger.TallyBucket)) > ledger.TallyBucket/2 ||
		time.Since(time.Now().Truncate(ledger.TallyBucket)) < 200*time.Millisecond {
		time.Sleep(50 * time.Millisecond)
	}
}

// storeHoldsSoon waits up to 3 s for l's store to hold n of acme's
// entries, and fails with what when it does not. It does not flush,
// which ticks: the flusher writes a tick's entries within its batch
// delay.
func storeHoldsSoon(t *testing.T, l *ledger.Ledger, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		page, err := l.Entries(context.Background(), ledger.Query{Tenant: "acme", Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Entries) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tally entries in the store 3 s after %s", len(page.Entries), what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failingTicks opens a ledger whose spool segment is filled to within 6
// KiB of its end, just after a tick, with the process then out of file
// descriptors until restore: a tick that needs the next segment fails.
// failed counts the ticks that failed.
func failingTicks(t *testing.T) (l *ledger.Ledger, failed *atomic.Int64, restore func()) {
	t.Helper()
	failed = new(atomic.Int64)
	cfg := ledger.Config{Dir: t.TempDir(), SegmentSize: 64 << 10, Logf: func(f string, a ...any) {
		if msg := fmt.Sprintf(f, a...); strings.Contains(msg, "kept for the next tick") {
			failed.Add(1)
		}
		t.Logf(f, a...)
	}}
	l = open(t, cfg)
	ledAtkFillSegment(t, l, cfg.Dir, 58<<10) // to within 6 KiB
	justAfterATick()
	return l, failed, ledAtkOutOfFiles(t)
}

// TestTallyAtkFailingTickNotAskedAgainAtEveryTally: the spool takes a
// tally's small append but not a tick's, which must open the next segment
// while the process is out of file descriptors. A tally past
// maxPendingBytes asks for an early tick, which fails; the tallies that
// follow must not ask again each (every tick encodes every aggregate
// again: at 65,536 of them, a tick is tens of milliseconds of CPU, so a
// tick per tally took a core while the fault lasted). The ticks on the
// clock still retry.
func TestTallyAtkFailingTickNotAskedAgainAtEveryTally(t *testing.T) {
	defer ledger.SetMaxPendingShapes(20)()
	l, failed, restore := failingTicks(t)
	defer restore()
	ctx := context.Background()
	tallied := 0
	for i := range 40 {
		if err := l.Tally(ctx, tallyCall("u", time.Time{}, "u"+strconv.Itoa(i), descLine("search", "acme", 1))); err != nil {
			break // the segment is full: the tally needs the next one too
		}
		tallied++
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	restore()
	if tallied <= 21 {
		t.Fatalf("%d tallies taken before the segment filled; the test wants more than 21", tallied)
	}
	if n := failed.Load(); n != 1 {
		t.Fatalf("%d early ticks failed for %d tallies past the first 20; want 1, then none until the clock's", n, tallied-20)
	}
}

// TestTallyAtkFailedTickThenSameCounters: a tick that cannot append its
// entries (the segment full, the process out of file descriptors) puts
// its aggregates back; the tallies that follow, on the same counters of
// the same shape, add to them. Once the fault ends, every counter counts
// exactly the tallies taken, pending and stored: none is lost with the
// failed tick, none counted twice by the aggregates put back beside the
// new ones.
func TestTallyAtkFailedTickThenSameCounters(t *testing.T) {
	defer ledger.SetMaxPendingShapes(1)()
	l, failed, restore := failingTicks(t)
	defer restore()
	ctx := context.Background()
	want := map[string]int64{}
	lines := []string{descLine("search", "acme", 2), descLine("per-project", "acme_p1", 3)}
	for i := range 60 {
		if err := l.Tally(ctx, tallyCall("u", time.Time{}, "ann", lines[i%2], lines[(i+1)%2])); err != nil {
			break // the segment is full: the tally needs the next one too
		}
		for _, line := range lines {
			k := line[:strings.LastIndexByte(line, '\t')]
			n, _ := strconv.ParseInt(line[len(k)+1:], 10, 64)
			want[k] += n
		}
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if failed.Load() == 0 {
		t.Fatal("no tick failed: the test did not put aggregates back")
	}
	if len(want) == 0 {
		t.Fatal("no tally was taken")
	}
	now := time.Now()
	read := func() map[string]int64 {
		gs, err := l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", From: now.Add(-time.Hour), To: now.Add(time.Hour)},
			ledger.GroupBy{Desc: true})
		if err != nil {
			t.Fatal(err)
		}
		all, _ := descCounts(t, gs)
		return all
	}
	sameCounts(t, "pending, the fault on", read(), want)
	restore()
	flush(t, l)
	sameCounts(t, "stored", read(), want)
}
