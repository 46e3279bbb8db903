package ledger_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/ledger"
)

// searchCounter is acme's search counter, as descCounts keys it: a
// KeyDesc line's text before its amount.
var searchCounter = strings.TrimSuffix(descLine("search", "acme", 0), "\t0")

// searchCount is what CountsBy grouping by Desc says acme's calls counted
// on its search counter, all told.
func searchCount(t *testing.T, l *ledger.Ledger) int64 {
	t.Helper()
	all, _ := descCounts(t, descRead(t, l))
	return all[searchCounter]
}

// tallyCalls tallies n calls of acme on its search counter, of users u0
// to u(users-1) in turn, pausing pace after each, in a goroutine, until
// stop is called, which waits for it. begun and done count the calls
// begun and those whose Tally returned.
func tallyCalls(t *testing.T, l *ledger.Ledger, n, users int, pace time.Duration) (begun, done *atomic.Int64, stop func()) {
	begun, done = new(atomic.Int64), new(atomic.Int64)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range n {
			select {
			case <-quit:
				return
			default:
			}
			begun.Add(1)
			if err := l.Tally(context.Background(), tallyCall("c", t0, "u"+strconv.Itoa(i%users), descLine("search", "acme", 1))); err != nil {
				t.Error(err)
				return
			}
			done.Add(1)
			if pace > 0 {
				time.Sleep(pace)
			}
		}
	}()
	return begun, done, sync.OnceFunc(func() { close(quit); wg.Wait() })
}

// TestTallyAtkReadBetweenTickAndCommit: a tick swaps the aggregates out
// and appends their entries; the store holds them only once the flusher
// has committed them, which a slow database (here, a batch's apply lock
// held by another session) delays. CountsBy grouping by Desc, the read a
// restore after the limiter's data loss counts descriptor limits by,
// found them in neither the aggregates nor the store meanwhile, and
// answered 0 for calls it had counted a moment before: a tenant whose
// limiter lost its data then got those calls again.
func TestTallyAtkReadBetweenTickAndCommit(t *testing.T) {
	cfg := postgresConfig(t)
	l := open(t, cfg)
	ctx := context.Background()
	const calls = 30
	for i := range calls {
		if err := l.Tally(ctx, tallyCall("c"+strconv.Itoa(i), t0, "ann", descLine("search", "acme", 1))); err != nil {
			t.Fatal(err)
		}
	}
	if n := searchCount(t, l); n != calls {
		t.Fatalf("before the tick: counted %d, want %d", n, calls)
	}
	release := holdApplyLock(t, cfg.DSN)
	// Flush ticks, then waits for the flusher, which waits for the lock.
	fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := l.Flush(fctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with the apply lock held: %v, want its deadline", err)
	}
	if n := searchCount(t, l); n != calls {
		t.Fatalf("between the tick and the store's commit: counted %d, want %d", n, calls)
	}
	// A call after the tick is pending again, beside the ticked ones.
	if err := l.Tally(ctx, tallyCall("late", t0, "ann", descLine("search", "acme", 1))); err != nil {
		t.Fatal(err)
	}
	if n := searchCount(t, l); n != calls+1 {
		t.Fatalf("a call after the tick: counted %d, want %d", n, calls+1)
	}
	release()
	flush(t, l)
	if n := searchCount(t, l); n != calls+1 {
		t.Fatalf("once the store holds the tick's entries: counted %d, want %d (never twice)", n, calls+1)
	}
}

// TestTallyAtkReadsDuringTicksNeverMiss: tallies of a new shape each
// (another user on every call), which ask for an early tick every 20,
// on both stores, with a flusher whose batches (16 records) end within
// a tick's append, while another goroutine reads: every read counts at
// least the calls whose Tally returned before it began, whatever moment
// of a tick (its swap, its append, the flusher's commit of part of it)
// the read fell in; after Flush, each call once. (A read that finds the
// flusher applying a tick's entries while it read, three times running,
// counts those entries twice: the test's flusher applies without pause,
// so only the lower bound holds here, and the exact count is
// TestTallyAtkReadBetweenTickAndCommit's.)
func TestTallyAtkReadsDuringTicksNeverMiss(t *testing.T) {
	defer ledger.SetMaxPendingShapes(20)()
	for _, s := range stores() {
		t.Run(s.name, func(t *testing.T) {
			cfg := s.config(t)
			cfg.BatchSize = 16
			l := open(t, cfg)
			_, done, stop := tallyCalls(t, l, 2000, 500, 0)
			defer stop()
			reads := 0
			for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline) && done.Load() < 2000; reads++ {
				lo := done.Load()
				if n := searchCount(t, l); n < lo {
					t.Errorf("read %d: counted %d; %d calls had been tallied before it", reads, n, lo)
					break
				}
			}
			stop()
			flush(t, l)
			if n, want := searchCount(t, l), done.Load(); n != want {
				t.Errorf("after Flush: counted %d, want %d", n, want)
			}
			t.Logf("%d reads, %d calls", reads, done.Load())
		})
	}
}

// TestTallyAtkTickedAggregatesBounded: a database that takes no batch
// (its apply lock held) while ticks go on keeps the ticks' aggregates in
// memory for CountsBy; past maxTickedBytes the oldest are dropped, so
// that a stalled store does not make them grow with the calls. Once the
// store takes the batches, each call counts once.
func TestTallyAtkTickedAggregatesBounded(t *testing.T) {
	const shapes = 8
	limit := int64(3 * shapes * 900) // about three ticks of 8 shapes
	defer ledger.SetMaxTickedBytes(limit)()
	cfg := postgresConfig(t)
	l := open(t, cfg)
	ctx := context.Background()
	release := holdApplyLock(t, cfg.DSN)
	calls := int64(0)
	for round := range 10 {
		for i := range shapes {
			if err := l.Tally(ctx, tallyCall("c", t0, "u"+strconv.Itoa(round*shapes+i), descLine("search", "acme", 1))); err != nil {
				t.Fatal(err)
			}
			calls++
		}
		fctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		l.Flush(fctx) // ticks; the flusher waits for the lock
		cancel()
		if b := ledger.TickedBytes(l); b > limit {
			t.Fatalf("round %d: the ticked aggregates take %d bytes, over the bound %d", round, b, limit)
		}
	}
	if b := ledger.TickedBytes(l); b == 0 {
		t.Fatal("no ticked aggregates kept while the store took no batch")
	}
	release()
	flush(t, l)
	if n := searchCount(t, l); n != calls {
		t.Fatalf("once the store took the batches: counted %d, want %d", n, calls)
	}
	if b := ledger.TickedBytes(l); b != 0 {
		t.Fatalf("%d bytes of ticked aggregates kept once the store holds them all", b)
	}
}

// TestTallyTickedLetGoOnceApplied: the aggregates a tick swapped out are
// kept only until the store holds their entries, whether or not anything
// reads CountsBy: kept until a read, they took up to maxTickedBytes
// (twice what the pending aggregates may take) in every process.
func TestTallyTickedLetGoOnceApplied(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		for i := range 50 {
			if err := l.Tally(ctx, tallyCall("c", t0, "u"+strconv.Itoa(i), descLine("search", "acme", 1))); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		if b := ledger.TickedBytes(l); b != 0 {
			t.Fatalf("%d bytes of ticked aggregates kept once Flush returned (the store holds their entries)", b)
		}
	})
}

// TestTallyAtkLocalReadsDuringTicksExact: the database down, CountsBy
// grouping by Desc answers from this node's records: the last read, the
// spool after it and the aggregates not yet ticked. Tallies that each
// ask for an early tick, while another goroutine reads: every read counts
// at least the calls whose Tally returned before it began and at most
// those that began before it returned. Before, a tick between the read
// of the aggregates and that of the spool had its calls counted twice
// (in both), and one amid its append in neither.
func TestTallyAtkLocalReadsDuringTicksExact(t *testing.T) {
	defer ledger.SetMaxPendingShapes(1)()
	p := pgtest.NewPrivate(t)
	l := open(t, ledger.Config{Dir: t.TempDir(), DSN: p.URL()})
	ctx := context.Background()
	q := ledger.SpendQuery{Tenant: "acme", From: t0.Add(-time.Hour), To: t0.Add(time.Hour)}
	count := func() (int64, error) {
		gs, err := l.CountsBy(ctx, q, ledger.GroupBy{Desc: true})
		all, _ := descCounts(t, gs)
		return all[searchCounter], err
	}
	if n, err := count(); err != nil || n != 0 {
		t.Fatalf("the read before any call: %d, %v", n, err)
	}
	p.Stop()
	// Paced, so that reads fall amid ticks, not behind thousands of them.
	begun, done, stop := tallyCalls(t, l, 3000, 7, 200*time.Microsecond)
	defer stop()
	reads := 0
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline) && done.Load() < 3000; reads++ {
		lo := done.Load()
		n, err := count()
		hi := begun.Load()
		var local *ledger.LocalSpendError
		if !errors.As(err, &local) {
			t.Fatalf("read %d with the database down: %v, want a *LocalSpendError", reads, err)
		}
		if n < lo || n > hi {
			t.Errorf("read %d: counted %d; %d calls had been tallied before it, %d begun by its end", reads, n, lo, hi)
			break
		}
	}
	stop()
	t.Logf("%d reads, %d calls", reads, done.Load())
	p.Start()
	flush(t, l)
	if n, err := count(); err != nil || n != done.Load() {
		t.Errorf("after the database came back and Flush: counted %d (%v), want %d", n, err, done.Load())
	}
}
