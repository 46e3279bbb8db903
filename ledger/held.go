package ledger

import (
	"errors"
	"fmt"
	"time"
)

// maxHeld bounds the settlements a ledger holds in memory while its spool
// refuses them; past it a refused settlement is dropped (logged), and its
// request is finalized at its estimate as a crash would leave it.
const maxHeld = 100_000

// hold keeps r, a settlement the spool refused with err, to append again
// once it takes it (see resettle), and returns err saying so. A
// settlement is the usage a request was billed for, and the front door
// that made it has answered and moved on: dropped, the request would be
// finalized at its estimate at the next start, whatever it used. The
// spool refuses an append for causes that pass (a disk full, the process
// out of descriptors when a segment rotates); one it will never take
// (invalid, closed, read-only) is not held.
func (l *Ledger) hold(r *record, err error) error {
	if errors.Is(err, ErrInvalid) || errors.Is(err, ErrReadOnly) || errors.Is(err, ErrClosed) {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return err
	}
	if len(l.held) >= maxHeld {
		l.cfg.Logf("ledger: a settlement is dropped: %d are held already while the spool refuses them (%v); request %s will be finalized at its estimate",
			len(l.held), err, r.e.RequestID)
		return err
	}
	l.held = append(l.held, r)
	if !l.resettling {
		l.resettling = true
		l.wg.Add(1)
		go l.resettle()
	}
	return fmt.Errorf("%w (the settlement is held and appended when the spool takes it)", err)
}

// resettle appends the held settlements again, with the flusher's
// backoff, until none is left or the ledger closes; Close tries once
// more before it flushes (see appendHeld).
func (l *Ledger) resettle() {
	defer l.wg.Done()
	wait := l.cfg.RetryMin
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		if l.appendHeld() {
			return
		}
		wait = min(2*wait, l.cfg.RetryMax)
		t.Reset(wait)
	}
}

// appendHeld appends the held settlements in order, stopping at the first
// the spool refuses, and tells whether none is left (the resettle
// goroutine then ends).
func (l *Ledger) appendHeld() (done bool) {
	l.mu.Lock()
	held := l.held
	l.held = nil
	l.mu.Unlock()
	n := 0
	var err error
	for _, r := range held {
		if err = l.append(r, 0, false); err != nil {
			break
		}
		n++
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = append(held[n:], l.held...)
	if n > 0 {
		l.cfg.Logf("ledger: %d held settlements appended to the spool, %d still held", n, len(l.held))
	}
	if len(l.held) == 0 {
		l.resettling = false
		return true
	}
	return false
}
