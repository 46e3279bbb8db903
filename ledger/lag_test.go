package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/internal/servicetest"
	"github.com/costgate/costgate/ledger"
)

// TestLagGrowsWhileTheStoreIsDown: with the database unreachable, entries
// wait in the spool and Stats says how much and for how long.
func TestLagGrowsWhileTheStoreIsDown(t *testing.T) {
	port := servicetest.FreePort(t) // nothing listens there
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Config{
		DSN:          fmt.Sprintf("postgres://postgres@127.0.0.1:%d/x?sslmode=disable&connect_timeout=1", port),
		Dir:          t.TempDir(),
		CloseTimeout: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Reserve(ctx, ledger.Entry{RequestID: "r1", Tenant: "acme", EstimatedCost: 1}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Lag < 50*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("lag did not grow: %+v", l.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := l.Stats(); st.Pending == 0 || st.StoreErr == nil {
		t.Errorf("stats while the store is down: %+v", st)
	}
}

// TestBatchDelay: while records keep coming, the flusher starts a batch at
// most once per BatchDelay, so that a request's reservation and settlement
// usually land in one batch; Flush and Close do not wait for it. The
// delay is long (20 s) so that a loaded machine's slowness (under 10 s)
// cannot pass for it, nor hide it.
func TestBatchDelay(t *testing.T) {
	ctx := context.Background()
	const delay = 20 * time.Second
	l, err := ledger.Open(ctx, ledger.Config{Dir: t.TempDir(), BatchDelay: delay})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Reserve(ctx, ledger.Entry{RequestID: "r1", Tenant: "acme", EstimatedCost: 1}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// A batch started just now: the next record waits for the delay.
	if err := l.Settle(ctx, ledger.Entry{RequestID: "r1", Tenant: "acme", ActualCost: 2}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if st := l.Stats(); st.Pending == 0 && time.Since(start) < delay {
		t.Fatalf("the settlement reached the store %v after the last batch, before the %v batch delay", time.Since(start), delay)
	}
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > delay/2 {
		t.Fatalf("Flush waited for the batch delay: %v", d)
	}
	spend, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
	if err != nil {
		t.Fatal(err)
	}
	if spend != 2 {
		t.Fatalf("spend %d after the settlement, want 2", spend)
	}
	// Close applies what is pending without waiting for the delay either.
	if err := l.Reserve(ctx, ledger.Entry{RequestID: "r2", Tenant: "acme", EstimatedCost: 1}); err != nil {
		t.Fatal(err)
	}
	closeStart := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(closeStart); d > delay/2 {
		t.Fatalf("Close waited for the batch delay: %v", d)
	}
}

// TestApplyLockWaitIsBounded: a batch that waits for the apply lock, held
// by a transaction that went silent, fails after the lock timeout and Stats
// says so, instead of waiting unseen; once the lock is free, the batch goes
// in.
func TestApplyLockWaitIsBounded(t *testing.T) {
	defer ledger.SetPGLockTimeout(200 * time.Millisecond)()
	cfg := postgresConfig(t)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, cfg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	l, err := ledger.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Flush(ctx); err != nil { // migrated, marker applied
		t.Fatal(err)
	}
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(ledger.ApplyLock)); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(ctx, ledger.Entry{RequestID: "r1", Tenant: "acme", EstimatedCost: 1}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().StoreErr == nil {
		if time.Now().After(deadline) {
			t.Fatal("the batch waited for the lock 10 s and Stats reported nothing")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Flush(fctx); err != nil {
		t.Fatalf("after the lock was released: %v", err)
	}
}
