package ledger_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// TestLedAtkRotationOutOfFiles runs the process out of file descriptors
// as the spool's segment is full: the rotation cannot open the next one.
// The appends that need it fail while that lasts; once descriptors are
// back, a settlement of a request reserved before, and new reservations,
// must be taken.
func TestLedAtkRotationOutOfFiles(t *testing.T) {
	cfg := ledger.Config{Dir: t.TempDir(), SegmentSize: 64 << 10, RetryMax: 200 * time.Millisecond,
		Now: func() time.Time { return t0.Add(time.Hour) }}
	l := open(t, cfg)
	ctx := context.Background()
	if err := l.Reserve(ctx, reservation("open", t0)); err != nil {
		t.Fatal(err)
	}
	restore, failed := ledAtkRotationRefused(t, l, cfg.Dir)
	restore()
	if failed == nil {
		t.Fatal("the spool rotated with no descriptor to spare")
	}
	t.Logf("while out of descriptors: %v", failed)

	after := settlement("open", 9_000)
	if err := l.Settle(ctx, after); err != nil {
		t.Fatalf("Settle once descriptors are back: %v: the request is recovered at its estimate, $0.000003 for $0.000009", err)
	}
	if err := l.Reserve(ctx, reservation("later", t0)); err != nil {
		t.Fatalf("Reserve once descriptors are back: %v", err)
	}
	flush(t, l)
	if e := ledAtkByID(t, l)["open"]; e.Status != ledger.StatusSettled || e.ActualCost != 9_000 {
		t.Fatalf("the request reserved before: %s at %d, want settled at 9000", e.Status, e.ActualCost)
	}
}

// ledAtkRotationRefused fills l's last spool segment (in dir) to within
// 2 KiB of its 64 KiB, runs the process out of descriptors
// (ledAtkOutOfFiles) and reserves until the spool, which must rotate,
// refuses: it returns the function that gives the descriptors back and
// that refusal (nil if the spool rotated anyway).
func ledAtkRotationRefused(t *testing.T, l *ledger.Ledger, dir string) (restore func(), refused error) {
	t.Helper()
	ctx := context.Background()
	ledAtkFillSegment(t, l, dir, 62<<10)
	flush(t, l)
	restore = ledAtkOutOfFiles(t)
	for i := 0; i < 100 && refused == nil; i++ {
		refused = l.Reserve(ctx, reservation(fmt.Sprintf("refused-%d", i), t0))
	}
	return restore, refused
}

// ledAtkFillSegment reserves and settles requests until l's last spool
// segment (in dir) holds more than size bytes.
func ledAtkFillSegment(t *testing.T, l *ledger.Ledger, dir string, size int64) {
	t.Helper()
	ctx := context.Background()
	for i := 0; ; i++ {
		fi, err := os.Stat(ledAtkLastSegment(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > size {
			return
		}
		id := fmt.Sprintf("fill-%d", i)
		if err := l.Reserve(ctx, reservation(id, t0)); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, settlement(id, 1_000)); err != nil {
			t.Fatal(err)
		}
	}
}
