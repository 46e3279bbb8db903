package learned

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/costmodel/sketch"
)

// Config configures a Table. The zero value is a Table in memory alone,
// not persisted, with the defaults below.
type Config struct {
	// Redis shares the sketches between replicas and keeps them; nil keeps
	// them in this process (and in File).
	Redis Redis
	// File is where a Table without Redis is kept across restarts; empty
	// keeps nothing.
	File string
	// MinSamples is how many observations a key needs before Estimate
	// trusts its quantile; 0 means 100.
	MinSamples int
	// MaxKeys bounds the keys a Table holds, and MaxKeysPerTenant those of
	// one tenant, so that one tenant cannot crowd the others out; past
	// them a key is not learned and its requests keep the configured rule.
	// 0 means 20000 and 256.
	MaxKeys, MaxKeysPerTenant int
	// Interval is how often observations go to Redis and the keys in use
	// are read back, or the file is written; 0 means 10 s.
	Interval time.Duration
	// TTL is how long a key lives in Redis after its last observation; 0
	// means 30 days.
	TTL time.Duration
	// Logf receives the problems a Table meets with its stored data; nil
	// drops them.
	Logf func(format string, args ...any)
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.MinSamples < 0 || c.MaxKeys < 0 || c.MaxKeysPerTenant < 0 || c.Interval < 0 || c.TTL < 0 {
		return errors.New("learned: min_samples, max_keys, max_keys_per_tenant, interval and ttl must not be negative")
	}
	return nil
}

func (c *Config) defaults() {
	if c.MinSamples == 0 {
		c.MinSamples = 100
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 20000
	}
	if c.MaxKeysPerTenant == 0 {
		c.MaxKeysPerTenant = 256
	}
	if c.Interval == 0 {
		c.Interval = 10 * time.Second
	}
	if c.TTL == 0 {
		c.TTL = 30 * 24 * time.Hour
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// Estimate is a key's learned output estimate.
type Estimate struct {
	// Tokens is the quantile asked for, in output tokens, within
	// sketch.RelativeError of the exact quantile of the observations.
	Tokens int64
	// Samples is how many settled requests the estimate is learned from,
	// on every replica.
	Samples uint64
	// OK tells that Samples reaches MinSamples: Tokens may be reserved.
	OK bool
}

// Table holds the learned output estimates. Open builds one; Close stops
// it after a last write. A Table is safe for concurrent use.
type Table struct {
	cfg Config

	mu        sync.RWMutex
	m         map[Key]*entry
	perTenant map[string]int

	gen     atomic.Uint64 // counts syncs with Redis (see entry.seen)
	dirty   atomic.Bool   // changed since the file was written
	dropped atomic.Uint64 // keys not learned: a bound was reached
	bad     atomic.Uint64 // stored buckets, keys or files left out

	stop chan struct{}
	wg   sync.WaitGroup
}

// entry is one key's sketch.
type entry struct {
	// seen is the sync generation in which the key was last looked up or
	// observed: a sync reads back the keys seen in its interval or the
	// one before.
	seen atomic.Uint64

	mu      sync.Mutex
	view    sketch.Sketch // what Estimate reads: Redis's merged counts and pending
	pending sketch.Sketch // with Redis: observed here, not yet added to Redis
	version uint64        // changes with view
	cacheQ  float64       // the last quantile computed, of version cacheV
	cacheV  uint64
	cacheT  int64
}

// Open builds a Table: it reads the stored sketches (the file, or the keys
// in Redis; what cannot be read is logged and left out), then starts the
// loop that shares them every Interval.
func Open(ctx context.Context, cfg Config) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	t := &Table{cfg: cfg, m: map[Key]*entry{}, perTenant: map[string]int{}, stop: make(chan struct{})}
	if cfg.Redis != nil {
		if err := t.loadRedis(ctx); err != nil {
			cfg.Logf("learned: reading the learned estimates from Redis: %v; keys are read as they are used", err)
		}
	} else if cfg.File != "" {
		if err := t.loadFile(); err != nil {
			cfg.Logf("%v; the learned estimates start empty", err)
		}
	}
	t.wg.Go(t.loop)
	return t, nil
}

func (t *Table) loop() {
	tick := time.NewTicker(t.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), t.cfg.Interval)
			if err := t.Sync(ctx); err != nil {
				t.cfg.Logf("learned: %v", err)
			}
			cancel()
		}
	}
}

// Close stops the loop and writes what is not stored yet.
func (t *Table) Close() error {
	select {
	case <-t.stop:
		return nil
	default:
	}
	close(t.stop)
	t.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return t.Sync(ctx)
}

// Sync shares the Table now: with Redis, it adds the observations made
// here since the last Sync and reads back the merged sketches of the keys
// used since; without, it writes the file if the Table changed.
func (t *Table) Sync(ctx context.Context) error {
	if t.cfg.Redis != nil {
		return t.syncRedis(ctx)
	}
	if t.cfg.File != "" && t.dirty.Swap(false) {
		if err := t.saveFile(); err != nil {
			t.dirty.Store(true)
			return err
		}
	}
	return nil
}

// Observe learns that a request of key k produced tokens output tokens. A
// negative count is no observation; a count above sketch.MaxValue counts
// as sketch.MaxValue.
func (t *Table) Observe(k Key, tokens int64) {
	if tokens < 0 {
		return
	}
	e := t.entry(k)
	if e == nil {
		return
	}
	e.mu.Lock()
	e.view.Add(tokens)
	if t.cfg.Redis != nil {
		e.pending.Add(tokens)
	}
	e.version++
	e.mu.Unlock()
	t.see(e)
	t.dirty.Store(true)
}

// Estimate returns key k's q-quantile (0 < q ≤ 1) of output tokens and
// how many observations it rests on.
func (t *Table) Estimate(k Key, q float64) Estimate {
	t.mu.RLock()
	e := t.m[k]
	t.mu.RUnlock()
	if e == nil {
		if t.cfg.Redis != nil {
			// Another replica may have learned it: read it at the next Sync.
			if e = t.entry(k); e != nil {
				t.see(e)
			}
		}
		return Estimate{}
	}
	t.see(e)
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.view.Count()
	if n < uint64(t.cfg.MinSamples) {
		return Estimate{Samples: n}
	}
	if e.cacheV != e.version || e.cacheQ != q || e.version == 0 {
		e.cacheT, e.cacheQ, e.cacheV = e.view.Quantile(q), q, e.version
	}
	return Estimate{Tokens: e.cacheT, Samples: n, OK: true}
}

// see marks e as used in the current sync generation.
func (t *Table) see(e *entry) {
	if g := t.gen.Load(); e.seen.Load() != g {
		e.seen.Store(g)
	}
}

// entry returns k's entry, made if a bound allows it; nil if not.
func (t *Table) entry(k Key) *entry {
	t.mu.RLock()
	e := t.m[k]
	t.mu.RUnlock()
	if e != nil {
		return e
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e = t.m[k]; e != nil {
		return e
	}
	if len(t.m) >= t.cfg.MaxKeys || t.perTenant[k.Tenant] >= t.cfg.MaxKeysPerTenant {
		t.dropped.Add(1)
		return nil
	}
	e = &entry{version: 1}
	e.seen.Store(t.gen.Load())
	t.m[k] = e
	t.perTenant[k.Tenant]++
	return e
}

// Stats are a Table's counts.
type Stats struct {
	// Keys is how many keys the Table holds.
	Keys int
	// Dropped counts observations and lookups of keys not learned because
	// MaxKeys or MaxKeysPerTenant was reached.
	Dropped uint64
	// Bad counts stored buckets, keys and files left out because they did
	// not parse.
	Bad uint64
}

// Stats returns the Table's counts.
func (t *Table) Stats() Stats {
	t.mu.RLock()
	n := len(t.m)
	t.mu.RUnlock()
	return Stats{Keys: n, Dropped: t.dropped.Load(), Bad: t.bad.Load()}
}

// each calls f with every key and its entry, outside the Table's lock.
func (t *Table) each(f func(Key, *entry)) {
	t.mu.RLock()
	keys := make([]Key, 0, len(t.m))
	entries := make([]*entry, 0, len(t.m))
	for k, e := range t.m {
		keys = append(keys, k)
		entries = append(entries, e)
	}
	t.mu.RUnlock()
	for i := range keys {
		f(keys[i], entries[i])
	}
}

// set replaces k's sketch with s (what the store holds) and the
// observations not stored yet.
func (t *Table) set(k Key, s *sketch.Sketch) {
	e := t.entry(k)
	if e == nil {
		return
	}
	e.mu.Lock()
	s.Merge(&e.pending)
	e.view = *s
	e.version++
	e.mu.Unlock()
}

func (t *Table) badData(format string, args ...any) {
	t.bad.Add(1)
	t.cfg.Logf(format, args...)
}

var _ fmt.Stringer = Key{}
