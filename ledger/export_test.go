package ledger

import (
	"context"
	"sync"
	"time"
)

// SetPGLockTimeout sets how long a batch waits for the PostgreSQL apply
// lock, for a test, and returns the function that restores it.
func SetPGLockTimeout(d time.Duration) (restore func()) {
	was := pgLockTimeout
	pgLockTimeout = d
	return func() { pgLockTimeout = was }
}

// TallyBucket is the span of time a tally's aggregate sums.
const TallyBucket = tallyBucket

// SetMaxPendingShapes sets the memory past which a tally asks for an
// early tick to what n aggregates of a counter of a few bytes take, until
// the returned function restores it.
func SetMaxPendingShapes(n int) (restore func()) {
	return SetMaxPendingBytes(int64(n) * aggBytes)
}

// SetMaxPendingBytes sets the memory (as tallies count it) past which a
// tally asks for an early tick, until the returned function restores it.
func SetMaxPendingBytes(n int64) (restore func()) {
	was := maxPendingBytes
	maxPendingBytes = n
	return func() { maxPendingBytes = was }
}

// ApplyLock is the advisory lock key that serializes batches.
const ApplyLock = applyLock

// Fsyncs returns how many fsyncs the spool's syncer has done.
func Fsyncs(l *Ledger) int64 {
	l.spool.mu.Lock()
	defer l.spool.mu.Unlock()
	return l.spool.fsyncs
}

// PeersHeard is the number of other processes l heard from lately.
func PeersHeard(l *Ledger) int {
	if l.peers == nil {
		return 0
	}
	l.peers.mu.Lock()
	defer l.peers.mu.Unlock()
	return len(l.peers.heard)
}

// SetPeerBeat sets how often the ledgers beat (and so how soon one that
// stopped beating is gone), until the returned function restores it.
func SetPeerBeat(d time.Duration) (restore func()) {
	beat, alive := peerBeat, peerAlive
	peerBeat, peerAlive = d, 3*d
	return func() { peerBeat, peerAlive = beat, alive }
}

// Crash stops l as the death of its process would: no tick writes its
// tallies, nothing waits for the store. The spool keeps what its appends
// wrote, as the operating system does after a process dies.
func Crash(l *Ledger) error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return l.shutdown()
}

// HoldTicks keeps l's ticks from running, so that its tallies stay
// pending, until release is called (once or more). Flush and Close tick:
// release first.
func HoldTicks(l *Ledger) (release func()) {
	l.tally.tickMu.Lock()
	var once sync.Once
	return func() { once.Do(l.tally.tickMu.Unlock) }
}

// Tick writes l's tallies pending as entries to the spool now, as its
// ticker does, whether the store answers or not.
func Tick(l *Ledger) error { return l.tick() }

// SpoolReadBytes is how many bytes l's spool reads have taken from its
// files.
func SpoolReadBytes(l *Ledger) int64 { return l.spool.readBytes.Load() }

// SpoolEnd is the position after l's spool's last record.
func SpoolEnd(l *Ledger) int64 {
	end, _ := l.spool.positions()
	return end
}

// SpoolWrites is how many write(2) calls l's spool's appends have made.
func SpoolWrites(l *Ledger) int64 {
	l.spool.mu.Lock()
	defer l.spool.mu.Unlock()
	return l.spool.writes
}

// FoldTallies runs fold passes of l's tick entries at l's clock (see
// fold.go) until every level has read up to its age, however many
// foldSpan takes: the entries their folds delete and insert.
func FoldTallies(l *Ledger) (dropped, put int, err error) {
	for {
		d, p, err := l.foldTallies(context.Background())
		dropped, put = dropped+d, put+p
		if err != nil {
			return dropped, put, err
		}
		now, caughtUp := l.cfg.Now(), true
		l.folds.mu.Lock()
		for i, lv := range foldLevels {
			caughtUp = caughtUp && !l.folds.done[i].Before(now.Add(-lv.age).Truncate(lv.size))
		}
		l.folds.mu.Unlock()
		if caughtUp {
			return dropped, put, nil
		}
	}
}

// FoldPass runs one fold pass of l's tick entries at l's clock.
func FoldPass(l *Ledger) (dropped, put int, err error) {
	return l.foldTallies(context.Background())
}

// SetMaxTickedBytes sets the memory (as tallies count it) that the
// aggregates of ticks not yet applied may take, until the returned
// function restores it.
func SetMaxTickedBytes(n int64) (restore func()) {
	was := maxTickedBytes
	maxTickedBytes = n
	return func() { maxTickedBytes = was }
}

// TickedBytes is the memory (as tallies count it) that l's aggregates of
// ticks not yet applied take.
func TickedBytes(l *Ledger) int64 {
	l.tally.mu.Lock()
	defer l.tally.mu.Unlock()
	return l.tally.tickedBytes
}
