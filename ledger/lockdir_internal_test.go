package ledger

import (
	"strings"
	"testing"
	"time"
)

// TestLockDirWaitsForALockHeldAMoment: a data dir's lock held elsewhere
// for a moment (by a child forked while the ledger that held it closed,
// until the child execs) is waited for, so that a ledger closed and
// opened again in one process opens; one held throughout is refused,
// after the wait, as in use by another process. Each lock here is a
// description of its own, as a forked child's copy is to the reopened
// ledger's.
func TestLockDirWaitsForALockHeldAMoment(t *testing.T) {
	dir := t.TempDir()
	other, err := lockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { other.Close() })
	f, err := lockDir(dir)
	if err != nil {
		t.Fatalf("a lock released 300 ms later: %v", err)
	}

	defer func(w time.Duration) { lockWait = w }(lockWait)
	lockWait = 200 * time.Millisecond
	start := time.Now()
	_, err = lockDir(dir)
	if err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("a lock held throughout: %v, want in use by another process", err)
	}
	if waited := time.Since(start); waited < lockWait {
		t.Fatalf("refused after %v, before the wait of %v", waited, lockWait)
	}
	f.Close()
}
