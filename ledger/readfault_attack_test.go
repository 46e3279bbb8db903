package ledger_test

// Attacks on the spool's file operations under a passing fault: the
// process out of file descriptors (as a proxy under a flood of
// connections is) for a while. The flusher's reads and the spool's
// rotation must fail while it lasts, and work again after.

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// ledAtkOutOfFiles lowers the process's limit on open files to its
// highest descriptor and takes every free one below it, so that the next
// open fails with EMFILE; the function it returns undoes it (once). Tests
// that call it must not be parallel: the limit is the whole process's.
func ledAtkOutOfFiles(t *testing.T) (restore func()) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal("the open descriptors are read from /proc/self/fd (Linux):", err)
	}
	top := 0
	for _, d := range fds {
		var fd int
		if _, err := fmt.Sscan(d.Name(), &fd); err == nil {
			top = max(top, fd)
		}
	}
	low := lim
	low.Cur = uint64(top + 1)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var taken []*os.File
	for len(taken) < 1000 {
		f, err := os.Open("/dev/null")
		if err != nil {
			break
		}
		taken = append(taken, f)
	}
	restored := false
	restore = func() {
		if !restored {
			restored = true
			for _, f := range taken {
				f.Close()
			}
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(restore)
	if f, err := os.Open("/dev/null"); err == nil {
		f.Close()
		restore()
		t.Fatal("a descriptor is left under the limit")
	}
	return restore
}

func TestLedAtkSpoolReadOutOfFiles(t *testing.T) {
	cfg := ledger.Config{Dir: t.TempDir(), RetryMax: 200 * time.Millisecond, Now: func() time.Time { return t0.Add(time.Hour) }}
	l := open(t, cfg)
	ctx := context.Background()
	if err := l.Reserve(ctx, reservation("before", t0)); err != nil {
		t.Fatal(err)
	}
	flush(t, l) // the store's connection is open

	restore := ledAtkOutOfFiles(t)
	const n = 50
	for i := range n {
		id := fmt.Sprintf("during-%d", i)
		if err := l.Reserve(ctx, reservation(id, t0)); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, settlement(id, 7_000)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().StoreErr == nil {
		if time.Now().After(deadline) {
			t.Fatal("the flusher read the spool with no descriptor to spare")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("while out of descriptors: %v", l.Stats().StoreErr)
	restore()

	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Flush(fctx); err != nil {
		t.Fatalf("Flush once descriptors are back: %v; %d bytes stay in the spool while the process runs", err, l.Stats().Pending)
	}
	sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", From: t0.Add(-time.Hour), To: t0.Add(time.Hour)})
	if want := int64(3_000 + n*7_000); err != nil || int64(sp) != want {
		t.Fatalf("Spend = %d, %v; want %d", sp, err, want)
	}
	if got := len(all(t, l, ledger.Query{Tenant: "acme"})); got != n+1 {
		t.Fatalf("%d entries in the store, want %d", got, n+1)
	}
}
