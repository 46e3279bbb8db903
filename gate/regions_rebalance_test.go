package gate_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/weighted"
)

// peekHook is a store that runs a function armed with arm once, right
// after the Peek of key it names (a request landing while a rebalance is
// under way). Peeks of other keys (the store's clock probe) do not count.
type peekHook struct {
	weighted.Store
	key   string
	mu    sync.Mutex
	skip  int
	after func()
}

// arm runs f after the Peek of p.key that follows skip more of them: 0
// for a rebalance's first peek, 1 for the second, which only a lowering
// makes.
func (p *peekHook) arm(skip int, f func()) {
	p.mu.Lock()
	p.skip, p.after = skip, f
	p.mu.Unlock()
}

func (p *peekHook) Peek(ctx context.Context, items []weighted.Item) (weighted.Result, error) {
	res, err := p.Store.Peek(ctx, items)
	if len(items) != 1 || items[0].Key != p.key {
		return res, err
	}
	p.mu.Lock()
	var f func()
	switch {
	case p.after == nil:
	case p.skip > 0:
		p.skip--
	default:
		f, p.after = p.after, nil
	}
	p.mu.Unlock()
	if f != nil {
		f()
	}
	return res, err
}

// newRegion opens region name of names (eu and us when none are given),
// its caps in the PostgreSQL of dsn, debited in st, on clock. Its
// interval is a millisecond: the tests call Rebalance themselves, and a
// lowering announced reaches the row at a rebalance 2 ms or more later.
func newRegion(t *testing.T, dsn, name string, st weighted.Store, clock func() time.Time, names ...string) *gate.Regions {
	t.Helper()
	return newRegionEvery(t, dsn, name, st, clock, time.Millisecond, names...)
}

// newRegionEvery is newRegion with its interval.
func newRegionEvery(t *testing.T, dsn, name string, st weighted.Store, clock func() time.Time, every time.Duration, names ...string) *gate.Regions {
	t.Helper()
	if len(names) == 0 {
		names = []string{"eu", "us"}
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rg, err := gate.NewRegions(pool, st, gate.RegionsConfig{Region: name, Regions: names, Now: clock, SharedNow: clock, Interval: every})
	if err != nil {
		t.Fatal(err)
	}
	if err := rg.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return rg
}

// A region lowers its cap while requests it admitted under the old cap
// land: its row must still cover what it spent, or the other regions take
// what it spent again and the regions together spend more than the
// budget.
func TestRegionLowersItsCapUnderLoad(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const budget = 100
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	const key = "{acme}:tenant=acme"
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	var clk sync.Mutex
	clock := func() time.Time { clk.Lock(); defer clk.Unlock(); return now }
	advance := func(d time.Duration) { clk.Lock(); now = now.Add(d); clk.Unlock() }
	type region struct {
		rg    *gate.Regions
		store *peekHook
		spent int64
	}
	open := func(name string) *region {
		st := &peekHook{Store: weighted.NewMemory(weighted.MemoryConfig{Now: clock}), key: key}
		return &region{rg: newRegion(t, dsn, name, st, clock), store: st}
	}
	eu, us := open("eu"), open("us")
	var seq int
	spend := func(r *region, lim weighted.Limit, n int64) {
		t.Helper()
		for range n {
			seq++
			res, err := r.store.Debit(ctx, fmt.Sprint("q", seq), []weighted.Item{{Limit: lim, Key: key, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				r.spent++
			}
		}
	}
	euLimit := eu.rg.Limit(lim, key) // eu's first cap: half
	us.rg.Limit(lim, key)
	advance(time.Second)
	spend(us, us.rg.Limit(lim, key), 40)
	if err := us.rg.Rebalance(ctx); err != nil { // us reports its demand
		t.Fatal(err)
	}
	advance(time.Second)
	// eu, idle so far, lowers its cap to its small share; 30 requests it
	// admitted under its old cap land between its peek and the lowering.
	eu.store.arm(0, func() { spend(eu, euLimit, 30) })
	if err := eu.rg.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		advance(time.Second)
		if err := us.rg.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		spend(us, us.rg.Limit(lim, key), 100)
		if err := eu.rg.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		spend(eu, eu.rg.Limit(lim, key), 100)
	}
	t.Logf("eu spent %d, us %d, of %d", eu.spent, us.spent, budget)
	if eu.spent+us.spent > budget {
		t.Fatalf("the regions spent %d of a budget of %d", eu.spent+us.spent, budget)
	}
}

// A budget lowered (or raised) by a config reload in the middle of its
// period is shared anew at the next rebalance: the regions' caps and
// spend keep within the new amount, not the one the period started with.
func TestRegionsFollowAChangedBudget(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: 100, Period: 24 * time.Hour}
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	type region struct {
		rg    *gate.Regions
		store weighted.Store
		spent int64
	}
	var rs []*region
	for _, name := range []string{"eu", "us"} {
		st := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
		rs = append(rs, &region{rg: newRegion(t, dsn, name, st, clock), store: st})
	}
	var seq int
	round := func(lim weighted.Limit) {
		t.Helper()
		for _, r := range rs {
			l := r.rg.Limit(lim, key)
			if err := r.rg.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
			l = r.rg.Limit(lim, key)
			for range 10 {
				seq++
				res, err := r.store.Debit(ctx, fmt.Sprint("q", seq), []weighted.Item{{Limit: l, Key: key, Cost: 1}})
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					r.spent++
				}
			}
		}
	}
	round(lim)
	lowered := lim
	lowered.Rate = 30
	for range 5 {
		round(lowered)
	}
	if s := rs[0].spent + rs[1].spent; s > 30 {
		t.Fatalf("the regions spent %d after the budget was lowered to 30 (20 before)", s)
	}
	raised := lim
	raised.Rate = 200
	for range 30 {
		round(raised)
	}
	if s := rs[0].spent + rs[1].spent; s > 200 || s < 190 {
		t.Fatalf("the regions spent %d after the budget was raised to 200", s)
	}
}

// A region stopped at its cap spends nothing, but its demand is still
// there: the gate reports what the cap refused (Regions.Refused), and the
// region gets what the idle regions do not use. Counted by spend alone,
// its demand decays at the same pace as an idle region's, their shares
// stay as they were, and the rest of the budget is never spent.
func TestRegionStoppedAtItsCapGetsMore(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: 100, Period: 24 * time.Hour}
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	type region struct {
		rg      *gate.Regions
		store   weighted.Store
		spent   int64
		refused int
	}
	open := func(name string) *region {
		st := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
		return &region{rg: newRegion(t, dsn, name, st, clock), store: st}
	}
	eu, us := open("eu"), open("us")
	var seq int
	// spend tries n requests of 10 as the gate does, reporting refusals.
	spend := func(r *region, n int) {
		t.Helper()
		for range n {
			seq++
			l := r.rg.Limit(lim, key)
			item := weighted.Item{Limit: l, Key: key, Cost: 10}
			if item.Cost > l.Capacity() {
				r.rg.Refused(lim, key, item.Cost)
				r.refused++
				continue
			}
			res, err := r.store.Debit(ctx, fmt.Sprint("q", seq), []weighted.Item{item})
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				r.spent += item.Cost
			} else {
				r.rg.Refused(lim, key, item.Cost)
				r.refused++
			}
		}
	}
	rebalance := func(rs ...*region) {
		t.Helper()
		now = now.Add(time.Second)
		for _, r := range rs {
			if err := r.rg.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// eu's first cap is half the budget, and it spends it at once; us
	// reads its cap, as large, and goes quiet: its rebalances do not run
	// (they run on a timer of their own) while eu's demand decays.
	spend(eu, 5)
	us.rg.Limit(lim, key)
	for range 8 {
		rebalance(eu)
	}
	spend(us, 1) // us spends a little, which is now the larger recent demand
	rebalance(eu, us)
	for range 20 { // eu wants one request a second, us nothing
		spend(eu, 1)
		rebalance(eu, us)
	}
	t.Logf("eu spent %d (%d refused), us %d, of %d", eu.spent, eu.refused, us.spent, lim.Rate)
	if eu.spent+us.spent > lim.Rate {
		t.Fatalf("the regions spent %d of a budget of %d", eu.spent+us.spent, lim.Rate)
	}
	if eu.spent < 70 {
		t.Fatalf("eu, refused at its cap, spent %d: the %d us does not use never came to it", eu.spent, lim.Rate-eu.spent-us.spent)
	}
}

// fakeClock is a clock at start that moves only when advanced; safe for
// concurrent use.
func fakeClock(start time.Time) (clock func() time.Time, advance func(time.Duration)) {
	var mu sync.Mutex
	now := start
	return func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
}

var debitSeq atomic.Int64

// debitOnce debits cost on key under l from st, as one request of its
// own, and reports whether it was admitted.
func debitOnce(t *testing.T, st weighted.Store, l weighted.Limit, key string, cost int64) bool {
	t.Helper()
	res, err := st.Debit(context.Background(), fmt.Sprint("q", debitSeq.Add(1)), []weighted.Item{{Limit: l, Key: key, Cost: cost}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Allowed
}

// TestRegionsMigrateTogether: replicas that start together on a fresh
// database all migrate the table of caps, none failing on the others'
// concurrent CREATE TABLE.
func TestRegionsMigrateTogether(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			rg, err := gate.NewRegions(pool, weighted.NewMemory(weighted.MemoryConfig{}),
				gate.RegionsConfig{Region: []string{"eu", "us"}[i%2], Regions: []string{"eu", "us"}})
			if err == nil {
				err = rg.Migrate(ctx)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestRegionsSweepPastPeriods: the rows of a period that ended a day ago
// or more are deleted at a rebalance (at most once an hour); the rows of
// the period running, and of one that ended less than a day ago, stay.
func TestRegionsSweepPastPeriods(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	clock, advance := fakeClock(time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC))
	rg := newRegion(t, dsn, "eu", weighted.NewMemory(weighted.MemoryConfig{Now: clock}), clock)
	daily := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: 100, Period: 24 * time.Hour}
	monthly := weighted.Limit{Name: "monthly", Algorithm: weighted.FixedWindow, Rate: 100, Calendar: weighted.Month}
	periods := func() []string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT DISTINCT period FROM costgate_region_caps ORDER BY period`)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	use := func() {
		_ = rg.Limit(daily, "{acme}:tenant=acme")
		_ = rg.Limit(monthly, "{acme}:tenant=acme")
	}
	use() // Nov 30, November
	advance(2 * time.Hour)
	use() // Dec 1, December
	if got := periods(); len(got) != 4 {
		t.Fatalf("periods %v, want two days and two months", got)
	}
	advance(12 * time.Hour) // Nov 30 and November ended 13 h ago: kept
	if err := rg.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	if got := periods(); len(got) != 4 {
		t.Fatalf("periods %v 13 h after the end of two of them: want all four kept", got)
	}
	advance(12 * time.Hour) // 25 h after: deleted
	if err := rg.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"month:2026-12", fmt.Sprintf("p%d:%d", (24 * time.Hour).Microseconds(), clock().Add(-24*time.Hour).UnixMicro()/(24*time.Hour).Microseconds())}
	slices.Sort(want)
	if got := periods(); !slices.Equal(got, want) {
		t.Fatalf("periods %v a day after November ended, want %v", got, want)
	}
}
