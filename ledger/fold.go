package ledger

// Folding bounds what the tallies cost in storage. A tick writes an entry
// per shape and ten seconds (see tally.go), so that a tenant called every
// few seconds writes 8,640 entries a day, kept as long as the ledger's store
// keeps anything, for a column that only a restore after a limiter's
// data loss reads. Once a minute a fold pass reads this node's tick
// entries that are old enough and replaces those of one shape and one
// bucket of time by one entry (more where MaxKeyDesc splits it) that sums
// their counters, created at the latest call of any of them, as a tick's
// entry is:
//
//   - older than 16 minutes, a minute's entries become one;
//   - older than 4 hours, a quarter hour's;
//   - older than 4 days, six hours';
//   - older than 40 days (a restore of descriptor counters reads 32), a
//     UTC day's.
//
// A shape called every second writes 8,640 entries a day; folded, it
// keeps at most 96 of its last 16 minutes, 224 of the hours before 4
// hours, 368 of the days before 4 days, 144 of the days before 40, and
// one a day past that.
//
// A window that starts at time T counts an entry created after T, so a
// folded entry counts in it the calls of its bucket before T too: at most
// a bucket's worth of calls beyond the window's start, and a bucket is at
// most a sixteenth of the age at which it is folded, so of any window
// that reaches back to it. A restore counts at most that much more, never
// less. The buckets start on the UTC minute, quarter hour, six hours and
// day, so a window that starts on a bucket's start (a fixed window of a
// minute, an hour, a day) counts exactly what it counted.
//
// A fold is a spool record (kindFold) that names the entries it deletes
// and holds those it inserts, applied in one transaction by the flusher
// as every record is: a restore reads the entries before it or after it,
// never half of it. A node folds only its own entries: their records are
// in its spool before the fold's, so a replay of its spool (an "applied"
// hint lost) inserts them again and the fold deletes them again, where a
// fold by another node would leave them counted twice. A node that no
// longer runs leaves its entries unfolded. A pass that finds an earlier
// fold not yet in the store has the flusher write it first: two folds of
// one entry read from the same store would both insert its counters.
//
// Each level's passes go on where the last one ended, which the file
// Dir/folded keeps across runs (a hint: lost, a level reads back its
// lookback before its age; behind, a pass folds again what is folded,
// which changes nothing). A pass reads at most an hour of a level, or a
// bucket where that is longer (foldSpan), so that a replica that was stopped long catches up over
// several passes: each reads every entry created in its span, of every
// node (the store's index is by creation time), and folds its own.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// foldLevels are the fold's levels: entries older than age are folded in
// buckets of size, and a level with no progress kept reads back lookback.
var foldLevels = [...]struct{ age, size, lookback time.Duration }{
	{16 * time.Minute, time.Minute, time.Hour},
	{4 * time.Hour, 15 * time.Minute, 24 * time.Hour},
	{4 * 24 * time.Hour, 6 * time.Hour, 8 * 24 * time.Hour},
	{40 * 24 * time.Hour, 24 * time.Hour, 8 * 24 * time.Hour},
}

// foldInterval is the wait between two fold passes.
const foldInterval = time.Minute

// foldSpan is the most of a level one pass reads: an hour, or a bucket
// where that is longer.
func foldSpan(size time.Duration) time.Duration { return max(size, time.Hour) }

// foldGroupMax bounds the entries one fold deletes: a bucket of a shape
// with more is folded in several.
const foldGroupMax = 512

// folds is a ledger's fold state.
type folds struct {
	mu   sync.Mutex // one pass at a time
	path string     // where done is kept (Dir/folded)
	done [len(foldLevels)]time.Time
	last int64 // the spool's end after the last fold appended
	seq  int64 // folds appended in this run: their entries' ids
}

// load reads where each level's passes ended, from path. A file that is
// missing or does not read is no progress: each level reads back its
// lookback.
func (f *folds) load(path string, logf func(string, ...any)) {
	f.path = path
	b, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			logf("ledger: %v (folding starts over)", err)
		}
		return
	}
	fields := strings.Fields(string(b))
	if len(fields) != len(f.done) {
		logf("ledger: %s holds %d times, not %d (folding starts over)", path, len(fields), len(f.done))
		return
	}
	var done [len(foldLevels)]time.Time
	for i, s := range fields {
		us, err := strconv.ParseInt(s, 10, 64)
		if err != nil || us < 0 {
			logf("ledger: %s: %q is not a time (folding starts over)", path, s)
			return
		}
		if us > 0 { // 0: the level has not run
			done[i] = time.UnixMicro(us).UTC()
		}
	}
	f.done = done
}

// save writes where each level's passes ended.
func (f *folds) save() error {
	var b []byte
	for _, t := range f.done {
		var us int64
		if !t.IsZero() {
			us = t.UnixMicro()
		}
		b = strconv.AppendInt(b, us, 10)
		b = append(b, '\n')
	}
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, f.path)
}

// foldTallies runs a fold pass at the ledger's clock: it returns the
// entries its folds delete and insert. A fold it appended before that is
// not in the store yet is written first.
func (l *Ledger) foldTallies(ctx context.Context) (dropped, put int, err error) {
	if l.spool == nil {
		return 0, 0, nil
	}
	l.folds.mu.Lock()
	defer l.folds.mu.Unlock()
	moved := false
	defer func() {
		if moved {
			if serr := l.folds.save(); serr != nil {
				l.cfg.Logf("ledger: keeping where folding ended: %v", serr)
			}
		}
	}()
	now := l.cfg.Now()
	for i, lv := range foldLevels {
		l.mu.Lock()
		applied := l.applied
		l.mu.Unlock()
		if applied < l.folds.last {
			// A level's fold is read again by the next level's, and two
			// folds of one entry computed from the same store would
			// both insert its counters: wait for it to be applied.
			if err := l.FlushUnlessFailing(ctx); err != nil {
				return dropped, put, err
			}
		}
		hi := now.Add(-lv.age).Truncate(lv.size)
		lo := l.folds.done[i].Truncate(lv.size)
		if lo.IsZero() || lo.After(hi) {
			// The first pass, or a clock set back: read back lookback.
			lo = hi.Add(-lv.lookback)
		}
		if end := lo.Add(foldSpan(lv.size)); end.Before(hi) {
			hi = end
		}
		if !lo.Before(hi) {
			continue
		}
		d, p, err := l.foldRange(ctx, lv.size, lo, hi, now)
		dropped, put = dropped+d, put+p
		if err != nil {
			return dropped, put, err
		}
		l.folds.done[i] = hi
		moved = true
	}
	return dropped, put, nil
}

// foldGroup is what a fold of one shape and bucket deletes, the entries
// whose counters it sums.
type foldGroup struct {
	k    tallyShape
	drop []string
}

// foldRange folds this node's tick entries created in [lo, hi) in buckets
// of size.
func (l *Ledger) foldRange(ctx context.Context, size time.Duration, lo, hi, now time.Time) (dropped, put int, err error) {
	const page = 1000
	var (
		after  *cursor
		bucket int64 = -1
		sums         = &tallies{} // the sums of the bucket's groups, by shape
		groups       = map[tallyShape]*foldGroup{}
		recs   []record
	)
	emit := func(g *foldGroup) {
		aggs := sums.shapes[g.k].aggs
		delete(sums.shapes, g.k)
		delete(groups, g.k)
		if len(aggs) >= len(g.drop) || len(aggs) > maxFoldPuts {
			return // nothing to gain, or too many to hold
		}
		l.folds.seq++
		f := &fold{drop: g.drop, put: make([]Entry, len(aggs))}
		prefix := tickEntryPrefix + l.node + "_" + l.marker[:8] + ".f" + strconv.FormatInt(l.folds.seq, 36) + "_"
		for i, a := range aggs {
			e := a.e
			e.RequestID = prefix + strconv.Itoa(i)
			e.KeyDesc = a.desc()
			e.Status, e.Requests = StatusSettled, 0
			e.SettledAt = micro(now)
			if e.SettledAt.Before(e.CreatedAt) {
				e.SettledAt = e.CreatedAt
			}
			f.put[i] = e
		}
		r := record{kind: kindFold, fold: f}
		if len(appendFrame(nil, &r)) > maxPayload {
			return
		}
		recs = append(recs, r)
	}
	// write appends the folds emitted so far, 64 a write(2): a pass that
	// catches up an hour of many tallies holds no more of them.
	write := func() error {
		for len(recs) > 0 {
			n := min(len(recs), 64)
			rs := make([]*record, n)
			for i := range rs {
				rs[i] = &recs[i]
			}
			end, err := l.spool.appendAll(l.cfg.SpoolLimit, rs...)
			if err != nil {
				return fmt.Errorf("ledger: tally folds: %w", err)
			}
			l.folds.last = end
			for _, r := range recs[:n] {
				dropped, put = dropped+len(r.fold.drop), put+len(r.fold.put)
			}
			recs = recs[n:]
			select {
			case l.wake <- struct{}{}:
			default:
			}
		}
		return nil
	}
	flushBucket := func() {
		for _, g := range groups {
			emit(g) // deletes g from groups
		}
		sums = &tallies{}
	}
	for {
		es, err := l.store.tickEntries(ctx, l.node, lo, hi, after, page)
		if err != nil {
			return dropped, put, err
		}
		for i := range es {
			e := &es[i]
			b := e.CreatedAt.Truncate(size).UnixMicro()
			if b != bucket {
				flushBucket()
				bucket = b
			}
			lines, err := parseTally(e.KeyDesc)
			if err != nil || !ofNoCost(e) {
				continue // not a tick's: left as it is
			}
			k := shapeOf(e)
			k.bucket = b
			g := groups[k]
			if g == nil {
				g = &foldGroup{k: k}
				groups[k] = g
			}
			g.drop = append(g.drop, e.RequestID)
			sums.addAs(k, e, lines)
			if len(g.drop) == foldGroupMax {
				emit(g)
			}
		}
		if len(recs) >= 64 {
			if err := write(); err != nil {
				return dropped, put, err
			}
		}
		if len(es) < page {
			break
		}
		last := &es[len(es)-1]
		after = &cursor{last.CreatedAt, last.RequestID}
	}
	flushBucket()
	return dropped, put, write()
}

// ofNoCost reports whether e counts nothing but its KeyDesc, as a tick's
// entry: a fold sums KeyDesc alone, and would lose the rest.
func ofNoCost(e *Entry) bool {
	return e.Requests == 0 && e.EstimatedCost == 0 && e.ActualCost == 0 &&
		e.Estimated == (costmodel.Usage{}) && e.Actual == (costmodel.Usage{})
}

// foldLoop runs a fold pass foldInterval after the last one ended, until
// the ledger closes.
func (l *Ledger) foldLoop(ctx context.Context) {
	l.every(func(time.Time) time.Duration { return foldInterval }, nil, func() {
		if _, _, err := l.foldTallies(ctx); err != nil && ctx.Err() == nil {
			l.cfg.Logf("ledger: folding tally entries: %v (again in %v)", err, foldInterval)
		}
	})
}
