package ledger

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Config holds the ledger's knobs. The zero value of every field but Dir
// means its documented default; Validate reports what cannot work.
type Config struct {
	// DSN selects PostgreSQL when it starts with postgres:// or
	// postgresql://. Empty selects the embedded store, a SQLite file
	// Dir/ledger.db.
	DSN string

	// Dir is the data directory: the node id, the write-ahead spool
	// (Dir/spool) and, for the embedded store, the database file. Required.
	// One process at a time may use a Dir; Open locks it.
	Dir string

	// ReadOnly opens the store for queries and export only: no lock on Dir,
	// no spool, no recovery, no migration; Reserve and Settle fail with
	// ErrReadOnly. It is for tools (costgate ledger export) that run beside
	// a serving process, and it sees what that process has flushed.
	ReadOnly bool

	// Admin opens the store for queries and for the operator's actions on
	// other nodes' entries (Nodes, RecoverNode): no lock on Dir, no spool,
	// no recovery of its own, but the store is migrated and written like a
	// writer's, each action in a transaction of its own. Reserve and Settle
	// fail with ErrReadOnly. It is for tools (costgate ledger recover) that
	// run beside serving processes. Dir, when set, names this process's own
	// node (Dir/node), which RecoverNode refuses; with the embedded store
	// it is where the database is.
	Admin bool

	// TimeZone sets the day and month boundaries of Spend. Nil means UTC.
	TimeZone *time.Location

	// SyncInterval is how often the spool is fsynced in the background
	// (group commit). Reserve and Settle return once their record is in the
	// operating system (write(2)): it survives a crash of the process at
	// once, and a crash of the machine after at most SyncInterval. Zero means
	// 10ms.
	SyncInterval time.Duration

	// SyncEach makes Reserve and Settle wait until an fsync covers their
	// record, so that a record survives a crash of the machine before the
	// call returns. Concurrent callers share one fsync (group commit); each
	// call then costs the latency of an fsync, though little CPU.
	SyncEach bool

	// SpoolLimit bounds the bytes of the spool that are not yet in the
	// store. Past it Reserve fails with ErrSpoolFull (new admissions stop),
	// while Settle is still accepted so that admitted requests are always
	// finalized. Zero means 1 GiB, about three million entries.
	SpoolLimit int64

	// SegmentSize is the size at which the spool starts a new file; files
	// wholly in the store are deleted. Zero means 64 MiB.
	SegmentSize int64

	// BatchSize is the most records the flusher writes to the store in one
	// transaction. Zero means 4096.
	BatchSize int

	// BatchDelay is the least time between the starts of two batches the
	// flusher writes while records keep coming (it never waits when a batch
	// would be full, nor for Flush or Close). Most requests take less, so
	// their reservation and settlement reach the store in the same batch
	// and their row is written once, already settled; batches are larger,
	// and commits fewer. It adds at most BatchDelay to the store's lag.
	// Zero means 50ms; negative means no delay.
	BatchDelay time.Duration

	// PeerWait is the longest SyncPeers waits for the other processes on
	// the PostgreSQL store to flush. Zero means 2s.
	PeerWait time.Duration

	// RetryMin and RetryMax bound the backoff of the flusher while the store
	// fails. Zero means 50ms and 1s.
	RetryMin, RetryMax time.Duration

	// CloseTimeout is how long Close waits for the spool to reach the store.
	// What does not make it stays in the spool for the next Open. Zero
	// means 10s.
	CloseTimeout time.Duration

	// EventSource is the CloudEvents "source" of exported usage events.
	// Empty means "costgate".
	EventSource string

	// Now is the clock. Nil means time.Now.
	Now func() time.Time

	// OnPeerSync, when set, receives the notes of another process's
	// SyncPeers (never empty; the one note "" stands for notes that did
	// not fit in the request), before this process flushes for it: a
	// record appended after it returns may be missing from what that
	// process reads. It is called from the listener's goroutine, one
	// request at a time, and must return quickly.
	OnPeerSync func(notes []string)

	// Logf receives the flusher's reports (store errors, recoveries). Nil
	// discards them.
	Logf func(format string, args ...any)
}

func (c Config) withDefaults() Config {
	if c.TimeZone == nil {
		c.TimeZone = time.UTC
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = 10 * time.Millisecond
	}
	if c.SpoolLimit == 0 {
		c.SpoolLimit = 1 << 30
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = 64 << 20
	}
	if c.BatchSize == 0 {
		c.BatchSize = 4096
	}
	if c.BatchDelay == 0 {
		c.BatchDelay = 50 * time.Millisecond
	}
	if c.PeerWait == 0 {
		c.PeerWait = 2 * time.Second
	}
	if c.RetryMin == 0 {
		c.RetryMin = 50 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = time.Second
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 10 * time.Second
	}
	if c.EventSource == "" {
		c.EventSource = "costgate"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}

func (c Config) postgres() bool {
	return strings.HasPrefix(c.DSN, "postgres://") || strings.HasPrefix(c.DSN, "postgresql://")
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Dir == "" && !((c.ReadOnly || c.Admin) && c.postgres()) {
		errs = append(errs, errors.New("dir is required (the spool and the embedded store live there)"))
	}
	if c.ReadOnly && c.Admin {
		errs = append(errs, errors.New("read-only and admin exclude each other"))
	}
	if c.DSN != "" && !c.postgres() {
		errs = append(errs, fmt.Errorf("dsn must start with postgres:// or postgresql://, or be empty for the embedded store"))
	}
	if c.SyncInterval < 0 || c.RetryMin < 0 || c.RetryMax < 0 || c.CloseTimeout < 0 || c.PeerWait < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if c.BatchDelay > time.Minute {
		errs = append(errs, errors.New("batch delay must be at most a minute"))
	}
	if c.RetryMin > 0 && c.RetryMax > 0 && c.RetryMax < c.RetryMin {
		errs = append(errs, errors.New("retry max is below retry min"))
	}
	if c.SpoolLimit < 0 || (c.SpoolLimit > 0 && c.SpoolLimit < 1<<20) {
		errs = append(errs, errors.New("spool limit must be at least 1 MiB"))
	}
	if c.SegmentSize < 0 || (c.SegmentSize > 0 && c.SegmentSize < 64<<10) {
		errs = append(errs, errors.New("segment size must be at least 64 KiB"))
	}
	if c.BatchSize < 0 || c.BatchSize > 65536 {
		errs = append(errs, errors.New("batch size must be between 1 and 65536"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ledger: config: %w", err)
	}
	return nil
}
