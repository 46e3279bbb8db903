package ledger

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"
)

// durableLedger opens an embedded ledger whose background fsync never runs
// during a test, so that only SettleDurable's fsyncs happen.
func durableLedger(t *testing.T) *Ledger {
	t.Helper()
	l, err := Open(context.Background(), Config{Dir: t.TempDir(), SyncInterval: time.Hour, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func syncedTo(l *Ledger) (synced, end int64) {
	l.spool.mu.Lock()
	defer l.spool.mu.Unlock()
	return l.spool.syncPos, l.spool.end
}

func TestSettleDurableWaitsForFsync(t *testing.T) {
	l := durableLedger(t)
	ctx := context.Background()
	at := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	if err := l.Reserve(ctx, Entry{RequestID: "a", Tenant: "acme", EstimatedCost: 5, CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	if err := l.Settle(ctx, Entry{RequestID: "a", ActualCost: 3}); err != nil {
		t.Fatal(err)
	}
	if synced, end := syncedTo(l); synced >= end {
		t.Fatalf("Settle: synced to %d of %d; the test cannot tell an fsync from none", synced, end)
	}
	if err := l.Reserve(ctx, Entry{RequestID: "b", Tenant: "acme", EstimatedCost: 5, CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	if err := l.SettleDurable(ctx, Entry{RequestID: "b", ActualCost: 3}); err != nil {
		t.Fatal(err)
	}
	if synced, end := syncedTo(l); synced < end {
		t.Fatalf("SettleDurable returned with the spool synced to %d of %d", synced, end)
	}
	if err := l.SettleDurable(ctx, Entry{RequestID: "c", Status: StatusReserved}); err == nil {
		t.Fatal("SettleDurable with status reserved: no error")
	}
}

// TestSettleDurableGroupCommit: 32 concurrent callers share fsyncs.
func TestSettleDurableGroupCommit(t *testing.T) {
	l := durableLedger(t)
	ctx := context.Background()
	const callers, each = 32, 20
	before := Fsyncs(l)
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				id := strconv.Itoa(c) + "-" + strconv.Itoa(i)
				if err := l.SettleDurable(ctx, Entry{RequestID: id, Tenant: "acme", ActualCost: 1}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := Fsyncs(l) - before
	t.Logf("%d calls, %d fsyncs", callers*each, n)
	if n == 0 || n > callers*each/2 {
		t.Fatalf("%d fsyncs for %d concurrent calls, want at least one and at most half as many", n, callers*each)
	}
}
