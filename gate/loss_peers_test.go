package gate

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestDataLossCountsPeersUnflushedSpend: two replicas share one Redis
// and one PostgreSQL ledger. b admits 5 requests of a budget of 10; their
// ledger entries are still in b's spool (its flusher writes them to
// PostgreSQL within a batch delay) when Redis loses its data. a's next
// request finds its counters lost and restores them from the ledger:
// read at once, the ledger lacks b's 5, and a admits 10 more (15 of 10).
// The restore waits for the peers' batches first.
func TestDataLossCountsPeersUnflushedSpend(t *testing.T) {
	dsn := pgtest.New(t)
	srv := redistest.New(t)
	a, b := acmeGate(t, dsn, srv, ""), acmeGate(t, dsn, srv, "")
	if n := spendAcme(t, a, 1); n != 1 { // a's counters, restored once on the fresh Redis
		t.Fatalf("a admitted %d of its first request", n)
	}
	if n := spendAcme(t, b, 5); n != 5 {
		t.Fatalf("b admitted %d of 5", n)
	}
	if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	n := spendAcme(t, a, 20)
	t.Logf("after the loss a admitted %d; 6 were spent before it, of 10", n)
	if 6+n > 10 {
		t.Fatalf("%d admitted in all, of a budget of 10 requests: b's spend not yet in the ledger was spent again", 6+n)
	}
}

// TestDataLossCountsASlowPeersSpend: as above, but the database holds
// every replica's batches back (a long transaction holds the lock they
// take, as a slow or failing-over database would) from before b's 5
// requests until 700 ms after Redis lost its data: far past a fixed wait
// of two batch delays. a's restore must still count b's 5.
func TestDataLossCountsASlowPeersSpend(t *testing.T) {
	dsn := pgtest.New(t)
	srv := redistest.New(t)
	a, b := acmeGate(t, dsn, srv, ""), acmeGate(t, dsn, srv, "")
	if n := spendAcme(t, a, 1); n != 1 {
		t.Fatalf("a admitted %d of its first request", n)
	}
	ctx := context.Background()
	if err := a.ledger.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release := sync.OnceFunc(func() { tx.Rollback(ctx) })
	defer release()
	const ledgerApplyLock = 0x636f737467617465 + 1 // the lock every ledger batch takes (ledger.applyLock)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(ledgerApplyLock)); err != nil {
		t.Fatal(err)
	}
	if n := spendAcme(t, b, 5); n != 5 {
		t.Fatalf("b admitted %d of 5", n)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(700*time.Millisecond, release)
	n := spendAcme(t, a, 20)
	t.Logf("after the loss a admitted %d; 6 were spent before it, of 10", n)
	if 6+n > 10 {
		t.Fatalf("%d admitted in all, of a budget of 10 requests: b's spend held up on its way to the ledger was spent again", 6+n)
	}
}
