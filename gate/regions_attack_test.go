package gate_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/weighted"
)

// TestRegionsAttackStoreClocksSkewedBetweenRegions: the regions' stores
// (their Redis TIME) disagree by 15 minutes, eu's ahead; every host
// clock is right. eu's counters and caps cross midnight 15 minutes
// before us's: in the last quarter hour of true day 2 eu would read a cap
// of day 3, which no region holds yet, grow it to the whole budget and
// spend it beside us's day 2. A tenant that sends its traffic to eu from
// 23:45 on must still spend at most one budget in each true day: a cap is
// spent only while the clock the regions share, PostgreSQL's (here the
// test's true clock), is in its period too.
func TestRegionsAttackStoreClocksSkewedBetweenRegions(t *testing.T) {
	ctx := context.Background()
	const key = regAtkKey
	lim, trueClock, advance, eu, us, euStore, usStore := regAtkSkewed(t, 15*time.Minute)
	for _, rg := range []*gate.Regions{eu, us} {
		if err := rg.SyncClock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	perDay := map[int]int64{}
	for range 120 { // 23:00 to 01:00, a round a minute
		for _, rg := range []*gate.Regions{eu, us} {
			if err := rg.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for range 10 {
			if regAtkDebit(t, euStore, eu.Limit(lim, key), key, 2) {
				perDay[trueClock().Day()] += 2
			}
			if regAtkDebit(t, usStore, us.Limit(lim, key), key, 2) {
				perDay[trueClock().Day()] += 2
			}
		}
		advance(time.Minute)
	}
	regAtkWithinBudget(t, "eu's store 15 min ahead of us's", perDay)
}

// TestRegionsAttackStoreClockBehindSpendsLastPeriodsCap: eu's store runs
// 15 minutes behind us's; eu is cut off from PostgreSQL (it rebalances
// no more) holding half the budget of day 2 unspent, while us spends its
// half. At true midnight us reads its cap of day 3, which no region holds
// yet, and takes the whole budget; eu, whose store is still in day 2,
// must not spend its day-2 cap in the first quarter hour of true day 3:
// each true day holds at most the budget.
func TestRegionsAttackStoreClockBehindSpendsLastPeriodsCap(t *testing.T) {
	ctx := context.Background()
	const key = regAtkKey
	lim, trueClock, advance, eu, us, euStore, usStore := regAtkSkewed(t, -15*time.Minute)
	for _, rg := range []*gate.Regions{eu, us} {
		if err := rg.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		_ = rg.Limit(lim, key) // half each
	}
	perDay := map[int]int64{}
	for i := range 80 { // 23:00 to 00:20, a round a minute
		if err := us.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if regAtkDebit(t, usStore, us.Limit(lim, key), key, 2) {
				perDay[trueClock().Day()] += 2
			}
			// The tenant sends eu nothing until true midnight.
			if i >= 60 && regAtkDebit(t, euStore, eu.Limit(lim, key), key, 2) {
				perDay[trueClock().Day()] += 2
			}
		}
		advance(time.Minute)
	}
	regAtkWithinBudget(t, "eu's store 15 min behind us's, eu cut off", perDay)
}

// regAtkKey and regAtkBudget are the key and the daily budget of the
// skewed-store attacks.
const (
	regAtkKey    = "{acme}:tenant=acme"
	regAtkBudget = 200
)

// regAtkSkewed opens regions eu and us on one PostgreSQL, each with its
// own store, eu's store's clock skew from the true one, at true 23:00 of
// 2026-12-02, and returns the daily budget and the true clock.
func regAtkSkewed(t *testing.T, skew time.Duration) (lim weighted.Limit, trueClock func() time.Time, advance func(time.Duration),
	eu, us *gate.Regions, euStore, usStore weighted.Store) {
	dsn := pgtest.New(t)
	lim = weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: regAtkBudget, Period: 24 * time.Hour}
	trueClock, advance = fakeClock(time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC))
	euStore = weighted.NewMemory(weighted.MemoryConfig{Now: func() time.Time { return trueClock().Add(skew) }})
	usStore = weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	return lim, trueClock, advance, newRegion(t, dsn, "eu", euStore, trueClock), newRegion(t, dsn, "us", usStore, trueClock), euStore, usStore
}

// regAtkWithinBudget fails for each true day whose global spend in
// perDay is above regAtkBudget.
func regAtkWithinBudget(t *testing.T, what string, perDay map[int]int64) {
	t.Helper()
	t.Logf("%s: global spend per true day %v, budget %d a day", what, perDay, regAtkBudget)
	for d, s := range perDay {
		if s > regAtkBudget {
			t.Errorf("true day %d: global spend %d, above the budget %d", d, s, regAtkBudget)
		}
	}
}

// TestRegionsAttackBudgetRaisedThenLowered: the budget is raised from 100
// to 200 by a reload, and lowered back to 100 by the next. Between the
// two, us rebalances (against 200: it takes the 100 no region holds, its
// cap 150) and eu does not (cut off from PostgreSQL, or simply not yet:
// its cap is still 50, a share of 100). Scaling each cap by new / the
// budget it was taken from would leave eu 50 and us 75: 125 of 100. Each
// region also takes the whole cut off its cap, so that together they hold
// at most the new budget before either rebalances again.
func TestRegionsAttackBudgetRaisedThenLowered(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: 100, Period: 24 * time.Hour}
	raised := lim
	raised.Rate = 200
	clock, advance := fakeClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	euStore := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
	usStore := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
	eu := newRegion(t, dsn, "eu", euStore, clock)
	us := newRegion(t, dsn, "us", usStore, clock)
	_ = eu.Limit(lim, key) // 50 each
	_ = us.Limit(lim, key)
	for range 3 { // the raise: us alone rebalances (eu is cut off)
		advance(time.Second)
		_ = us.Limit(raised, key)
		us.Refused(raised, key, 1000) // its demand: refused, nothing spent
		if err := us.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
	}
	euCap, _ := eu.Cap(lim, key)
	usCap, _ := us.Cap(lim, key)
	t.Logf("after the raise: caps eu %d, us %d", euCap, usCap)
	var global int64
	for range 200 { // lowered back to 100; no rebalance yet
		if regAtkDebit(t, euStore, eu.Limit(lim, key), key, 1) {
			global++
		}
		if regAtkDebit(t, usStore, us.Limit(lim, key), key, 1) {
			global++
		}
	}
	t.Logf("global spend %d after the budget went back to %d (nothing spent before)", global, lim.Rate)
	if global > lim.Rate {
		t.Fatalf("global spend %d, above the budget %d", global, lim.Rate)
	}
}

// TestRegionsAttackHostDaysAheadSweepsRunningRows: eu's host clock runs two
// days ahead (its Redis is right, and SyncClock, which measures within
// half a day, sees no offset). eu's first rebalance must not sweep the
// rows of the day every other region still spends in (us and ap, each at
// its cap of half the budget, would find no row held and take the budget
// again): a period ends by PostgreSQL's clock too.
func TestRegionsAttackHostDaysAheadSweepsRunningRows(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 100
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	names := []string{"eu", "us", "ap"}
	// The true clock starts at 10:00 of today (the sweep reads the
	// database's clock, the system's here): a day already past by it,
	// which a fixed date becomes, is one every region may sweep.
	trueClock, advance := fakeClock(time.Now().UTC().Truncate(24 * time.Hour).Add(10 * time.Hour))
	usStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	apStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	us := newRegion(t, dsn, "us", usStore, trueClock, names...)
	ap := newRegion(t, dsn, "ap", apStore, trueClock, names...)
	spend := func(rg *gate.Regions, st weighted.Store, n int) (got int64) {
		for range n {
			if debitOnce(t, st, rg.Limit(lim, key), key, 1) {
				got++
			}
		}
		return got
	}
	var global int64
	for range 5 { // us and ap alone have demand: they split the budget
		advance(time.Minute)
		for _, r := range []struct {
			rg *gate.Regions
			st weighted.Store
		}{{us, usStore}, {ap, apStore}} {
			if err := r.rg.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
			global += spend(r.rg, r.st, 100)
		}
	}
	t.Logf("us and ap spent %d of %d", global, budget)
	euStore := weighted.NewMemory(weighted.MemoryConfig{Now: trueClock})
	eu := newRegion(t, dsn, "eu", euStore, func() time.Time { return trueClock().Add(48 * time.Hour) }, names...)
	if err := eu.Rebalance(ctx); err != nil { // sweeps
		t.Fatal(err)
	}
	for range 5 {
		advance(time.Minute)
		global += spend(us, usStore, 0)
		if err := us.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		global += spend(us, usStore, 100)
		if err := ap.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		global += spend(ap, apStore, 100)
	}
	t.Logf("after eu's sweep, us and ap spent %d of %d in all", global, budget)
	if global > budget {
		t.Fatalf("global spend %d, above the budget %d: a region whose clock ran days ahead deleted the others' rows of the running day", global, budget)
	}
}

// TestRegionsAttackHostDaysAheadSpendsAFreshBudget: eu's host clock runs
// two days ahead of its Redis and of every other clock. SyncClock
// measures the store's clock within half a day (a peek of a day's window
// tells only the time of day): it sees no offset, and eu names its caps
// by a period two days on, which no region holds, while its counter
// counts in its Redis's window, today's. It must not spend a budget of
// its own on top of the one us spends today: the shared clock is not in
// the period its caps name.
func TestRegionsAttackHostDaysAheadSpendsAFreshBudget(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 200
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	ahead := func() time.Time { return time.Now().Add(48 * time.Hour) }
	euStore := weighted.NewMemory(weighted.MemoryConfig{})
	usStore := weighted.NewMemory(weighted.MemoryConfig{})
	eu := regAtkRegion(t, dsn, "eu", euStore, ahead)
	us := regAtkRegion(t, dsn, "us", usStore, time.Now)
	var global int64
	for range 20 {
		for _, r := range []struct {
			rg *gate.Regions
			st weighted.Store
		}{{eu, euStore}, {us, usStore}} {
			if err := r.rg.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
			for range 10 {
				if regAtkDebit(t, r.st, r.rg.Limit(lim, key), key, 2) {
					global += 2
				}
			}
		}
		time.Sleep(2 * time.Millisecond) // the regions' interval is a millisecond, on the system clock
	}
	t.Logf("eu's host two days ahead: global spend %d, budget %d", global, budget)
	if global > budget {
		t.Fatalf("global spend %d in one day, above the budget %d", global, budget)
	}
}

// TestRegionsAttackRegionAddedAndRemoved: ap joins mid-period (the config
// names three regions from then on) while eu and us hold the budget
// between them, and then us leaves (it stops; its row stays). Demand
// everywhere exceeds the budget: global spend stays within it, and ap
// gets what eu does not use.
func TestRegionsAttackRegionAddedAndRemoved(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 300
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	clock, advance := fakeClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	type region struct {
		rg    *gate.Regions
		st    weighted.Store
		spent int64
	}
	open := func(name string, st weighted.Store, names ...string) *region {
		return &region{rg: newRegion(t, dsn, name, st, clock, names...), st: st}
	}
	eu := open("eu", weighted.NewMemory(weighted.MemoryConfig{Now: clock}))
	us := open("us", weighted.NewMemory(weighted.MemoryConfig{Now: clock}))
	round := func(n int, rs ...*region) {
		t.Helper()
		advance(time.Second)
		for _, r := range rs {
			if err := r.rg.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
			for range n {
				if regAtkDebit(t, r.st, r.rg.Limit(lim, key), key, 2) {
					r.spent += 2
				} else {
					r.rg.Refused(lim, key, 2)
				}
			}
		}
	}
	for range 3 {
		round(10, eu, us)
	}
	all := []string{"eu", "us", "ap"}
	// The same regions, reconfigured (their Redis kept), and ap new.
	eu2, us2 := open("eu", eu.st, all...), open("us", us.st, all...)
	ap := open("ap", weighted.NewMemory(weighted.MemoryConfig{Now: clock}), all...)
	for range 10 {
		round(10, eu2, us2, ap)
	}
	for range 20 { // us leaves; eu idle
		round(0, eu2)
		round(10, ap)
	}
	global := eu.spent + us.spent + eu2.spent + us2.spent + ap.spent
	t.Logf("eu %d, us %d, ap %d; global %d of %d", eu.spent+eu2.spent, us.spent+us2.spent, ap.spent, global, budget)
	if global > budget {
		t.Fatalf("global spend %d, above the budget %d", global, budget)
	}
	if ap.spent == 0 {
		t.Fatalf("ap, added mid-period with demand, spent nothing of the %d left", budget-global)
	}
}

// TestRegionsAttackManyTenants: 40 tenants share three regions, each
// tenant's demand moving between regions at random; eu misses its
// rebalances for a third of the run (cut off), then catches up. Per
// tenant, global spend stays within its budget, eu's spend while cut off
// within the cap it held, and every tenant's budget is nearly spent by
// the end.
func TestRegionsAttackManyTenants(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const budget = 1000
	const tenants = 40
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	clock, advance := fakeClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	names := []string{"eu", "us", "ap"}
	type region struct {
		rg    *gate.Regions
		st    weighted.Store
		spent [tenants]int64
	}
	var rs []*region
	for _, n := range names {
		st := weighted.NewMemory(weighted.MemoryConfig{Now: clock})
		rs = append(rs, &region{rg: newRegion(t, dsn, n, st, clock, names...), st: st})
	}
	key := func(i int) string { return fmt.Sprintf("{t%d}:tenant=t%d", i, i) }
	rng := rand.New(rand.NewPCG(3, 4))
	var capAtCut [tenants]int64
	for round := range 60 {
		cut := round >= 20 && round < 40
		if round == 20 {
			for i := range tenants {
				capAtCut[i], _ = rs[0].rg.Cap(lim, key(i))
			}
		}
		advance(time.Second)
		for ri, r := range rs {
			if !(cut && ri == 0) {
				if err := r.rg.Rebalance(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for i := range tenants {
				for range rng.IntN(4) {
					cost := 1 + rng.Int64N(10)
					if regAtkDebit(t, r.st, r.rg.Limit(lim, key(i)), key(i), cost) {
						r.spent[i] += cost
					} else {
						r.rg.Refused(lim, key(i), cost)
					}
				}
			}
		}
		if round == 39 {
			for i := range tenants {
				if rs[0].spent[i] > capAtCut[i] {
					t.Fatalf("tenant %d: eu spent %d while cut off, past the cap %d it held", i, rs[0].spent[i], capAtCut[i])
				}
			}
		}
	}
	for i := range tenants {
		g := rs[0].spent[i] + rs[1].spent[i] + rs[2].spent[i]
		if g > budget {
			t.Errorf("tenant %d: global spend %d, above the budget %d", i, g, budget)
		}
		if g < budget*9/10 {
			t.Errorf("tenant %d: global spend %d of %d: the budget was not shared out", i, g, budget)
		}
	}
}

// TestRegionsAttackPartitionedBeforeItsFirstRead: eu is cut off from
// PostgreSQL before it reads its cap of the tenant's budget (a new
// period, or a tenant new to eu); us, which reaches PostgreSQL, spends
// the whole budget. A region that cannot reach PostgreSQL spends nothing
// of that budget until it can: a cap not read is shut, as a cap read as 0
// is (TestRegionCapZeroAdmitsNothing), not a limit of rate 1 that would
// admit a cost of 1 unit.
func TestRegionsAttackPartitionedBeforeItsFirstRead(t *testing.T) {
	dsn := pgtest.New(t)
	proxy := newCutProxy(t, dsn)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(proxy.port)))
	us := regAtkGate(t, dsn, "us", redistest.New(t), 50*time.Millisecond)
	eu := regAtkGate(t, u.String(), "eu", redistest.New(t), 50*time.Millisecond)
	proxy.cut(true)
	const budget = 10_000_000 // $0.01 in nano-USD
	var global int64
	for deadline := time.Now().Add(20 * time.Second); global < budget && time.Now().Before(deadline); {
		if regAtkSpend(t, us, 1_000_000) {
			global += 1_000_000
			continue
		}
		time.Sleep(60 * time.Millisecond) // us's cap grows at its rebalances
	}
	if global != budget {
		t.Fatalf("us spent %d of %d nano-USD", global, budget)
	}
	for range 3 {
		if regAtkSpend(t, eu, 1) {
			global++
		}
	}
	t.Logf("global %d of %d nano-USD", global, budget)
	if global > budget {
		t.Fatalf("eu, cut off before it read its cap, admitted %d nano-USD past a budget us spent whole", global-budget)
	}
}

// TestRegionsAttackPartitionedDataLoss: eu spends part of its cap, is cut
// off from PostgreSQL (the ledger's and the caps'), and then its Redis
// loses its data. Its counters cannot be restored from the ledger while
// it is cut off: it must not spend past the cap it held, nor spend twice
// what it spent before the loss.
func TestRegionsAttackPartitionedDataLoss(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	proxy := newCutProxy(t, dsn)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(proxy.port)))
	euRedis := redistest.New(t)
	eu := regAtkGate(t, u.String(), "eu", euRedis, time.Hour)
	us := regAtkGate(t, dsn, "us", redistest.New(t), time.Hour)
	var euSpent, usSpent int
	for range 3 {
		if regAtkSpend(t, eu, 1_000_000) {
			euSpent++
		}
	}
	for range 20 {
		if regAtkSpend(t, us, 1_000_000) {
			usSpent++
		}
	}
	proxy.cut(true)
	if err := euRedis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	after := 0
	for range 20 {
		if regAtkSpend(t, eu, 1_000_000) {
			after++
		}
	}
	t.Logf("eu spent %d, then %d cut off after its data loss; us %d; global %d of 10", euSpent, after, usSpent, euSpent+after+usSpent)
	if g := euSpent + after + usSpent; g > 10 {
		t.Fatalf("global spend %d requests of $0.001, above the budget of 10", g)
	}
}

// regAtkDebit debits cost on key under l from st, as one request of its
// own, and reports whether it was admitted. A cost above the limit's
// capacity is refused, as the gate refuses it (402): a cap not read, or
// shut, is a limit of rate 1, and costs here are 2 units so that it
// admits nothing.
func regAtkDebit(t *testing.T, st weighted.Store, l weighted.Limit, key string, cost int64) bool {
	t.Helper()
	if cost > l.Capacity() {
		return false
	}
	return debitOnce(t, st, l, key, cost)
}

// TestRegionsAttackDataLossThenIdle: eu spends, its Redis loses its data,
// and the tenant sends eu nothing more: eu's rebalances, not a request,
// are the first to touch the lost counter. Had they read it as empty, eu
// would report nothing spent and lower its row below its spend, and us
// would be given eu's spend again. The gate's store restores the counter
// on that peek too.
func TestRegionsAttackDataLossThenIdle(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	euRedis := redistest.New(t)
	eu := regAtkGate(t, dsn, "eu", euRedis, 50*time.Millisecond)
	us := regAtkGate(t, dsn, "us", redistest.New(t), 50*time.Millisecond)
	var global int
	for range 20 {
		if regAtkSpend(t, eu, 1_000_000) {
			global++
		}
	}
	waitRegionReported(t, dsn, "eu", int64(global)*1_000_000)
	if err := euRedis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	euSpent := global
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		time.Sleep(60 * time.Millisecond) // us's cap grows at the rebalances; eu idle
		for regAtkSpend(t, us, 1_000_000) {
			global++
		}
	}
	t.Logf("eu spent %d before its data loss; us %d after; global %d of 10", euSpent, global-euSpent, global)
	if global > 10 {
		t.Fatalf("global spend %d requests of $0.001, above the budget of 10", global)
	}
}

// regAtkRegion opens region name of eu and us, its caps in the
// PostgreSQL of dsn, debited in st, on host clock now, rebalanced every
// millisecond; every other clock is the system's.
func regAtkRegion(t *testing.T, dsn, name string, st weighted.Store, now func() time.Time) *gate.Regions {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rg, err := gate.NewRegions(pool, st, gate.RegionsConfig{Region: name, Regions: []string{"eu", "us"}, Now: now, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := rg.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rg
}

// regAtkGate opens a gate of region (of eu and us, rebalanced every
// interval) on the Redis srv and the PostgreSQL at dsn (ledger and caps),
// with tenant acme (key cg-acme) and its daily budget of $0.01.
func regAtkGate(t *testing.T, dsn, region string, srv *redistest.Server, interval time.Duration) *gate.Gate {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
region: %s
regions: {names: [eu, us], interval: %s}
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {name: daily, scope: tenant, amount: "0.01"}
`, t.TempDir(), region, interval, srv.URL, dsn)))
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.Open(context.Background(), cfg, gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// regAtkSpend makes one request of cost nano-USD as acme on g, recorded
// and settled at its estimate, and tells whether it was admitted.
func regAtkSpend(t *testing.T, g *gate.Gate, cost costmodel.NanoUSD) bool {
	t.Helper()
	ctx := context.Background()
	res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/x", Estimate: costmodel.Estimate{Cost: cost}})
	if res == nil {
		if d.Status != 402 && d.Status != 503 {
			t.Fatalf("refused with %d: %+v", d.Status, d)
		}
		return false
	}
	res.Record(ctx)
	res.Settle(ctx, gate.Charge{Cost: cost, HTTPStatus: 200})
	return true
}
