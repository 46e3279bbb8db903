package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// Ledger records entries durably and moves them to its store. It is safe for
// concurrent use. Create it with Open and release it with Close.
type Ledger struct {
	cfg    Config
	node   string
	marker string // the id of this run's recovery marker
	lock   *os.File
	spool  *spool
	store  store
	peers  *peers  // the other processes on the store (PostgreSQL only); nil otherwise
	tally  tallies // the tallies not yet ticked (see tally.go)
	folds  folds   // the folding of tick entries (see fold.go)

	wake     chan struct{} // nudges the flusher; buffered 1
	hurry    chan struct{} // cuts the flusher's batch delay short (Flush); buffered 1
	flushTo  atomic.Int64  // the spool position that Flush waits for: no batch delay before it
	syncKick chan struct{} // nudges the syncer; buffered 1
	tickKick chan struct{} // asks for an early tick (maxPendingBytes); buffered 1
	stop     chan struct{} // closed by Close to stop the goroutines
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	spendReads readCache[spendRead]    // Spend's last reads, for its answers while the store fails
	keyReads   readCache[keySpendRead] // KeySpend's and UserSpend's, likewise
	groupReads readCache[groupsRead]   // CountsBy's, likewise
	lastAnswer atomic.Int64            // Unix microseconds, by cfg.Now, when the store last answered (see answered); 0: not since Open

	mu       sync.Mutex
	applied  int64         // spool position in the store
	caughtUp time.Time     // the latest time at which everything spooled was in the store
	advanced chan struct{} // closed and replaced when applied advances
	lastErr  error         // the store's last error, nil once it succeeds
	failures uint64        // the store's errors since Open (see FlushUnlessFailing)
	fatal    error         // the flusher stopped for good
	closed   bool
	// held are the settlements the spool refused, in order, for resettle
	// to append again (see hold); resettling tells that it runs.
	held       []*record
	resettling bool
}

// store is what the ledger needs of a database. Implementations are used by
// one flusher at a time for apply, and concurrently for reads.
type store interface {
	begin(ctx context.Context) (storeTx, error)
	entries(ctx context.Context, q Query, after *cursor, limit int) ([]Entry, error)
	// tickEntries returns the settled entries of node's ticks (request ids
	// starting tickEntryPrefix) created in [from, to), after the cursor
	// when not nil, in the order of entries: at most limit.
	tickEntries(ctx context.Context, node string, from, to time.Time, after *cursor, limit int) ([]Entry, error)
	spend(ctx context.Context, tenant, user, key string, from, to time.Time) (costmodel.NanoUSD, error)
	summary(ctx context.Context, from, to time.Time) ([]TenantSpend, error)
	// scopeSpend returns the spend of each scope of tenant that starts
	// with prefix (keyScope, userScope) over [from, to), by the scope's
	// rest (a key id, a user).
	scopeSpend(ctx context.Context, tenant, prefix string, from, to time.Time) (map[string]costmodel.NanoUSD, error)
	// headSpend returns the charge of tenant's entries created in
	// [from, to), by user and key, read from the entries (a range shorter
	// than a roll-up bucket).
	headSpend(ctx context.Context, tenant string, from, to time.Time) ([]headCharge, error)
	// countsBy calls each with what the entries k selects (its tenant,
	// every tenant's when empty, and its user, key and region when not
	// empty) created in [from, to), read from the entries, counted on a
	// limiter (see Entry.Counts) and were charged, grouped by k.by's
	// columns (by the whole KeyDesc text with k.by.Desc): at most limit
	// groups, those of the most requests first, or with limit 0 every
	// group in no order, each as it reads it (see readGroups). each must
	// not keep g.
	countsBy(ctx context.Context, k spendQueryKey, from, to time.Time, limit int, each func(g *Group)) error
	nodes(ctx context.Context) ([]NodeState, error)
	// entry returns the entry of request id, if the store has it.
	entry(ctx context.Context, id string) (Entry, bool, error)
	close() error
}

// Open opens the ledger in cfg.Dir, applying the store's migrations and
// replaying what the spool holds that is not yet in the store. Reservations
// a previous run left open are finalized at their estimate as the replay
// reaches its end (StatusRecovered). Open does not wait for the replay. A
// PostgreSQL that cannot be reached at Open is not an error: the flusher
// migrates and replays once it can, and Stats reports the error meanwhile.
// On error, Open releases what it acquired.
func Open(ctx context.Context, cfg Config) (_ *Ledger, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	l := &Ledger{
		cfg:      cfg,
		wake:     make(chan struct{}, 1),
		hurry:    make(chan struct{}, 1),
		syncKick: make(chan struct{}, 1),
		tickKick: make(chan struct{}, 1),
		stop:     make(chan struct{}),
		advanced: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			l.shutdown()
		}
	}()
	if cfg.ReadOnly {
		if cfg.postgres() {
			pg, err := openPostgresReader(ctx, cfg.DSN)
			if err != nil {
				return nil, err
			}
			l.store = pg
		} else {
			lite, err := openSQLiteReader(ctx, filepath.Join(cfg.Dir, "ledger.db"))
			if err != nil {
				return nil, err
			}
			l.store = lite
		}
		return l, nil
	}
	if cfg.Admin {
		if cfg.Dir != "" {
			if l.node, err = readNodeID(cfg.Dir); err != nil {
				return nil, err
			}
		}
		if l.store, err = openStore(ctx, cfg, true, 0); err != nil {
			return nil, err
		}
		return l, nil
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger: data dir: %w", err)
	}
	if l.lock, err = lockDir(cfg.Dir); err != nil {
		return nil, err
	}
	if l.node, err = nodeID(cfg.Dir); err != nil {
		return nil, err
	}
	if l.spool, err = openSpool(filepath.Join(cfg.Dir, "spool"), cfg.SegmentSize, cfg.Logf); err != nil {
		return nil, err
	}
	_, applied := l.spool.positions()
	if l.store, err = openStore(ctx, cfg, false, applied); err != nil {
		return nil, err
	}
	// Everything of the previous run is before this marker.
	var marker [8]byte
	if _, err := rand.Read(marker[:]); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	l.marker = hex.EncodeToString(marker[:])
	// The previous run's tallies that no tick wrote become entries before
	// this run appends anything.
	if err := l.recoverTallies(); err != nil {
		return nil, err
	}
	if _, err := l.spool.append(&record{kind: kindRecover, e: Entry{
		RequestID: l.marker, CreatedAt: micro(cfg.Now()),
	}}, 0); err != nil {
		return nil, err
	}
	_, l.applied = l.spool.positions()
	l.caughtUp = time.Now()

	runCtx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.wg.Add(3)
	go func() { defer l.wg.Done(); l.spool.syncLoop(cfg.SyncInterval, l.syncKick, l.stop) }()
	go func() { defer l.wg.Done(); l.flushLoop(runCtx) }()
	go l.tickLoop()
	l.folds.load(filepath.Join(cfg.Dir, "folded"), cfg.Logf)
	l.wg.Add(1)
	go l.foldLoop(runCtx)
	if pg, ok := l.store.(*pgStore); ok {
		l.peers = newPeers(pg.pool, l.node, l.Flush, cfg.OnPeerSync, cfg.PeerWait, cfg.Logf)
		l.wg.Add(1)
		go func() { defer l.wg.Done(); l.peers.listen(runCtx) }()
		// Nothing is recorded before the others can know of this process
		// (see peers.go): a restore elsewhere waits for its records.
		l.peers.waitReady(ctx)
	}
	return l, nil
}

// errForgotten refuses a store without the ledger's schema to a node
// whose spool was applied to one: the store was lost or replaced, and a
// new, empty one would forget the entries the spool no longer holds.
var errForgotten = errors.New("ledger: store forgotten")

// openStore opens the store cfg names for writing: PostgreSQL, or the
// embedded file under cfg.Dir, made when missing unless existing is set.
// applied is the spool's applied position: a store without the ledger's
// schema is refused as new (errForgotten) when it is past 0.
func openStore(ctx context.Context, cfg Config, existing bool, applied int64) (store, error) {
	// A failed open returns a nil store, not a nil pointer in one, which
	// shutdown would close.
	if cfg.postgres() {
		pg, err := openPostgres(ctx, cfg.DSN, applied, cfg.Logf)
		if err != nil {
			return nil, err
		}
		return pg, nil
	}
	path := filepath.Join(cfg.Dir, "ledger.db")
	if existing {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("ledger: no embedded ledger: %w", err)
		}
	}
	lite, err := openSQLite(ctx, path, applied)
	if err != nil {
		return nil, err
	}
	return lite, nil
}

// Reserve records the admission of e before the request is forwarded: e's
// estimate counts towards spend from now on. It is one append to the spool;
// the store gets it in the background. e.Status is ignored (the entry is
// reserved) and a zero e.CreatedAt means now. Reserving a request id again
// changes nothing. It fails with ErrInvalid when e.EstimatedCost is above
// MaxCost, and with ErrSpoolFull when the store has been
// unreachable so long that the spool is at its limit. On any error the
// request must not be forwarded. ctx is not used to abandon a record once
// appended: an error means the request was not recorded, except when the
// fsync that SyncEach waits for fails, which leaves the spool unusable and
// the record in an unknown state (recovered at its estimate if it
// survived).
func (l *Ledger) Reserve(ctx context.Context, e Entry) error {
	if err := e.check(); err != nil {
		return err
	}
	if e.EstimatedCost > MaxCost {
		return fmt.Errorf("%w entry %q: estimated cost %d nano-USD is above the largest cost of an entry, %d (MaxCost)",
			ErrInvalid, e.RequestID, e.EstimatedCost, MaxCost)
	}
	e.Status = StatusReserved
	if e.CreatedAt.IsZero() {
		e.CreatedAt = l.cfg.Now()
	}
	e.CreatedAt, e.SettledAt = micro(e.CreatedAt), time.Time{}
	return l.append(&record{kind: kindReserve, e: e}, l.cfg.SpoolLimit, l.cfg.SyncEach)
}

// Extend raises the estimate of the open reservation e.RequestID to
// e.Estimated and e.EstimatedCost (what its limits were debited in all:
// the reservation and the increments beyond it), so that a recovery
// finalizes it at that, and the spend counts it meanwhile. It is one
// append to the spool, taken even when the spool is full, as a settlement
// is; it changes nothing on an entry settled, failed or expired, nor an
// estimate not above the recorded one. An entry recovered while its
// process still ran (RecoverNode) is charged at its estimate, which
// Extend raises.
func (l *Ledger) Extend(ctx context.Context, e Entry) error {
	if err := e.check(); err != nil {
		return err
	}
	e.Status = StatusReserved
	e.EstimatedCost = min(e.EstimatedCost, MaxCost)
	e.CreatedAt, e.SettledAt = micro(e.CreatedAt), time.Time{}
	return l.append(&record{kind: kindExtend, e: e}, 0, false) // a stream does not wait for the disk at each increment
}

// Settle finalizes e.RequestID with what the upstream reported: e.Actual,
// e.ActualCost and e.HTTPStatus, and e.Status, which is StatusSettled (the
// default), StatusFailed or StatusExpired. Non-empty descriptive fields (model, route,
// upstream, region, decision, policy, friction) replace the reservation's;
// tenant, user and key stay the reservation's. A zero e.SettledAt means now.
// An e.ActualCost above MaxCost is recorded and charged as MaxCost (so is
// an e.EstimatedCost above it).
// Settle is idempotent by request id: only the first settlement of a request
// counts. Settling a request that was never reserved records it whole.
// Settle returns once the record is in the operating system (it survives
// the death of the process); SettleDurable waits for an fsync as well. A
// settlement the spool refuses for a cause that may pass (a disk full, no
// descriptor to open its next segment) is held in memory and appended
// when the spool takes it, at Close at the latest; Settle still returns
// the error (the death of the process before then loses it, and the
// request is finalized at its estimate).
func (l *Ledger) Settle(ctx context.Context, e Entry) error {
	r, err := l.settlement(e)
	if err != nil {
		return err
	}
	if err := l.append(r, 0, l.cfg.SyncEach); err != nil {
		return l.hold(r, err)
	}
	return nil
}

// SettleDurable is Settle that returns only once an fsync covers the
// settlement, whatever Config.SyncEach says: from then on the entry is
// settled with e's usage even if the process or the machine dies, and
// recovery never finalizes it at its estimate. Concurrent callers share one
// fsync (group commit), so a call costs about the latency of one fsync and
// little CPU. It is for the moment the upstream's usage is known and the
// client has not yet received the end of the response: call it then, with
// the entry Settle would get, before forwarding the last bytes. A later
// Settle of the same request id changes nothing (the first settlement
// wins), so the usual Settle after the response may still run. ctx is not
// used to abandon the wait: the fsync is bounded by the disk. An error
// other than ErrInvalid or ErrReadOnly means the settlement may not be
// durable; a failed fsync leaves the spool unusable, and every later
// Reserve and Settle fails.
func (l *Ledger) SettleDurable(ctx context.Context, e Entry) error {
	r, err := l.settlement(e)
	if err != nil {
		return err
	}
	if err := l.append(r, 0, true); err != nil {
		return l.hold(r, err)
	}
	return nil
}

// settlement checks e and completes it as Settle documents.
func (l *Ledger) settlement(e Entry) (*record, error) {
	if err := e.check(); err != nil {
		return nil, err
	}
	switch e.Status {
	case "":
		e.Status = StatusSettled
	case StatusSettled, StatusFailed, StatusExpired:
	default:
		return nil, fmt.Errorf("%w settlement %q: status %q", ErrInvalid, e.RequestID, e.Status)
	}
	if e.SettledAt.IsZero() {
		e.SettledAt = l.cfg.Now()
	}
	if e.CreatedAt.IsZero() {
		e.CreatedAt = e.SettledAt
	}
	e.CreatedAt, e.SettledAt = micro(e.CreatedAt), micro(e.SettledAt)
	e.EstimatedCost, e.ActualCost = boundCost(e.EstimatedCost), boundCost(e.ActualCost)
	return &record{kind: kindSettle, e: e}, nil
}

// append writes r to the spool and, with sync, waits for an fsync that
// covers it: it kicks the syncer, which fsyncs everything appended so far,
// so that the callers that append while one fsync runs share the next.
func (l *Ledger) append(r *record, limit int64, sync bool) error {
	if l.spool == nil {
		return ErrReadOnly
	}
	pos, err := l.spool.append(r, limit)
	if err != nil {
		return err
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
	if sync {
		select {
		case l.syncKick <- struct{}{}:
		default:
		}
		return l.spool.waitSynced(pos)
	}
	return nil
}

// PeerLag is how long after a record is appended another process sharing
// the store (a replica on the same PostgreSQL, with this configuration)
// has it in the store, while the store keeps up: a batch delay and a
// batch's write, taken as two batch delays, and as 50 ms when batches are
// not delayed (BatchDelay negative: the write alone). Zero for the
// embedded store, which no other process shares. It is what SyncPeers
// waits when it cannot ask the others, which it does not bound: a write
// slowed by a busy database takes longer.
func (l *Ledger) PeerLag() time.Duration {
	if !l.cfg.postgres() {
		return 0
	}
	return 2 * max(l.cfg.BatchDelay, 25*time.Millisecond)
}

// Flush returns once everything appended before the call is in the store,
// the tallies as their aggregate entries (it ticks first), or with ctx's
// error, or with the error that stopped the flusher, or with a tick's
// error (the tallies then wait for the next tick).
func (l *Ledger) Flush(ctx context.Context) error {
	return l.flush(ctx, false)
}

// FlushUnlessFailing is Flush that returns the store's error as soon as
// the store fails while it waits: for a caller that reads this node's
// records without the store then (a restore after a limiter's loss),
// where Flush would wait until the store is back. The tick it starts
// with (see Flush) makes the flusher try the store even when only
// tallies were appended since.
func (l *Ledger) FlushUnlessFailing(ctx context.Context) error {
	return l.flush(ctx, true)
}

func (l *Ledger) flush(ctx context.Context, unlessFailing bool) error {
	if l.spool == nil {
		return nil
	}
	l.mu.Lock()
	failures := l.failures
	l.mu.Unlock()
	if err := l.tick(); err != nil {
		return err
	}
	target, _ := l.spool.positions()
	for {
		to := l.flushTo.Load()
		if to >= target || l.flushTo.CompareAndSwap(to, target) {
			break
		}
	}
	select {
	case l.hurry <- struct{}{}:
	default:
	}
	for {
		l.mu.Lock()
		applied, ch, fatal, lastErr, failed := l.applied, l.advanced, l.fatal, l.lastErr, l.failures != failures
		l.mu.Unlock()
		if applied >= target {
			return nil
		}
		if fatal != nil {
			return fatal
		}
		if unlessFailing && failed && lastErr != nil {
			return fmt.Errorf("ledger: flush: %w", lastErr)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("ledger: flush: %w (store: %v)", ctx.Err(), lastErr)
			}
			return fmt.Errorf("ledger: flush: %w", ctx.Err())
		}
	}
}

// ErrReadOnly is returned by Reserve, Settle and SettleDurable on a ledger opened with
// Config.ReadOnly or Config.Admin, and by RecoverNode on one opened with
// Config.ReadOnly.
var ErrReadOnly = errors.New("ledger: opened read-only")

// Stats describes the ledger's progress.
type Stats struct {
	// Pending is the bytes of spool not yet in the store.
	Pending int64
	// Lag is how far the store is behind the spool: the time since the
	// store last held everything spooled up to then (within one batch);
	// zero when nothing is pending.
	Lag time.Duration
	// StoreErr is the store's last error, nil while it works.
	StoreErr error
}

// Stats returns the ledger's progress, for health checks and metrics.
func (l *Ledger) Stats() Stats {
	if l.spool == nil {
		return Stats{}
	}
	end, applied := l.spool.positions()
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.lastErr
	if l.fatal != nil {
		err = l.fatal
	}
	st := Stats{Pending: end - applied, StoreErr: err}
	if st.Pending > 0 && !l.caughtUp.IsZero() {
		st.Lag = time.Since(l.caughtUp)
	}
	return st
}

// Close waits up to Config.CloseTimeout for the spool to reach the store,
// then stops the ledger. What did not reach the store stays in the spool and
// is replayed by the next Open; Close then reports how much.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.appendHeld() // what the spool takes now, the next open replays
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.CloseTimeout)
	flushErr := l.Flush(ctx)
	cancel()
	err := l.shutdown()
	if flushErr != nil {
		st := l.Stats()
		return errors.Join(fmt.Errorf("ledger: close: %d bytes stay in the spool for the next open: %w", st.Pending, flushErr), err)
	}
	return err
}

// shutdown stops the goroutines and releases what Open acquired; it works
// after a partial Open.
func (l *Ledger) shutdown() error {
	close(l.stop)
	if l.cancel != nil {
		l.cancel()
	}
	l.wg.Wait()
	var errs []error
	if l.spool != nil {
		errs = append(errs, l.spool.close())
	}
	if l.store != nil {
		errs = append(errs, l.store.close())
	}
	if l.lock != nil {
		errs = append(errs, l.lock.Close()) // releases the flock
	}
	return errors.Join(errs...)
}

// flushLoop moves the spool into the store, in order, in batches.
func (l *Ledger) flushLoop(ctx context.Context) {
	var (
		recs    = make([]record, 0, l.cfg.BatchSize)
		buf     []byte
		err     error
		next    int64
		pos     = l.applied
		delay   = l.cfg.RetryMin
		open    openSet
		lastLog time.Time
		started time.Time // when the last batch was read
		full    bool      // the last batch was BatchSize records
	)
	// retry records err as the store's last error, logs it when it is new
	// (and every 10 s while it lasts) with what says, and waits the
	// backoff; false when the ledger closes meanwhile.
	retry := func(err error, say func() string) bool {
		if l.setErr(err) || time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			l.cfg.Logf("%s", say())
		}
		select {
		case <-time.After(delay):
		case <-l.stop:
			return false
		}
		delay = min(2*delay, l.cfg.RetryMax)
		return true
	}
	for {
		// Let the batch grow, so that most requests' reservation and
		// settlement reach the store together (see BatchDelay).
		if wait := l.cfg.BatchDelay - time.Since(started); wait > 0 && !full {
			l.delay(pos, wait)
		}
		readAt := time.Now()
		started = readAt
		end, _ := l.spool.positions()
		recs, next, err = l.spool.read(pos, l.cfg.BatchSize, recs, &buf)
		if errors.Is(err, errCorrupt) || errors.Is(err, errTorn) {
			l.setFatal(err)
			return
		}
		if err != nil {
			// An open or a read that failed (out of file descriptors,
			// an I/O error) may not fail again: retried as a store's
			// error is, where a damaged record stops the flusher.
			if !retry(err, func() string { return fmt.Sprintf("%v (retrying)", err) }) {
				return
			}
			started = time.Time{}
			continue
		}
		full = len(recs) == l.cfg.BatchSize
		if len(recs) == 0 {
			select {
			case <-l.wake:
				continue
			case <-l.stop:
				return
			}
		}
		for !onlyTallies(recs) {
			var n int64
			n, err = l.applyBatch(ctx, recs, &open)
			if err == nil {
				if failing := l.Stats().StoreErr != nil; failing {
					l.cfg.Logf("ledger: store is back; replaying the spool")
				}
				if n > 0 {
					l.cfg.Logf("ledger: recovered %d reservations of a previous run at their estimate", n)
				}
				delay = l.cfg.RetryMin
				break
			}
			if !retry(err, func() string {
				return fmt.Sprintf("ledger: store: %v (retrying; %d bytes wait in the spool)", err, l.Stats().Pending)
			}) {
				return
			}
		}
		pos = next
		if err := l.spool.markApplied(pos); err != nil {
			l.cfg.Logf("%v", err)
		}
		l.dropAppliedTicks()
		if !onlyTallies(recs) {
			l.answered(l.cfg.Now()) // a batch of tallies asks nothing of the store
		}
		l.mu.Lock()
		l.applied, l.lastErr = pos, nil
		if pos >= end {
			l.caughtUp = readAt // all that was spooled before readAt is in the store
		}
		close(l.advanced)
		l.advanced = make(chan struct{})
		l.mu.Unlock()
	}
}

// delay waits up to wait while records after pos are pending, unless Flush
// waits for them or Close is called.
func (l *Ledger) delay(pos int64, wait time.Duration) {
	if end, _ := l.spool.positions(); pos >= end {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for l.flushTo.Load() <= pos {
		select {
		case <-t.C:
			return
		case <-l.hurry:
		case <-l.stop:
			return
		}
	}
}

// onlyTallies reports whether recs are all tallies and ticks, which write
// nothing to the store: a batch of them takes no transaction.
func onlyTallies(recs []record) bool {
	for i := range recs {
		if recs[i].kind != kindTally && recs[i].kind != kindTick {
			return false
		}
	}
	return true
}

func (l *Ledger) applyBatch(ctx context.Context, recs []record, st *openSet) (int64, error) {
	tx, err := l.store.begin(ctx)
	if err != nil {
		return 0, err
	}
	r, err := applyRecords(ctx, tx, l.node, l.marker, recs, st)
	if err != nil {
		tx.rollback(ctx)
		return 0, err
	}
	if err := tx.commit(ctx); err != nil {
		return 0, err
	}
	st.apply(r)
	return r.recovered, nil
}

// setErr records the store's error and reports whether it is the first of
// a run of failures.
func (l *Ledger) setErr(err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.lastErr == nil
	l.lastErr = err
	l.failures++
	close(l.advanced) // wakes FlushUnlessFailing
	l.advanced = make(chan struct{})
	return first
}

func (l *Ledger) setFatal(err error) {
	l.cfg.Logf("ledger: flusher stopped: %v", err)
	l.mu.Lock()
	l.fatal = err
	close(l.advanced)
	l.advanced = make(chan struct{})
	l.mu.Unlock()
}

// lockDir takes an exclusive lock on dir, so that two processes never share
// a spool. The kernel releases it when the process dies.
//
// A lock held elsewhere is tried again for up to lockWait before lockDir
// gives up: a ledger closed and opened again in one process (a restart
// in place) finds its own lock still held for a moment when another
// goroutine forked a child meanwhile, which holds a copy of every file
// descriptor, the lock's among them, until it execs (seen under load: a
// gate closed and opened again on its data dir while a parallel test
// started a redis-server).
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ledger: lock: %w", err)
	}
	for deadline := time.Now().Add(lockWait); ; time.Sleep(10 * time.Millisecond) {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("ledger: data dir %s is in use by another process: %w", dir, err)
		}
	}
}

// lockWait is how long lockDir waits for a data dir's lock held elsewhere.
var lockWait = 2 * time.Second

// readNodeID returns the id of dir, empty when dir has none yet.
func readNodeID(dir string) (string, error) {
	path := filepath.Join(dir, "node")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("ledger: node id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// nodeID returns the id of this data dir, creating it on first use. Entries
// carry it so that recovery finalizes only this node's reservations when
// several nodes share one PostgreSQL.
func nodeID(dir string) (string, error) {
	path := filepath.Join(dir, "node")
	if b, err := os.ReadFile(path); err == nil {
		id := strings.TrimSpace(string(b))
		if id == "" {
			return "", fmt.Errorf("ledger: %s is empty", path)
		}
		return id, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("ledger: node id: %w", err)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("ledger: node id: %w", err)
	}
	id := hex.EncodeToString(b[:])
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("ledger: node id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("ledger: node id: %w", err)
	}
	return id, syncDir(dir)
}
