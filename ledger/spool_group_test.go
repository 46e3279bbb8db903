package ledger

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// TestSpoolConcurrentAppends: appends from many goroutines at once, across
// segment rotations, each return the position right after their own
// record, every record is in the spool once, whole, and reads back after
// a reopen; and they share writes.
func TestSpoolConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	s, err := openSpool(dir, 16<<10, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 16, 300
	pos := make(map[string]int64, writers*each)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			last := int64(-1)
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				r := sampleRecord(id)
				p, err := s.append(&r, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if p <= last {
					t.Errorf("%s: position %d after %d", id, p, last)
				}
				last = p
				mu.Lock()
				pos[id] = p
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	check := func(s *spool) {
		t.Helper()
		recs := readAll(t, s, 0)
		if len(recs) != writers*each {
			t.Fatalf("read %d records, want %d", len(recs), writers*each)
		}
		var at int64
		for _, r := range recs {
			at += int64(len(appendFrame(nil, &r)))
			want, ok := pos[r.e.RequestID]
			if !ok {
				t.Fatalf("record %s read twice or never appended", r.e.RequestID)
			}
			if want != at {
				t.Fatalf("%s: append returned %d, the record ends at %d", r.e.RequestID, want, at)
			}
			delete(pos, r.e.RequestID)
		}
	}
	snapshot := make(map[string]int64, len(pos))
	for k, v := range pos {
		snapshot[k] = v
	}
	check(s)
	s.mu.Lock()
	writes := s.writes
	s.mu.Unlock()
	t.Logf("%d appends in %d writes", writers*each, writes)
	if writes > writers*each {
		t.Errorf("%d writes for %d appends", writes, writers*each)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	s, err = openSpool(dir, 16<<10, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	pos = snapshot
	check(s)
}

// blockedSpool is a spool whose file is the write end of a pipe filled up
// to a few bytes short of full, so that the next write blocks until the
// pipe's read end is drained or closed.
func blockedSpool(t *testing.T) (s *spool, rd *os.File) {
	t.Helper()
	s, err := openSpool(t.TempDir(), 1<<20, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close(); wr.Close() })
	wr.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	for {
		if _, err := wr.Write(make([]byte, 512)); err != nil {
			break // full
		}
	}
	wr.SetWriteDeadline(time.Time{})
	s.f.Close()
	s.f = wr
	return s, rd
}

// queueBehindBlockedWrite starts one append whose write blocks on s's
// pipe, then n more, and waits until those n are all queued behind it.
// It returns the channels their results arrive on: the first's, then the
// others'.
func queueBehindBlockedWrite(t *testing.T, s *spool, n int) (first chan error, rest chan int64) {
	t.Helper()
	first, rest = make(chan error, 1), make(chan int64, n)
	r := sampleRecord("qf")
	go func() {
		_, err := s.append(&r, 0)
		first <- err
	}()
	waitFor(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.writing })
	frame := int64(len(appendFrame(nil, &r)))
	for i := range n {
		go func() {
			r := sampleRecord(fmt.Sprintf("q%d", i))
			p, err := s.append(&r, 0)
			if err != nil {
				p = -1
			}
			rest <- p
		}()
	}
	waitFor(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.queued == int64(n)*frame })
	return first, rest
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestSpoolAppendsQueueBehindAWrite: appends that arrive while a write is
// under way are written together, in one write, once it ends, each
// answered with its own record's end.
func TestSpoolAppendsQueueBehindAWrite(t *testing.T) {
	s, rd := blockedSpool(t)
	const n = 8
	first, rest := queueBehindBlockedWrite(t, s, n)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := rd.Read(buf); err != nil {
				return
			}
		}
	}()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	r := sampleRecord("q0")
	frame := int64(len(appendFrame(nil, &r)))
	seen := map[int64]bool{}
	for range n {
		p := <-rest
		if p < 0 || (p/frame)*frame != p || p < 2*frame || p > (n+1)*frame || seen[p] {
			t.Fatalf("a queued append returned %d (records of %d bytes, %d of them behind the first)", p, frame, n)
		}
		seen[p] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writes != 2 || s.end != (n+1)*frame || s.queued != 0 || s.next != nil {
		t.Fatalf("%d writes, end %d, queued %d: want 2 writes, end %d, nothing queued", s.writes, s.end, s.queued, (n+1)*frame)
	}
}

// TestSpoolFailedWriteFailsTheQueue: when the write under way fails and
// the spool cannot cut what it may have written, that append and every
// append queued behind it fail, none is given a position, and the spool
// refuses appends from then on.
func TestSpoolFailedWriteFailsTheQueue(t *testing.T) {
	s, rd := blockedSpool(t)
	const n = 8
	first, rest := queueBehindBlockedWrite(t, s, n)
	rd.Close() // the blocked write fails (EPIPE); a pipe cannot be truncated
	if err := <-first; err == nil {
		t.Fatal("the failed write's append succeeded")
	}
	for range n {
		if p := <-rest; p != -1 {
			t.Fatalf("an append queued behind a failed write returned position %d", p)
		}
	}
	r := sampleRecord("after")
	if _, err := s.append(&r, 0); err == nil {
		t.Fatal("an append after a write that could not be cut succeeded")
	}
	if end, _ := s.positions(); end != 0 {
		t.Fatalf("end %d after failed writes, want 0", end)
	}
}

// TestSpoolAppendsReadyTogetherShareAWrite: appenders that are ready to
// run at the same moment (decisions recording at once) share writes
// even when no write is under way when the first of them appends: it
// lets the others queue behind it before it writes. Without that, each
// write ended before the next appender ran, and nearly every append paid
// a write(2) of its own.
func TestSpoolAppendsReadyTogetherShareAWrite(t *testing.T) {
	s, err := openSpool(t.TempDir(), 64<<20, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	const rounds, appenders = 50, 32
	for round := range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for a := range appenders {
			wg.Go(func() {
				<-start
				r := sampleRecord(fmt.Sprintf("r%d-%d", round, a))
				if _, err := s.append(&r, 0); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
	}
	s.mu.Lock()
	writes := s.writes
	s.mu.Unlock()
	// Each round's appenders are all ready at once: a handful of writes
	// a round, not one an append.
	if bound := int64(rounds * appenders / 4); writes > bound {
		t.Fatalf("%d appends made %d writes, want at most %d", rounds*appenders, writes, bound)
	}
	t.Logf("%d appends made %d writes", rounds*appenders, writes)
}
