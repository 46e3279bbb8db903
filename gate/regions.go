package gate

// Multi-region budgets. Each region runs its own Redis; a budget of B
// units per tenant per period is split into regional caps C_r, one row
// per region in a table of the shared PostgreSQL, whose sum never exceeds
// B. A region debits its budget counters in its own Redis against its own
// cap, so the regions together never spend more than B (beyond what a
// strict budget lets requests in flight overrun). Every interval each
// region rebalances its own cap, in one transaction that locks the
// budget's rows: it reports what it has spent and its recent demand,
// and moves its cap toward its demand's share of what is left of B,
// lowering it (never below its own spend) or raising it by at most the
// part of B no region holds. A region changes only its own row, so a
// region cut off from PostgreSQL keeps its cap: it serves up to it and
// stops there, and the others share what it does not hold. A cap is
// raised in the row before in process, and lowered in process before the
// row, so a failure between the two leaves the region below its row; a
// lowering is announced in the row first, taken in process by each of
// the region's replicas at its next rebalance, and written to the row
// two intervals later (see rebalance).

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/costgate/costgate/weighted"
)

// RegionsConfig configures a region's share of global budgets.
type RegionsConfig struct {
	// Region is this region's name; Regions every region's, this one
	// included.
	Region  string
	Regions []string
	// Interval is how often the region rebalances its caps; default 10s.
	Interval time.Duration
	// MinShare is the least share of what is left that a region's demand
	// weighs, so that an idle region keeps some; default 0.05.
	MinShare float64
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// SharedNow is the clock every region shares, which tells when a
	// period runs: a cap of a period is spent only while this clock is in
	// it too, so that stores whose clocks disagree do not spend two
	// periods' caps at once. nil means PostgreSQL's clock, measured
	// against Now at every rebalance.
	SharedNow func() time.Time
	// Spent is what the ledger says region spent this period of budget
	// (the limit's name) for key. A region without a row of a key has
	// taken no cap of it, but may have spent in its period: a budget a
	// change gave a new key (renamed, another period) starts without
	// rows while the regions spent under the old one. A rebalance counts
	// the spend of each region without a row as used (see seeds). nil
	// counts none.
	Spent func(ctx context.Context, budget weighted.Limit, key, region string) (int64, error)
}

// Validate reports whether the config is usable.
func (c RegionsConfig) Validate() error {
	switch {
	case c.Region == "":
		return errors.New("gate: regions: this region has no name")
	case len(c.Regions) < 1:
		return errors.New("gate: regions: no regions")
	case c.Interval < 0:
		return errors.New("gate: regions: negative interval")
	case c.MinShare < 0 || c.MinShare > 1 || math.IsNaN(c.MinShare):
		return fmt.Errorf("gate: regions: min_share %v is not in [0, 1]", c.MinShare)
	}
	for _, r := range c.Regions {
		if r == c.Region {
			return nil
		}
	}
	return fmt.Errorf("gate: regions: %q is not one of the regions %v", c.Region, c.Regions)
}

// Regions keeps this region's caps of global budgets. It is safe for
// concurrent use.
type Regions struct {
	db    *pgxpool.Pool
	store weighted.Store
	cfg   RegionsConfig

	// offset is the store's clock less this host's, in microseconds, as
	// SyncClock last measured it: a cap's period is named by the store's
	// time, the one its counter's window follows.
	offset atomic.Int64
	// dbOffset is PostgreSQL's clock less this host's, in microseconds,
	// as syncDBClock last measured it (with no SharedNow).
	dbOffset atomic.Int64

	mu       sync.Mutex
	caps     map[capKey]*regionCap
	lastOK   time.Time
	lastErr  error
	lastTry  time.Time
	attempts int64
	swept    time.Time // the last deletion of past periods' rows
}

type capKey struct {
	budget string
	key    string
	period string // the window's name, such as "day:20423" or "month:2026-12"
}

// capRow is a region's row of a cap.
type capRow struct {
	cap, used int64
	rate      float64
	target    int64 // a lowering announced, -1 for none
	since     time.Time
}

type regionCap struct {
	first sync.Mutex     // held while the cap is read the first time
	limit weighted.Limit // the budget, Rate = B
	cap   int64          // this region's cap; known once read
	total int64          // the budget the cap is a share of (its Rate then)
	known bool
	used  int64 // at the last rebalance
	rate  float64
	at    time.Time
	// refused is the cost this region refused for the budget since the
	// last rebalance: demand that its spend does not show.
	refused int64
	// seeds is what the ledger said each region had spent of the key's
	// period when this region first found regions without a row of it
	// (see seeds); nil until then.
	seeds map[string]int64
}

// NewRegions returns the caps of region cfg.Region, kept in db and
// debited in store. Call Migrate once before Rebalance.
func NewRegions(db *pgxpool.Pool, store weighted.Store, cfg RegionsConfig) (*Regions, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.MinShare == 0 {
		cfg.MinShare = 0.05
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Regions{db: db, store: store, cfg: cfg, caps: map[capKey]*regionCap{}}, nil
}

// now is the store's time, as this region knows it: its host's clock
// moved by the offset SyncClock measured.
func (g *Regions) now() time.Time {
	return g.cfg.Now().Add(time.Duration(g.offset.Load()) * time.Microsecond)
}

// sharedNow is the time by the clock every region shares.
func (g *Regions) sharedNow() time.Time {
	if g.cfg.SharedNow != nil {
		return g.cfg.SharedNow()
	}
	return g.cfg.Now().Add(time.Duration(g.dbOffset.Load()) * time.Microsecond)
}

// syncDBClock measures PostgreSQL's clock against this host's.
func (g *Regions) syncDBClock(ctx context.Context) error {
	if g.cfg.SharedNow != nil {
		return nil
	}
	var db time.Time
	t0 := g.cfg.Now()
	if err := g.db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&db); err != nil {
		return fmt.Errorf("gate: regions: the database's clock: %w", err)
	}
	t1 := g.cfg.Now()
	g.dbOffset.Store(db.Sub(t0.Add(t1.Sub(t0) / 2)).Microseconds())
	return nil
}

// clockProbe is a day's window debited once a day: a peek of it tells
// the store's time of day (fixed windows start at multiples of their
// period since the Unix epoch, in the store's clock; an empty one does
// not say when it ends).
var clockProbe = weighted.Item{Limit: weighted.Limit{Name: "costgate-region-clock", Algorithm: weighted.FixedWindow,
	Rate: 1 << 40, Period: 24 * time.Hour}, Key: "costgate:region-clock", Cost: 1}

// SyncClock measures how far the store's clock (the server's TIME for
// Redis) is from this host's, within 12 hours, to the call's round trip.
// A budget's counters count in the store's windows; a region whose host
// clock ran ahead of its store would name a cap by the next period while
// its counter still counted in the last, and spend the last period's
// budget again under a fresh cap. Rebalance calls it, and so should the
// owner once before the first request.
func (g *Regions) SyncClock(ctx context.Context) error {
	probe := []weighted.Item{clockProbe}
	t0 := g.cfg.Now()
	res, err := g.store.Peek(ctx, probe)
	if err == nil && len(res.Items) == 1 && res.Items[0].ResetAfter <= 0 {
		// The day's window is empty: the first probe of the day counts in
		// it, once whichever replicas send it (one id a day).
		t0 = g.cfg.Now()
		res, err = g.store.Debit(ctx, "costgate-region-clock-"+t0.UTC().Format(time.DateOnly), probe)
	}
	t1 := g.cfg.Now()
	if err != nil {
		return fmt.Errorf("gate: regions: the store's clock: %w", err)
	}
	if len(res.Items) != 1 {
		return fmt.Errorf("gate: regions: the store's clock: %d answers to one probe", len(res.Items))
	}
	ra := res.Items[0].ResetAfter
	p := clockProbe.Limit.Period.Microseconds()
	if ra <= 0 || ra.Microseconds() > p {
		return fmt.Errorf("gate: regions: the store's clock: a day's window resets after %s", ra)
	}
	mid := t0.Add(t1.Sub(t0) / 2).UnixMicro()
	// The store is p - ra into its day, the host mid%p: the offset is
	// their difference, taken within half a day either way.
	d := (p - ra.Microseconds()) - mid%p
	g.offset.Store((d+p+p/2)%p - p/2)
	return nil
}

// Migrate creates the table of regional caps.
// Replicas that start together migrate one at a time (CREATE TABLE IF
// NOT EXISTS run concurrently can fail on the catalog's unique index).
func (g *Regions) Migrate(ctx context.Context) error {
	tx, err := g.db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("gate: regions: migrate: %w", err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		`SELECT pg_advisory_xact_lock(7366043203917165313)`, // "costgate regions migrate"
		`CREATE TABLE IF NOT EXISTS costgate_region_caps (
	budget text NOT NULL, key text NOT NULL, period text NOT NULL, region text NOT NULL,
	cap bigint NOT NULL, used bigint NOT NULL, rate double precision NOT NULL,
	updated_at timestamptz NOT NULL,
	PRIMARY KEY (budget, key, period, region))`,
		// A lowering announced to the region's replicas (see rebalance).
		`ALTER TABLE costgate_region_caps
	ADD COLUMN IF NOT EXISTS target bigint, ADD COLUMN IF NOT EXISTS target_since timestamptz`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("gate: regions: migrate: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("gate: regions: migrate: %w", err)
	}
	return nil
}

// capKeyOf is the cap of budget l for key in the period that holds now.
func capKeyOf(l weighted.Limit, key string, now time.Time) capKey {
	return capKey{budget: l.Name, key: key, period: periodName(l, now)}
}

// periodEnd is when the period a row names ended (or ends); false for a
// name it does not know.
func periodEnd(name string) (time.Time, bool) {
	if m, ok := strings.CutPrefix(name, "month:"); ok {
		t, err := time.Parse("2006-01", m)
		if err != nil {
			return time.Time{}, false
		}
		return t.AddDate(0, 1, 0), true
	}
	rest, ok := strings.CutPrefix(name, "p")
	if !ok {
		return time.Time{}, false
	}
	p, idx, ok := strings.Cut(rest, ":")
	if !ok {
		return time.Time{}, false
	}
	period, err1 := strconv.ParseInt(p, 10, 64)
	i, err2 := strconv.ParseInt(idx, 10, 64)
	if err1 != nil || err2 != nil || period <= 0 || i < 0 || i >= math.MaxInt64/period-1 {
		return time.Time{}, false
	}
	return time.UnixMicro((i + 1) * period), true
}

// sweepEvery is how often a region deletes the rows of periods that
// ended, and sweepAfter how long after their end: a day, more than any
// clock skew or request in flight.
const (
	sweepEvery = time.Hour
	sweepAfter = 24 * time.Hour
)

// sweep deletes the rows of periods that ended sweepAfter ago or more, at
// most once per sweepEvery. A row of a period still running is never
// deleted: the others would take its cap as free while its region still
// holds it.
func (g *Regions) sweep(ctx context.Context, now time.Time) error {
	g.mu.Lock()
	due := now.Sub(g.swept) >= sweepEvery
	if due {
		g.swept = now
	}
	g.mu.Unlock()
	if !due {
		return nil
	}
	// A period ends by the clock every region shares, the database's, as
	// well as by this region's: a region whose clock ran days ahead must
	// not delete the rows of a period the others still spend in.
	var dbNow time.Time
	if err := g.db.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		return fmt.Errorf("gate: regions: sweep: %w", err)
	}
	if dbNow.Before(now) {
		now = dbNow
	}
	rows, err := g.db.Query(ctx, `SELECT DISTINCT period FROM costgate_region_caps`)
	if err != nil {
		return fmt.Errorf("gate: regions: sweep: %w", err)
	}
	var ended []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("gate: regions: sweep: %w", err)
		}
		if end, ok := periodEnd(name); ok && now.Sub(end) >= sweepAfter {
			ended = append(ended, name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("gate: regions: sweep: %w", err)
	}
	if len(ended) == 0 {
		return nil
	}
	if _, err := g.db.Exec(ctx, `DELETE FROM costgate_region_caps WHERE period = ANY($1)`, ended); err != nil {
		return fmt.Errorf("gate: regions: sweep: %w", err)
	}
	return nil
}

// periodName names the window of budget l that holds now.
func periodName(l weighted.Limit, now time.Time) string {
	now = now.UTC()
	if l.Calendar == weighted.Month {
		return now.Format("month:2006-01")
	}
	return fmt.Sprintf("p%d:%d", l.Period.Microseconds(), now.UnixMicro()/max(l.Period.Microseconds(), 1))
}

// samePeriod tells whether a and b are in one period of l, as
// periodName names them, without formatting a name.
func samePeriod(l weighted.Limit, a, b time.Time) bool {
	a, b = a.UTC(), b.UTC()
	if l.Calendar == weighted.Month {
		return a.Year() == b.Year() && a.Month() == b.Month()
	}
	p := max(l.Period.Microseconds(), 1)
	return a.UnixMicro()/p == b.UnixMicro()/p
}

// Limit returns budget l (its Rate the global amount) as this region
// enforces it for key now: its Rate is the region's cap, 1 at least (a
// weighted limit's least rate); 1 too while the cap is not read yet, so
// that a region that never reached PostgreSQL spends nothing of the
// budget. The key is rebalanced from then on.
func (g *Regions) Limit(l weighted.Limit, key string) weighted.Limit {
	return g.LimitContext(context.Background(), l, key)
}

// LimitContext is Limit, which reads a key's cap on its first use in a
// period: that request waits for one rebalance of the key (bounded by ctx
// and 2 s), and concurrent ones for the same.
func (g *Regions) LimitContext(ctx context.Context, l weighted.Limit, key string) weighted.Limit {
	out, _ := g.limitFor(ctx, l, key)
	return out
}

// limitFor is LimitContext, and tells whether this region's cap is 0
// (shut): the limit's least rate, 1, would still admit a cost of 1.
func (g *Regions) limitFor(ctx context.Context, l weighted.Limit, key string) (out weighted.Limit, shut bool) {
	now := g.now()
	k := capKeyOf(l, key, now)
	g.mu.Lock()
	c := g.caps[k]
	if c == nil {
		c = &regionCap{limit: l}
		g.caps[k] = c
	}
	// The budget as configured now: a reload that changes its amount is
	// shared anew from the next rebalance on.
	c.limit = l
	known := c.known
	g.mu.Unlock()
	if !known {
		c.first.Lock()
		g.mu.Lock()
		known = c.known
		g.mu.Unlock()
		if !known {
			fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = g.rebalance(fctx, k, now)
			cancel()
		}
		c.first.Unlock()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out = l
	// A cap not read yet is none: the limit's least rate, 1, would still
	// admit a cost of 1, so it is shut as a cap of 0 is.
	out.Rate, shut = 1, true
	if c.known {
		// A budget lowered by a reload since the last rebalance scales
		// the cap until the next one: every region scales its share
		// alike, so that together they hold no more than the new budget,
		// a region cut off from the others included.
		cp := scaledCap(c.cap, c.total, l.Rate)
		out.Rate, shut = max(cp, 1), cp <= 0
	}
	if !samePeriod(l, now, g.sharedNow()) {
		// The store's clock is in a period the shared clock is not (yet,
		// or any more): its cap is spent only while both are in it.
		out.Rate, shut = 1, true
	}
	out.Lease = weighted.Lease{} // a regional cap is strict
	return out, shut
}

// scaledCap is cp, a cap taken as a share of budget total, as a share of
// budget now: when the budget was lowered, the less of cp x now / total
// and cp less the whole lowering, and never above now. Regions may hold
// caps taken from different budgets (one rebalanced after a raise, one
// not): their caps sum to at most the largest, T, and each region's
// total is at most T, so each taking the whole lowering total - now off
// its cap leaves at most T - (T - now) = now in all, which scaling alone
// does not (50 of 100 and 150 of 200, lowered to 100: 50 + 75).
func scaledCap(cp, total, now int64) int64 {
	if total <= now || total <= 0 {
		return min(cp, now)
	}
	cp = min(max(cp, 0), total) // so that hi < total: Div64 cannot overflow
	hi, lo := bits.Mul64(uint64(cp), uint64(max(now, 0)))
	q, _ := bits.Div64(hi, lo, uint64(total))
	return max(min(int64(q), now, cp-(total-now)), 0)
}

// RegionInfo is what the admin plane shows of a region's reconciliation.
type RegionInfo struct {
	Region    string    `json:"region"`
	Regions   []string  `json:"regions"`
	LastOK    time.Time `json:"last_reconciliation"`
	LastTry   time.Time `json:"last_attempt"`
	LastError string    `json:"last_error,omitempty"`
	Budgets   int       `json:"budgets"`
	// StoreClockOffsetMS is how far the store's clock is ahead of this
	// host's (negative: behind), as last measured: the caps' periods
	// follow the store's.
	StoreClockOffsetMS float64 `json:"store_clock_offset_ms"`
}

// Info returns the region's last reconciliation.
func (g *Regions) Info() RegionInfo {
	g.mu.Lock()
	defer g.mu.Unlock()
	i := RegionInfo{Region: g.cfg.Region, Regions: g.cfg.Regions, LastOK: g.lastOK, LastTry: g.lastTry, Budgets: len(g.caps),
		StoreClockOffsetMS: float64(g.offset.Load()) / 1000}
	if g.lastErr != nil {
		i.LastError = g.lastErr.Error()
	}
	return i
}

// Cap returns this region's cap of budget name for key in the current
// period, and whether it is known.
func (g *Regions) Cap(l weighted.Limit, key string) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.caps[capKeyOf(l, key, g.now())]
	if c == nil || !c.known {
		return 0, false
	}
	return c.cap, true
}

// Run rebalances every interval until ctx ends.
func (g *Regions) Run(ctx context.Context) {
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = g.Rebalance(ctx)
		}
	}
}

// Rebalance rebalances every budget key this region has enforced in the
// current period, each in a transaction of its own.
func (g *Regions) Rebalance(ctx context.Context) error {
	var errs []error
	if err := g.SyncClock(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := g.syncDBClock(ctx); err != nil {
		errs = append(errs, err)
	}
	now := g.now()
	g.mu.Lock()
	keys := make([]capKey, 0, len(g.caps))
	for k := range g.caps {
		if k.period != periodName(g.caps[k].limit, now) {
			delete(g.caps, k) // a past period
			continue
		}
		keys = append(keys, k)
	}
	g.lastTry = now
	g.mu.Unlock()
	if err := g.sweep(ctx, now); err != nil {
		errs = append(errs, err)
	}
	for _, k := range keys {
		if err := g.rebalance(ctx, k, now); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	g.mu.Lock()
	g.lastErr = err
	if err == nil {
		g.lastOK = now
	}
	g.mu.Unlock()
	return err
}

func (g *Regions) rebalance(ctx context.Context, k capKey, now time.Time) error {
	g.mu.Lock()
	c := g.caps[k]
	lim := c.limit
	g.mu.Unlock()
	total := lim.Rate
	// What this region has spent: its counter, peeked at the budget's
	// whole amount, which no regional count exceeds.
	peek := lim
	peek.Lease = weighted.Lease{}
	res, err := g.store.Peek(ctx, []weighted.Item{{Limit: peek, Key: k.key}})
	if err != nil {
		return fmt.Errorf("gate: regions: %s %s: %w", k.budget, k.key, err)
	}
	used := total - res.Items[0].Remaining

	tx, err := g.db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("gate: regions: %w", err)
	}
	defer tx.Rollback(ctx)
	h := fnv.New64a()
	h.Write([]byte(k.budget + "\x00" + k.key + "\x00" + k.period))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(h.Sum64())); err != nil {
		return fmt.Errorf("gate: regions: lock: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT region, cap, used, rate, coalesce(target, -1), coalesce(target_since, 'epoch')
		FROM costgate_region_caps WHERE budget = $1 AND key = $2 AND period = $3`,
		k.budget, k.key, k.period)
	if err != nil {
		return fmt.Errorf("gate: regions: read: %w", err)
	}
	all := map[string]capRow{}
	for rows.Next() {
		var name string
		var r capRow
		if err := rows.Scan(&name, &r.cap, &r.used, &r.rate, &r.target, &r.since); err != nil {
			rows.Close()
			return fmt.Errorf("gate: regions: read: %w", err)
		}
		all[name] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("gate: regions: read: %w", err)
	}
	// A region without a row has taken nothing: it spends nothing until
	// it writes one, here, under the lock. What it spent before counts as
	// used: this region's, raised to the ledger's reading; the others',
	// as rows of no cap that are not written.
	seeds, err := g.seeds(ctx, c, k, lim, all)
	if err != nil {
		return err
	}
	for r, v := range seeds {
		if _, ok := all[r]; !ok && r != g.cfg.Region {
			all[r] = capRow{used: v, target: -1}
		}
	}
	mine, had := all[g.cfg.Region]
	if !had {
		used = max(used, seeds[g.cfg.Region])
	}
	// The region's demand is what it spent and what its cap refused: a
	// region stopped at its cap spends nothing, and would otherwise look
	// idle to the others for as long as it stays stopped.
	rate := 0.0
	g.mu.Lock()
	refused := c.refused
	// The cap in process, which requests in flight may have read; before
	// the first read, the row's (0 without one).
	inForce := mine.cap
	if c.known {
		inForce = c.cap
	}
	if c.known && now.After(c.at) {
		rate = (float64(used-c.used) + float64(refused)) / now.Sub(c.at).Seconds()
		if c.rate > 0 {
			rate = (rate + c.rate) / 2
		}
	}
	g.mu.Unlock()
	mine.used, mine.rate = used, max(rate, 0)
	all[g.cfg.Region] = mine
	var held, spent int64
	var rates float64
	for _, r := range all {
		held += r.cap
		spent += r.used
		rates += r.rate
	}
	free := total - held
	left := max(total-spent, 0)
	share := 1.0 / float64(len(g.cfg.Regions))
	if rates > 0 {
		share = mine.rate / rates
	}
	share = max(share, g.cfg.MinShare)
	target := used + int64(math.Floor(share*float64(left)))
	// Never below what it spent, never more than its row and what no
	// region holds (a region that spent past its row, by a settlement
	// above the estimate, keeps its row and takes what is free).
	next := max(min(max(target, used), mine.cap+free), 0)
	// A raise is written to the row, then taken in process; a lowering is
	// taken in process first (see lowering).
	rowCap, inproc, tgt, tgtSince := next, next, int64(-1), time.Time{}
	if had && next <= mine.cap {
		rowCap, inproc, tgt, tgtSince = lowering(next, mine.cap, mine.target, mine.since, now, 2*g.cfg.Interval)
	}
	lower := inproc < inForce
	if lower {
		g.setCap(k, inproc, total, used, mine.rate, refused, now) // in process first
		// Requests admitted under the old cap while this rebalance ran
		// (since the peek above) are spent all the same: a row committed
		// keeps them, so that no other region is given them again.
		res, err := g.store.Peek(ctx, []weighted.Item{{Limit: peek, Key: k.key}})
		if err != nil {
			return fmt.Errorf("gate: regions: %s %s: %w", k.budget, k.key, err)
		}
		if spent := total - res.Items[0].Remaining; spent > used {
			g.setCap(k, inproc, total, spent, mine.rate, 0, now)
			used, mine.used = spent, spent
		}
	}
	if rowCap < mine.cap {
		rowCap = min(max(rowCap, used), mine.cap)
	}
	var tgtArg, sinceArg any
	if tgt >= 0 {
		tgtArg, sinceArg = tgt, tgtSince
	}
	if _, err := tx.Exec(ctx, `INSERT INTO costgate_region_caps (budget, key, period, region, cap, used, rate, updated_at, target, target_since)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (budget, key, period, region) DO UPDATE SET cap = $5, used = $6, rate = $7, updated_at = $8, target = $9, target_since = $10`,
		k.budget, k.key, k.period, g.cfg.Region, rowCap, used, mine.rate, now, tgtArg, sinceArg); err != nil {
		return fmt.Errorf("gate: regions: write: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("gate: regions: commit: %w", err)
	}
	if !lower {
		g.setCap(k, inproc, total, used, mine.rate, refused, now)
	}
	return nil
}

// seeds returns what the ledger says each region without a row of cap
// key k (rows all) spent of budget lim in k's period, read once per key
// and period: a region without a row spends nothing of the key until it
// writes one, so what it spent before, under the budget's old key, does
// not change. (A region that had not reloaded the change yet when they
// were read spends on under the old key until it does: by at most what it
// admits in that time, the regions together may spend more than the
// budget.) Nil when every region has a row, or without Spent.
func (g *Regions) seeds(ctx context.Context, c *regionCap, k capKey, lim weighted.Limit, all map[string]capRow) (map[string]int64, error) {
	rowless := func(r string) bool { _, ok := all[r]; return !ok }
	if g.cfg.Spent == nil || !slices.ContainsFunc(g.cfg.Regions, rowless) {
		return nil, nil // (a count of the rows would take a region no longer configured for one that is)
	}
	g.mu.Lock()
	seeds := c.seeds
	g.mu.Unlock()
	if seeds != nil {
		return seeds, nil
	}
	seeds = make(map[string]int64, len(g.cfg.Regions))
	for _, r := range g.cfg.Regions {
		if !rowless(r) {
			continue
		}
		v, err := g.cfg.Spent(ctx, lim, k.key, r)
		if err != nil {
			return nil, fmt.Errorf("gate: regions: %s %s: the spend of region %s: %w", k.budget, k.key, r, err)
		}
		seeds[r] = v
	}
	g.mu.Lock()
	c.seeds = seeds
	g.mu.Unlock()
	return seeds, nil
}

// lowering is a region's cap when it computes next, at most its row's cap
// rowCap, with a lowering announced (target, since; target -1 for none):
// the row's cap and the cap in process now, and the target to announce
// (-1 for none) and since when. A lowering is taken in process at once,
// but only announced in the row: the region's other replicas, which share
// its Redis counter, each enforce the cap they read at their own last
// rebalance, and requests in flight debit the cap they read. Every
// replica takes the target in process at its next rebalance; once it has
// stood hold (two intervals: every replica on schedule has taken it, and
// its requests under the old cap have landed), a rebalance writes it to
// the row, where the other regions see it. A target lowered again starts
// its wait anew; a raise (not here) drops it.
func lowering(next, rowCap, target int64, since, now time.Time, hold time.Duration) (row, inproc, tgt int64, tgtSince time.Time) {
	t := next
	if target >= 0 {
		t = min(t, target)
	}
	switch {
	case t >= rowCap:
		return rowCap, rowCap, -1, time.Time{} // nothing to lower
	case t != target:
		return rowCap, t, t, now // announced now
	case now.Sub(since) >= hold:
		return t, t, -1, time.Time{} // committed
	default:
		return rowCap, t, t, since // still announced
	}
}

// setCap sets key k's cap, a share of budget total, and its spend and
// demand as of now, of which refused was counted in rate.
func (g *Regions) setCap(k capKey, cp, total, used int64, rate float64, refused int64, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.caps[k]; c != nil {
		c.cap, c.total, c.known, c.used, c.rate, c.at = cp, total, true, used, rate, now
		c.refused -= refused
	}
}

// Refused counts cost refused by this region's cap of budget l for key
// as demand at the next rebalance.
func (g *Regions) Refused(l weighted.Limit, key string, cost int64) {
	if cost <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.caps[capKeyOf(l, key, g.now())]; c != nil {
		c.refused += min(cost, math.MaxInt64-c.refused)
	}
}
