package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/ledger"
)

// peerPair opens two ledgers on one PostgreSQL database, as two replicas
// of one deployment, both migrated, each having heard the other.
func peerPair(t *testing.T, wait time.Duration) (a, b *ledger.Ledger, dsn string) {
	t.Helper()
	cfg := postgresConfig(t)
	cfg.PeerWait = wait
	a = open(t, cfg)
	cfg.Dir = t.TempDir()
	b = open(t, cfg)
	ctx := context.Background()
	for _, l := range []*ledger.Ledger{a, b} {
		if err := l.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Each has heard the other once a sync of each returns without
	// waiting its PeerWait out (a sync of a process that heard nobody
	// returns at once, so ask until one took an answer).
	deadline := time.Now().Add(10 * time.Second)
	for _, l := range []*ledger.Ledger{a, b} {
		for {
			if err := l.SyncPeers(ctx); err != nil {
				t.Fatal(err)
			}
			if ledger.PeersHeard(l) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the two ledgers did not hear each other in 10 s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return a, b, cfg.DSN
}

// holdApplyLock takes the advisory lock that every batch of every node
// takes, so that no ledger on dsn writes a batch until the returned
// function is called: a database slowed down (a long transaction, a
// vacuum, a failover), which delays a replica's writes past any fixed lag.
func holdApplyLock(t *testing.T, dsn string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(ledger.ApplyLock)); err != nil {
		t.Fatal(err)
	}
	// Once: a test may release from a timer and again when it ends.
	release = sync.OnceFunc(func() {
		tx.Rollback(ctx)
		conn.Close(ctx)
	})
	t.Cleanup(release)
	return release
}

// syncSeesHeldRecord has b record a reservation of 7 while the database
// holds every batch back for hold, then a sync: once SyncPeers returns, a
// must read b's 7. It returns how long the sync took.
func syncSeesHeldRecord(t *testing.T, a, b *ledger.Ledger, dsn string, hold time.Duration) time.Duration {
	t.Helper()
	ctx := context.Background()
	release := holdApplyLock(t, dsn)
	if err := b.Reserve(ctx, ledger.Entry{RequestID: "r-b", Tenant: "acme", EstimatedCost: 7}); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(hold, release)
	start := time.Now()
	if err := a.SyncPeers(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	spent, err := a.Spend(ctx, ledger.SpendQuery{Tenant: "acme", From: start.Add(-time.Hour), To: start.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if spent != 7 {
		t.Fatalf("after SyncPeers (%v) a reads a spend of %d; b recorded 7 before the call", took, spent)
	}
	return took
}

// TestSyncPeersWaitsForASlowReplica: replica b records a reservation of
// 7 while the database holds every batch back for 600 ms. a then asks its
// peers to flush (as a limiter that lost its counters does before it
// reads the ledger's spend): once SyncPeers returns, a reads b's 7. A
// fixed wait (two batch delays, 100 ms) read 0, and a restore from that
// read let the tenant spend b's 7 again.
func TestSyncPeersWaitsForASlowReplica(t *testing.T) {
	a, b, dsn := peerPair(t, 5*time.Second)
	// What a sync costs while the database keeps up: the median of 21.
	var took []time.Duration
	for range 21 {
		start := time.Now()
		if err := a.SyncPeers(context.Background()); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("SyncPeers with one peer keeping up: median %v, most %v", took[10], took[20])
	t.Logf("SyncPeers with the peer's writes held 600 ms: %v", syncSeesHeldRecord(t, a, b, dsn, 600*time.Millisecond))
}

// TestSyncPeersCountsANewcomer: a replica that has just started records
// a reservation at once, while the database holds its batches back; the
// replica that was there before asks its peers to flush right after.
// The sync must wait for the newcomer: before, it counted only the
// replicas its listener had heard from by then, and the newcomer's first
// beat was still on its way (or not sent: the newcomer recorded before
// its listener was up), so the sync returned at once and the read missed
// the newcomer's 7 (a limiter restoring from it let the tenant spend them
// again; gate.TestDataLossCountsPeersUnflushedSpend failed so on its
// first run in a process).
func TestSyncPeersCountsANewcomer(t *testing.T) {
	cfg := postgresConfig(t)
	cfg.PeerWait = 5 * time.Second
	a := open(t, cfg)
	ctx := context.Background()
	for i := range 5 {
		release := holdApplyLock(t, cfg.DSN)
		ncfg := cfg
		ncfg.Dir = t.TempDir()
		b := open(t, ncfg)
		tenant := fmt.Sprint("newcomer-", i)
		if err := b.Reserve(ctx, ledger.Entry{RequestID: "r-" + tenant, Tenant: tenant, EstimatedCost: 7}); err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(300*time.Millisecond, release)
		start := time.Now()
		if err := a.SyncPeers(ctx); err != nil {
			t.Fatal(err)
		}
		spent, err := a.Spend(ctx, ledger.SpendQuery{Tenant: tenant, From: start.Add(-time.Hour), To: start.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if spent != 7 {
			t.Fatalf("newcomer %d: after SyncPeers (%v) a reads a spend of %d; the newcomer recorded 7 before the call", i, time.Since(start), spent)
		}
		release()
	}
}

// TestSyncPeersBounded: a replica whose writes stay held back does not
// hold a sync past PeerWait, which fails naming it; a replica that
// closed is not waited for.
func TestSyncPeersBounded(t *testing.T) {
	// PeerWait is long enough that a sync which waited for it (the
	// failure after b closed) is told from one that did not, under the
	// race detector on a busy machine (a sync's own round trips took
	// over 250 ms there).
	const wait = time.Second
	a, b, dsn := peerPair(t, wait)
	ctx := context.Background()
	release := holdApplyLock(t, dsn)
	if err := b.Reserve(ctx, ledger.Entry{RequestID: "r-b", Tenant: "acme", EstimatedCost: 7}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := a.SyncPeers(ctx)
	var behind *ledger.PeersBehindError
	if !errors.As(err, &behind) || len(behind.Nodes) != 1 {
		t.Fatalf("a sync while b cannot write: %v, want a PeersBehindError naming b", err)
	}
	if d := time.Since(start); d < wait || d > 3*wait {
		t.Errorf("the sync failed after %v, PeerWait is %v", d, wait)
	}
	release()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := a.SyncPeers(ctx); err != nil {
		t.Fatalf("a sync after b closed: %v", err)
	}
	if d := time.Since(start); d >= wait*8/10 {
		t.Errorf("a sync after b closed took %v: it waited for b (PeerWait %v)", d, wait)
	}
}

// TestSyncPeersIgnoresNoise: anything else on the channel (not JSON, a
// payload of the wrong shape, an ack for another node, a sync from a
// session that is no ledger) neither breaks a listener nor answers a
// sync in b's name.
func TestSyncPeersIgnoresNoise(t *testing.T) {
	a, b, dsn := peerPair(t, 5*time.Second)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, p := range []string{"", "{", "null", `{"t":7}`, `{"t":"ack","s":99}`, `{"t":"ack","n":"x","s":99,"to":"nobody"}`,
		`{"t":"sync","n":"intruder","s":1}`, `{"t":"beat","n":""}`, strings.Repeat("x", 7000)} {
		if _, err := conn.Exec(ctx, "SELECT pg_notify('costgate_ledger', $1)", p); err != nil {
			t.Fatal(err)
		}
	}
	syncSeesHeldRecord(t, a, b, dsn, 300*time.Millisecond)
}

// TestSyncPeersListenersLast: the listeners keep their connections across
// many beats (each a wait for a notification cut by its deadline), log
// nothing, and still answer.
func TestSyncPeersListenersLast(t *testing.T) {
	t.Cleanup(ledger.SetPeerBeat(50 * time.Millisecond)) // after the ledgers close
	var logs strings.Builder
	var mu sync.Mutex
	cfg := postgresConfig(t)
	cfg.Logf = func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(&logs, f+"\n", a...)
	}
	a := open(t, cfg)
	cfg.Dir = t.TempDir()
	b := open(t, cfg)
	time.Sleep(600 * time.Millisecond) // a dozen beats each
	// On a loaded machine a beat can come later than the others wait for
	// it: each must hear the other again within seconds.
	for deadline := time.Now().Add(10 * time.Second); ledger.PeersHeard(a) != 1 || ledger.PeersHeard(b) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after a dozen beats and 10 s more a hears %d, b %d, want 1 each", ledger.PeersHeard(a), ledger.PeersHeard(b))
		}
	}
	syncSeesHeldRecord(t, a, b, cfg.DSN, 300*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "listening to the other replicas") {
		t.Errorf("a listener lost its connection:\n%s", logs.String())
	}
}

// TestSyncPeersCarriesNotes: the notes of a SyncPeers reach the other
// process's OnPeerSync before it answers, and notes too large for one
// request reach it as the one note "".
func TestSyncPeersCarriesNotes(t *testing.T) {
	var mu sync.Mutex
	var heard [][]string
	cfg := postgresConfig(t)
	cfg.PeerWait = 5 * time.Second
	a := open(t, cfg)
	cfg.Dir = t.TempDir()
	cfg.OnPeerSync = func(notes []string) {
		mu.Lock()
		heard = append(heard, slices.Clone(notes))
		mu.Unlock()
	}
	b := open(t, cfg)
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for ledger.PeersHeard(a) != 1 || ledger.PeersHeard(b) != 1 {
		for _, l := range []*ledger.Ledger{a, b} {
			if err := l.SyncPeers(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the two ledgers did not hear each other in 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	last := func() []string {
		mu.Lock()
		defer mu.Unlock()
		if len(heard) == 0 {
			return nil
		}
		return heard[len(heard)-1]
	}
	if err := a.SyncPeers(ctx, "acme", "{global"); err != nil {
		t.Fatal(err)
	}
	if got := last(); !slices.Equal(got, []string{"acme", "{global"}) {
		t.Fatalf("b heard %q, want acme and {global", got)
	}
	if err := a.SyncPeers(ctx, strings.Repeat("\x01", 2000)); err != nil {
		t.Fatal(err)
	}
	if got := last(); !slices.Equal(got, []string{""}) {
		t.Fatalf("b heard %q of a note too large, want the one note \"\"", got)
	}
}
