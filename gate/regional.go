package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/weighted"
)

// openRegions starts this region's share of the budgets when the config
// names regions: its caps live beside the ledger in PostgreSQL and are
// rebalanced every regions.interval until Close.
func (g *Gate) openRegions(ctx context.Context, cfg *config.Config) error {
	rc := cfg.Regions
	if rc == nil {
		return nil
	}
	pool, err := pgxpool.New(ctx, cfg.Ledger.DSN)
	if err != nil {
		return fmt.Errorf("gate: regions: %w", config.RedactErr(err))
	}
	g.closers = append(g.closers, func() error { pool.Close(); return nil })
	rg, err := NewRegions(pool, g.store, RegionsConfig{Region: cfg.Region, Regions: rc.Names, Interval: rc.Interval, MinShare: rc.MinShare,
		Spent: g.regionSpent})
	if err != nil {
		return err
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rg.Migrate(mctx); err != nil {
		return err
	}
	if err := rg.syncDBClock(mctx); err != nil {
		g.log.Warn("regions: the database's clock", "err", err)
	}
	if err := rg.SyncClock(mctx); err != nil {
		// The host's clock until the first rebalance that reaches the
		// store.
		g.log.Warn("regions: the store's clock", "err", err)
	}
	g.regions = rg
	rctx, stop := context.WithCancel(context.Background())
	g.closers = append(g.closers, func() error { stop(); return nil })
	g.wg.Go(func() { rg.Run(rctx) })
	return nil
}

// regional is l as this request debits it under key: a budget's amount
// is this region's cap when regions share it; shut tells that the cap is
// 0 (see Regions.limitFor).
func (g *Gate) regional(ctx context.Context, l *compiledLimit, key string) (lim weighted.Limit, shut bool) {
	if g.regions == nil || !l.budget {
		return l.limit, false
	}
	return g.regions.limitFor(ctx, l.limit, key)
}

// spent is what this region has spent of budget l for key, at least: the
// count its Redis is restored to. A scheduled check (lost false) takes
// the larger of what it last reported and own, the spend of the entries
// this region recorded. After its Redis lost its data (lost), that is
// raised, at most to its cap, to the larger of two readings of the
// ledger: own, the spend of the entries this region recorded, and the
// ledger's spend (every region's, ledger) less what the other regions
// reported in their rows. own is the region's spend but for its own
// records not yet in the ledger (as a single region's restore); the
// second counts entries recorded before the regions were configured,
// which name no region, but is low when another region reported spend
// its ledger entries do not show yet (its spool lags its Redis), so
// alone it would let this region spend twice what it spent since its
// last report. (A scheduled check does not take the second: the others'
// spend since their reports would count as this region's.) When the rows
// cannot be read, the others count for nothing (the whole ledger's
// spend, at most the cap, which refuses rather than admits).
func (g *Regions) spent(ctx context.Context, l weighted.Limit, key string, ledger, own int64, lost bool) int64 {
	k := capKeyOf(l, key, g.now())
	var used, cp int64
	known := false
	g.mu.Lock()
	if c := g.caps[k]; c != nil && c.known {
		used, cp, known = c.used, c.cap, true
	}
	g.mu.Unlock()
	if !lost {
		// Its own entries are its spend, at least: a counter a change
		// gave a new key counts the region's spend of its period under
		// the old one.
		return max(used, own)
	}
	var rowCap, rowUsed, others int64
	var hasRow bool
	err := g.db.QueryRow(ctx, `SELECT
		coalesce(sum(used) FILTER (WHERE region <> $4), 0),
		coalesce(max(cap) FILTER (WHERE region = $4), 0),
		coalesce(max(used) FILTER (WHERE region = $4), 0),
		count(*) FILTER (WHERE region = $4) > 0
		FROM costgate_region_caps WHERE budget = $1 AND key = $2 AND period = $3`,
		k.budget, k.key, k.period, g.cfg.Region).Scan(&others, &rowCap, &rowUsed, &hasRow)
	if err != nil {
		others = 0
	}
	if hasRow {
		used = max(used, rowUsed)
		if !known {
			cp, known = rowCap, true
		}
	}
	if !known {
		// No cap read yet: the region has spent nothing it was not given,
		// and reads its cap before its first debit.
		return used
	}
	return max(used, min(cp, max(own, ledger-others)))
}

// regionRefused counts the cost of item i, which limit i refused, as
// demand for this region's cap when the limit is a budget the regions
// share: a region stopped at its cap spends nothing, and shows its demand
// this way.
func (r *Reservation) regionRefused(i int) {
	if r.limits[i].budget && r.g.regions != nil && i < len(r.items) {
		r.g.regions.Refused(r.limits[i].limit, r.items[i].Key, r.items[i].Cost)
	}
}

// regionalTooBig answers a cost above this region's cap of a budget, but
// within the budget, as the budget spent here (402), not as a cost no
// state could admit (400): the cap may grow at the next rebalance, which
// is the Retry-After. Nothing was debited.
func (r *Reservation) regionalTooBig(tooBig *weighted.CostError) (Decision, bool) {
	if r.g.regions == nil {
		return Decision{}, false
	}
	for i, l := range r.limits {
		if !l.budget || l.limit.Name != tooBig.Limit || tooBig.Cost > l.limit.Capacity() || i >= len(r.items) {
			continue
		}
		wait := r.g.regions.cfg.Interval
		items := make([]weighted.ItemState, len(r.items))
		for j := range items {
			c := r.items[j].Limit.Capacity()
			items[j] = weighted.ItemState{Allowed: true, Remaining: c, Capacity: c}
		}
		items[i] = weighted.ItemState{Capacity: tooBig.Capacity, RetryAfter: wait, ResetAfter: wait}
		r.result = weighted.Result{Decider: i, RetryAfter: wait, ResetAfter: wait, Items: items}
		return r.deny(), true
	}
	return Decision{}, false
}
