package ledger

// The spool is the ledger's write-ahead log: a directory of segment files,
// each named by the spool position (a byte offset counted from the first
// record ever written) of its first byte. Records are only ever appended to
// the last segment; a segment past SegmentSize is fsynced and a new one
// started. The flusher reads records from the applied position onwards and,
// once they are in the store, advances the applied position, records it in
// the file "applied" (a hint: replay is idempotent, so losing it only costs
// time) and deletes the segments wholly before it, but not those that hold
// a tally no entry holds yet (see Ledger.tick).
//
// Durability: append returns once the record is in the operating system
// with one write(2), which survives the death of the process. A background
// fsync every SyncInterval, or a group fsync that the caller waits for when
// SyncEach is set, makes it survive the machine. At open, a torn or corrupt
// tail of the last segment (a write the machine did not finish) is cut off;
// damage anywhere else is an error, never skipped silently.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrSpoolFull is returned by Reserve while the spool holds more than
// Config.SpoolLimit bytes that are not yet in the store.
var ErrSpoolFull = errors.New("ledger: spool full: the store has been unreachable too long")

// ErrClosed is returned by calls on a closed Ledger.
var ErrClosed = errors.New("ledger: closed")

type segment struct {
	base int64 // spool position of its first byte
	size int64 // bytes of complete records
}

func segmentName(base int64) string { return fmt.Sprintf("%020d.spool", base) }

type spool struct {
	dir     string
	segSize int64
	names   interner // read's, which only the flusher calls

	mu      sync.Mutex
	synced  *sync.Cond // signalled when syncPos advances
	segs    []segment  // ascending; the last is the one appended to
	f       *os.File   // the last segment, open for appending
	end     int64      // position after the last complete record
	syncPos int64      // position up to which the data is fsynced
	applied int64      // position up to which the data is in the store
	hinted  time.Time  // when the "applied" file was last written
	err     error      // a failed write or fsync; the spool refuses appends after it
	closed  bool
	fsyncs  int64 // fsyncs done by sync, for tests and benchmarks
	writes  int64 // write(2) calls of appends, for tests
	// readBytes counts the bytes reads took from the segments' files,
	// for tests.
	readBytes atomic.Int64
	// keep is at most the position of the first tally that no entry
	// holds yet (see Ledger.tick), maxPosition when there is none: a
	// segment is deleted only once both applied and keep pass it.
	keep int64

	// Group commit (see append): writing is set while an append's write
	// of inWrite bytes is under way with mu released; gathering while the
	// append that found nothing under way lets the goroutines ready to run
	// queue behind it before it writes; next is the queue of records
	// behind either, queued their bytes; written wakes the queued
	// appenders.
	writing   bool
	gathering bool
	inWrite   int64
	next      *pendingWrite
	queued    int64
	written   *sync.Cond

	bufs    sync.Pool // of *[]byte: one record's frame
	batches sync.Pool // of *[]byte: a queue of records
}

// openSpool opens or creates the spool in dir, cutting a torn tail off the
// last segment. logf reports what was cut.
func openSpool(dir string, segSize int64, logf func(string, ...any)) (*spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger: spool: %w", err)
	}
	s := &spool{dir: dir, segSize: segSize}
	s.synced = sync.NewCond(&s.mu)
	s.written = sync.NewCond(&s.mu)
	s.bufs.New = func() any { b := make([]byte, 0, 512); return &b }

	names, err := filepath.Glob(filepath.Join(dir, "*.spool"))
	if err != nil {
		return nil, fmt.Errorf("ledger: spool: %w", err)
	}
	for _, n := range names {
		base, err := strconv.ParseInt(strings.TrimSuffix(filepath.Base(n), ".spool"), 10, 64)
		if err != nil || base < 0 {
			return nil, fmt.Errorf("ledger: spool: unexpected file %s", n)
		}
		s.segs = append(s.segs, segment{base: base})
	}
	sort.Slice(s.segs, func(i, j int) bool { return s.segs[i].base < s.segs[j].base })

	// applied is a hint (see spool): one that cannot be right (past any
	// position a spool reaches, past the end, or between two records) is
	// ignored, and replay starts at the first record, as without one.
	applied := int64(-1)
	if b, err := os.ReadFile(filepath.Join(dir, "applied")); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v >= 0 && v < maxPosition {
			applied = v
		}
	}
	hinted := false // applied is where a record of a segment starts, or their end
	// The first tally after the last tick's position, or a position
	// before it (see keep); -1 for none.
	uncovered, ticked := int64(-1), int64(0)

	for i := range s.segs {
		last := i == len(s.segs)-1
		seg := &s.segs[i]
		path := filepath.Join(dir, segmentName(seg.base))
		if i > 0 && seg.base != s.segs[i-1].base+s.segs[i-1].size {
			return nil, fmt.Errorf("%w: gap before %s", errCorrupt, path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("ledger: spool: %w", err) // a file it cannot read is not cut
		}
		// Where the records at the segment's end that are a tick's
		// entries start, -1 for none (see below).
		tickEntries := int64(-1)
		size, starts, err := scanSegment(b, applied-seg.base, func(off int64, r *record) {
			switch {
			case (r.kind == kindReserve || r.kind == kindSettle) && strings.HasPrefix(r.e.RequestID, tickEntryPrefix):
				if tickEntries < 0 {
					tickEntries = seg.base + off
				}
			default:
				tickEntries = -1
			}
			switch {
			case r.kind == kindTally && uncovered < 0:
				uncovered = seg.base + off
			case r.kind == kindTick && r.pos > ticked:
				ticked = r.pos
				if uncovered >= 0 && uncovered < ticked {
					// The tallies after the tick's position, if any, are
					// past it: kept from there.
					uncovered = ticked
				}
			}
		})
		if err != nil && !last {
			return nil, fmt.Errorf("ledger: spool %s: %w", path, err)
		}
		if err != nil && !errors.Is(err, errTorn) {
			// A write the machine did not finish is the file's end, or
			// blocks it never wrote (zeros) before a later write it did
			// (neither fsynced: an fsync would have written both). Any
			// other bad record before a whole one is damage.
			if after, zeros := wholeRecordAfter(b, size); after >= 0 && !zeros {
				return nil, fmt.Errorf("ledger: spool %s: %w at offset %d, and a whole record follows at %d: damage, not a torn write; move the spool aside to start without it", path, err, size, after)
			}
		}
		if err != nil {
			logf("ledger: spool %s: cutting %d bytes of torn tail at offset %d: %v", path, int64(len(b))-size, size, err)
			if err := os.Truncate(path, size); err != nil {
				return nil, fmt.Errorf("ledger: spool: %w", err)
			}
		}
		seg.size = size
		hinted = hinted || starts
		if last && tickEntries >= 0 && tickEntries >= applied {
			// A tick's entries and its tick record are one write: entries
			// with no tick record after them are a write the death of the
			// process cut short, which the flusher never read (the spool's
			// end passes a write only once it is whole). The recovery tick
			// aggregates their tallies again: kept, they would count twice.
			// (A machine that lost power after the flusher stored them,
			// before an fsync covered the tick record, still counts them
			// twice: early, never late.)
			logf("ledger: spool %s: cutting %d bytes of a tick's entries without their tick record at offset %d", path, size-(tickEntries-seg.base), tickEntries-seg.base)
			if err := os.Truncate(path, tickEntries-seg.base); err != nil {
				return nil, fmt.Errorf("ledger: spool: %w", err)
			}
			seg.size = tickEntries - seg.base
		}
	}

	if len(s.segs) == 0 {
		s.segs = []segment{{base: max(applied, 0)}}
		hinted = true
	}
	lastSeg := s.segs[len(s.segs)-1]
	s.end = lastSeg.base + lastSeg.size
	first := s.segs[0].base
	if !hinted || applied < first {
		if applied >= 0 && applied != first {
			logf("ledger: spool: the applied position %d is not one of the spool's (%d to %d); replaying from %d", applied, first, s.end, first)
		}
		applied = first
	}
	s.applied, s.syncPos = applied, s.end
	s.keep = maxPosition
	if uncovered >= 0 {
		s.keep = uncovered
	}

	f, err := os.OpenFile(filepath.Join(dir, segmentName(lastSeg.base)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ledger: spool: %w", err)
	}
	s.f = f
	if err := syncDir(dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("ledger: spool: %w", err)
	}
	s.dropApplied()
	return s, nil
}

// scanSegment returns the size of the valid records at the start of a
// segment's bytes, whether one of them starts at offset at (or their end
// is there), and why it stops there when that is not their end. It calls
// each, when not nil, with each valid record and its offset.
func scanSegment(b []byte, at int64, each func(off int64, r *record)) (int64, bool, error) {
	var r record
	off := int64(0)
	starts := at == 0
	for off < int64(len(b)) {
		n, err := readFrame(b[off:], &r, nil)
		if err != nil {
			return off, starts, err
		}
		if each != nil {
			each(off, &r)
		}
		off += int64(n)
		starts = starts || off == at
	}
	return off, starts, nil
}

// maxPosition bounds the spool positions an applied hint may name: a
// spool written at a gigabyte a second for a hundred years stays below.
const maxPosition = 1 << 62

// wholeRecordAfter returns the offset of the first whole, valid record of
// a segment's bytes b that starts after offset from, or -1 when none
// does, and whether the bytes before it, from from on, are all zeros.
func wholeRecordAfter(b []byte, from int64) (after int64, zeros bool) {
	var r record
	for off := from + 1; off+frameHeader <= int64(len(b)); off++ {
		if _, err := readFrame(b[off:], &r, nil); err == nil {
			return off, !slices.ContainsFunc(b[from:off], func(c byte) bool { return c != 0 })
		}
	}
	return -1, false
}

// append writes r and returns the position after it. With limit > 0 it
// refuses when more than limit bytes are not yet in the store.
//
// Appends share writes (group commit): a record that finds another write
// under way, or an append yielding before its own (see appendAll), is
// queued behind it, and the first of the queued appenders to run once
// that write ends (or the yielding one) writes the whole queue in one
// write(2) for all of them. Every append still returns only once its record is in the
// operating system, so a crash loses none that an append returned.
func (s *spool) append(r *record, limit int64) (int64, error) {
	return s.appendAll(limit, r)
}

// appendAll is append of the records rs together, in order: one write,
// all or none of them.
func (s *spool) appendAll(limit int64, rs ...*record) (int64, error) {
	return s.appendEach(limit, nil, rs)
}

// appendEach is appendAll that also sets ends[i], when ends is not nil,
// to the position where rs[i] ends.
func (s *spool) appendEach(limit int64, ends []int64, rs []*record) (int64, error) {
	bp := s.bufs.Get().(*[]byte)
	b := (*bp)[:0]
	for i, r := range rs {
		b = appendFrame(b, r)
		if ends != nil {
			ends[i] = int64(len(b))
		}
	}
	defer func() {
		if cap(b) <= 1<<20 { // a tick's records may take more
			*bp = b[:0]
			s.bufs.Put(bp)
		}
	}()

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return 0, ErrClosed
	case s.err != nil:
		return 0, s.err
	case limit > 0 && s.end+s.inWrite+s.queued-s.applied > limit:
		return 0, ErrSpoolFull
	}
	w := s.next
	if w == nil {
		w = &pendingWrite{buf: s.batchBuf()}
		s.next = w
	}
	w.buf = append(w.buf, b...)
	end := int64(len(w.buf))
	s.queued += int64(len(b))
	if !s.writing && !s.gathering {
		// Nothing under way: before writing, let the goroutines that are
		// ready to run (other decisions recording now) queue their records
		// behind these, so that one write(2) carries them all. Without it,
		// under load nearly every append paid a system call of its own
		// (0.9 spool writes a decision in the RLS benchmark, 0.1 with
		// it), since a write rarely lasts long enough for others to queue
		// behind it.
		s.gathering = true
		s.mu.Unlock()
		runtime.Gosched()
		s.mu.Lock()
		s.gathering = false
	}
	for !w.done {
		if s.writing || s.gathering {
			s.written.Wait()
			continue
		}
		// The write under way ended and w, still queued, is s.next:
		// this appender writes it for all its records.
		s.next = nil
		s.queued -= int64(len(w.buf))
		s.write(w)
		s.putBatchBuf(w.buf)
		w.buf = nil
	}
	if w.err != nil {
		return 0, w.err
	}
	if ends != nil {
		start := w.base + end - int64(len(b))
		for i := range ends {
			ends[i] += start
		}
	}
	return w.base + end, nil
}

// pendingWrite is one write(2) of one or more records.
type pendingWrite struct {
	buf  []byte
	done bool
	err  error
	base int64 // spool position of buf[0], once written
}

// write writes w.buf at the spool's end, with s.mu held, released during
// the write(2) itself: appends arriving meanwhile queue in s.next. It sets
// w.done, w.err and w.base, and wakes the queued appenders.
func (s *spool) write(w *pendingWrite) {
	defer func() {
		w.done = true
		s.written.Broadcast()
	}()
	switch {
	case s.closed:
		w.err = ErrClosed
		return
	case s.err != nil:
		w.err = s.err
		return
	}
	last := &s.segs[len(s.segs)-1]
	if last.size > 0 && last.size+int64(len(w.buf)) > s.segSize {
		if err := s.rotate(); err != nil {
			w.err = err // sticky (s.err) only when the fsync failed
			return
		}
		last = &s.segs[len(s.segs)-1]
	}
	s.writing, s.inWrite = true, int64(len(w.buf))
	f := s.f
	s.mu.Unlock()
	_, err := f.Write(w.buf)
	s.mu.Lock()
	s.writing, s.inWrite = false, 0
	s.writes++
	last = &s.segs[len(s.segs)-1] // close waits for the write; nothing rotates meanwhile
	if err != nil {
		// A partial write would leave a torn record in the middle of the
		// log; cut it off, and stop appending if even that fails.
		if terr := f.Truncate(last.size); terr != nil {
			s.err = fmt.Errorf("ledger: spool write: %w (and truncate: %v)", err, terr)
		}
		w.err = fmt.Errorf("ledger: spool write: %w", err)
		return
	}
	w.base = s.end
	last.size += int64(len(w.buf))
	s.end += int64(len(w.buf))
}

// batchBuf is a buffer for a queue of records; putBatchBuf takes it back.
func (s *spool) batchBuf() []byte {
	if b, _ := s.batches.Get().(*[]byte); b != nil {
		return (*b)[:0]
	}
	return make([]byte, 0, 4<<10)
}

func (s *spool) putBatchBuf(b []byte) {
	if cap(b) <= 1<<20 {
		b = b[:0]
		s.batches.Put(&b)
	}
}

// rotate seals the last segment and starts a new one. s.mu is held. A
// failed fsync of the segment leaves the spool unusable (s.err: what it
// holds is unknown); a failure after it (out of file descriptors) leaves
// the spool as it was, appending to the last segment, and the next append
// tries again.
func (s *spool) rotate() error {
	if err := s.f.Sync(); err != nil {
		s.err = fmt.Errorf("ledger: spool sync: %w", err)
		return s.err
	}
	s.syncPos = s.end
	s.synced.Broadcast()
	path := filepath.Join(s.dir, segmentName(s.end))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("ledger: spool rotate: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		f.Close()
		os.Remove(path) // empty: the next rotation makes it again
		return fmt.Errorf("ledger: spool rotate: %w", err)
	}
	s.f.Close()
	s.f = f
	s.segs = append(s.segs, segment{base: s.end})
	return nil
}

// sync fsyncs what has been appended so far. Appenders that wait for it
// (waitSynced) share the fsync: it covers every record appended before it
// starts.
func (s *spool) sync() error {
	for {
		s.mu.Lock()
		target, f := s.end, s.f
		if s.syncPos >= target || s.closed {
			s.mu.Unlock()
			return nil
		}
		s.mu.Unlock()
		err := f.Sync()
		s.mu.Lock()
		if errors.Is(err, os.ErrClosed) && !s.closed {
			// Rotated meanwhile, which synced the old segment; the
			// records after it are in the new one.
			s.mu.Unlock()
			continue
		}
		defer s.mu.Unlock()
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil // closed meanwhile, which synced it
			}
			s.err = fmt.Errorf("ledger: spool sync: %w", err)
			s.synced.Broadcast()
			return s.err
		}
		s.fsyncs++
		if target > s.syncPos {
			s.syncPos = target
		}
		s.synced.Broadcast()
		return nil
	}
}

// waitSynced blocks until pos is fsynced.
func (s *spool) waitSynced(pos int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.syncPos < pos && s.err == nil && !s.closed {
		s.synced.Wait()
	}
	if s.syncPos >= pos {
		return nil
	}
	if s.err != nil {
		return s.err
	}
	return ErrClosed
}

// read decodes up to max records from position from onwards into recs and
// returns them with the position after the last one, a tally's no
// further than its kind (see readFrameKind). Only the flusher calls it
// (s.names is not locked).
func (s *spool) read(from int64, max int, recs []record, buf *[]byte) ([]record, int64, error) {
	return s.readFrames(from, maxPosition, max, recs, buf, &s.names, readFrameKind)
}

// readUntil is read of the records that end at or before to (maxPosition
// for every one), each decoded whole, with an interner of the caller's,
// nil for none; any goroutine may call it. It stops at the first record
// that ends past to, and returns the position it starts at. One call
// reads the file in chunks, so a range of many small records costs its
// bytes once.
func (s *spool) readUntil(from, to int64, max int, recs []record, buf *[]byte, names *interner) ([]record, int64, error) {
	return s.readFrames(from, to, max, recs, buf, names, readFrame)
}

// readFrames is readUntil that decodes each frame with decode.
func (s *spool) readFrames(from, to int64, max int, recs []record, buf *[]byte, names *interner,
	decode func([]byte, *record, *interner) (int, error)) ([]record, int64, error) {
	recs = recs[:0]
	for len(recs) < max && from < to {
		s.mu.Lock()
		end := s.end
		var seg segment
		found := false
		for _, g := range s.segs {
			if from >= g.base && from < g.base+g.size {
				seg, found = g, true
				break
			}
		}
		s.mu.Unlock()
		if !found || from >= end {
			return recs, from, nil
		}
		want := seg.base + seg.size - from
		if want > 4<<20 {
			want = 4 << 20
		}
		if int64(cap(*buf)) < want {
			*buf = make([]byte, want)
		}
		b := (*buf)[:want]
		f, err := os.Open(filepath.Join(s.dir, segmentName(seg.base)))
		if err != nil {
			return recs, from, fmt.Errorf("ledger: spool read: %w", err)
		}
		n, err := f.ReadAt(b, from-seg.base)
		f.Close()
		s.readBytes.Add(int64(n))
		if err != nil && !(errors.Is(err, io.EOF) && int64(n) == want) {
			return recs, from, fmt.Errorf("ledger: spool read: %w", err)
		}
		off := 0
		for off < len(b) && len(recs) < max {
			recs = append(recs, record{})
			k, err := decode(b[off:], &recs[len(recs)-1], names)
			if errors.Is(err, errTorn) && off > 0 {
				recs = recs[:len(recs)-1]
				break // the rest of the record is beyond this chunk
			}
			if err != nil {
				return recs[:len(recs)-1], from, fmt.Errorf("ledger: spool read at %d: %w", from, err)
			}
			if from+int64(k) > to {
				return recs[:len(recs)-1], from, nil
			}
			off += k
			from += int64(k)
		}
	}
	return recs, from, nil
}

// markApplied records that everything before pos is in the store and deletes
// the segments that holds wholly.
func (s *spool) markApplied(pos int64) error {
	s.mu.Lock()
	if pos > s.applied {
		s.applied = pos
	}
	// The file is a hint (replay is idempotent): writing it after every
	// batch cost a file creation and a rename per batch, about a tenth of
	// the flusher's CPU. Four times a second, and at close, is enough.
	now := time.Now()
	write := now.Sub(s.hinted) >= appliedHintInterval
	if write {
		s.hinted = now
	}
	s.mu.Unlock()
	s.dropApplied()
	if !write {
		return nil
	}
	return s.writeAppliedHint(pos)
}

// appliedHintInterval is how often markApplied writes the "applied" file.
const appliedHintInterval = 250 * time.Millisecond

func (s *spool) writeAppliedHint(pos int64) error {
	tmp := filepath.Join(s.dir, "applied.tmp")
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(pos, 10)+"\n"), 0o600); err != nil {
		return fmt.Errorf("ledger: spool: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "applied")); err != nil {
		return fmt.Errorf("ledger: spool: %w", err)
	}
	return nil
}

// keepFrom sets the position from which the spool keeps its segments
// whatever the store holds (see keep), maxPosition for none, and deletes
// the segments that frees.
func (s *spool) keepFrom(pos int64) {
	s.mu.Lock()
	s.keep = pos
	s.mu.Unlock()
	s.dropApplied()
}

// keepToEnd lowers the position from which the spool keeps its segments
// to its end, when that is lower, and returns the end: whatever is
// appended next is kept.
func (s *spool) keepToEnd() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keep = min(s.keep, s.end)
	return s.end
}

// dropApplied deletes the sealed segments wholly before both the applied
// position and keep.
func (s *spool) dropApplied() {
	s.mu.Lock()
	var drop []segment
	for len(s.segs) > 1 && s.segs[0].base+s.segs[0].size <= min(s.applied, s.keep) {
		drop = append(drop, s.segs[0])
		s.segs = s.segs[1:]
	}
	s.mu.Unlock()
	for _, g := range drop {
		os.Remove(filepath.Join(s.dir, segmentName(g.base)))
	}
}

// scan calls fn with each record of the spool, in order, and its
// position. Open calls it before anything appends; fn's record is reused.
func (s *spool) scan(fn func(pos int64, r *record)) error {
	s.mu.Lock()
	segs := slices.Clone(s.segs)
	s.mu.Unlock()
	var r record
	for _, g := range segs {
		b, err := os.ReadFile(filepath.Join(s.dir, segmentName(g.base)))
		if err != nil {
			return fmt.Errorf("ledger: spool read: %w", err)
		}
		b = b[:min(int64(len(b)), g.size)]
		for off := 0; off < len(b); {
			n, err := readFrame(b[off:], &r, nil)
			if err != nil {
				return fmt.Errorf("ledger: spool read at %d: %w", g.base+int64(off), err)
			}
			fn(g.base+int64(off), &r)
			off += n
		}
	}
	return nil
}

// first returns the position of the oldest record still in the spool.
func (s *spool) first() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.segs[0].base
}

// positions returns the end of the spool and the applied position.
func (s *spool) positions() (end, applied int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.end, s.applied
}

func (s *spool) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	for s.writing {
		s.written.Wait() // an append's write: its file stays open until it ends
	}
	s.closed = true
	err := s.writeAppliedHint(s.applied)
	serr := s.f.Sync()
	if serr == nil {
		s.syncPos = s.end // so that waitSynced's callers return nil
	} else if err == nil {
		err = serr
	}
	s.synced.Broadcast()
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("ledger: spool close: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// syncLoop fsyncs the spool every interval until stop is closed.
func (s *spool) syncLoop(interval time.Duration, kick <-chan struct{}, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-kick:
		}
		s.sync()
	}
}
