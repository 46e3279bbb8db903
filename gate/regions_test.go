package gate_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
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

// Three regions, each with its own Redis, share a budget through one
// PostgreSQL. Demand is uneven and exceeds the budget. Phase one: every
// region rebalances each round. Phase two: region 0 is cut off (its
// link to PostgreSQL is cut): it serves up to the cap it held and
// stops there, while the others share the rest. Phase three: it
// reconnects. At every round the regions' caps in PostgreSQL sum to at
// most the budget and the global spend stays within it; at the end the
// budget is spent to within a few requests.
func TestRegionsShareABudget(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const budget = 100_000
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	const key = "{acme}:tenant=acme"
	names := []string{"eu", "us", "ap"}
	type region struct {
		rg    *gate.Regions
		store weighted.Store
		pool  *pgxpool.Pool
		spent int64
	}
	var rs []*region
	proxy := newCutProxy(t, dsn)
	for i, name := range names {
		pcfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// Region 0 reaches PostgreSQL through a link the test cuts.
			pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = "127.0.0.1", proxy.port
			pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		c := redistest.New(t).Client(t)
		store := weighted.NewRedis(c, weighted.RedisConfig{QueueTimeout: time.Minute, CallTimeout: time.Minute, ReplyTimeout: time.Minute})
		rg, err := gate.NewRegions(pool, store, gate.RegionsConfig{Region: name, Regions: names, Interval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := rg.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, &region{rg: rg, store: store, pool: pool})
	}

	rng := rand.New(rand.NewPCG(1, 2))
	demand := []int{30, 12, 4} // requests per round
	var seq int
	global := func() int64 { return rs[0].spent + rs[1].spent + rs[2].spent }
	sumCaps := func() int64 {
		var s int64
		if err := rs[1].pool.QueryRow(ctx, `SELECT coalesce(sum(cap), 0) FROM costgate_region_caps`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	round := func(partitioned bool) {
		for i, r := range rs {
			if i == 0 && partitioned {
				if err := r.rg.Rebalance(ctx); err == nil {
					t.Fatal("a rebalance across a cut link succeeded")
				}
			} else if err := r.rg.Rebalance(ctx); err != nil {
				t.Fatal(err)
			}
			for range demand[i] {
				seq++
				cost := 1 + rng.Int64N(400)
				l := r.rg.Limit(lim, key)
				if cost > l.Capacity() {
					continue
				}
				res, err := r.store.Debit(ctx, fmt.Sprint("q", seq), []weighted.Item{{Limit: l, Key: key, Cost: cost}})
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					r.spent += cost
				}
			}
		}
		if s := sumCaps(); s > budget {
			t.Fatalf("the regions' caps sum to %d, above the budget %d", s, budget)
		}
		if g := global(); g > budget {
			t.Fatalf("global spend %d, above the budget %d", g, budget)
		}
	}
	for range 10 {
		round(false)
	}
	capAtCut, ok := rs[0].rg.Cap(lim, key)
	if !ok {
		t.Fatal("region 0 has no cap")
	}
	before := rs[0].spent
	proxy.cut(true)
	for range 40 {
		round(true)
	}
	proxy.cut(false)
	if rs[0].spent > capAtCut {
		t.Fatalf("the partitioned region spent %d, past the cap %d it held when cut off", rs[0].spent, capAtCut)
	}
	t.Logf("partition: region eu held %d, had spent %d, spent %d by the end; global %d of %d", capAtCut, before, rs[0].spent, global(), budget)
	for range 60 {
		round(false)
	}
	if g := global(); g < budget-3*400 {
		t.Fatalf("after recovery the regions spent %d of %d", g, budget)
	}
	if info := rs[0].rg.Info(); info.LastOK.IsZero() || info.LastError != "" {
		t.Fatalf("region info %+v", info)
	}
	t.Logf("spent: eu %d, us %d, ap %d; global %d of %d", rs[0].spent, rs[1].spent, rs[2].spent, global(), budget)
}

// cutProxy forwards TCP to a PostgreSQL server until it is cut: then it
// drops its connections and every new one.
type cutProxy struct {
	port  uint16
	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

func newCutProxy(t *testing.T, dsn string) *cutProxy {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &cutProxy{port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			down := p.down
			p.mu.Unlock()
			if down {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// Two gates, regions eu and us, each on its own Redis, share a budget of
// ten requests' cost through the ledger's PostgreSQL: eu, whose demand is
// the larger, ends up spending more than half of it once us has
// released what it does not use, and the two together never more than
// all of it; past its cap, eu answers 402.
func TestRegionsThroughTheGate(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	eu, us := regionGate(t, dsn, "eu"), regionGate(t, dsn, "us")
	spend := func(g *gate.Gate) (admitted int, last gate.Decision) {
		c := g.Identify("cg-acme")
		for {
			res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: usd("0.001")}})
			if res == nil {
				return admitted, d
			}
			res.Settle(ctx, gate.Charge{Cost: usd("0.001"), HTTPStatus: 200})
			admitted++
		}
	}
	first, d := spend(eu)
	if d.Status != 402 || first < 1 || first > 10 {
		t.Fatalf("eu admitted %d, then %+v", first, d)
	}
	// us serves one request: it reads its cap, about half of what is
	// left, and then has no demand.
	// (When eu's demand is already known there, us's share is its
	// min_share, less than one request: a 402, not a 400.)
	usFirst := 0
	if res, d := us.Reserve(ctx, &gate.Request{Caller: us.Identify("cg-acme"), Route: "/x", Estimate: costmodel.Estimate{Cost: usd("0.001")}}); res != nil {
		res.Settle(ctx, gate.Charge{Cost: usd("0.001"), HTTPStatus: 200})
		usFirst = 1
	} else if d.Status != 402 {
		t.Fatalf("us refused: %+v", d)
	}
	more := 0
	deadline := time.Now().Add(20 * time.Second)
	for first+more+usFirst < 9 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // the regions rebalance every 50 ms, on the system clock
		n, _ := spend(eu)
		more += n
	}
	total := first + more + usFirst
	t.Logf("eu admitted %d, then %d more after rebalancing; us %d; %d of 10 in all", first, more, usFirst, total)
	if total > 10 {
		t.Fatalf("the regions admitted %d requests of a budget of 10", total)
	}
	// eu's first cap can be the whole budget (us had shown no demand when
	// eu read it); only what it was not given can come back to it.
	if more == 0 && first+usFirst < 9 {
		t.Fatalf("eu got nothing more after rebalancing, with %d of 10 unspent", 10-first-usFirst)
	}
	// The store's clock measured through the gate's store (Redis, on this
	// host's clock): no error, no offset beyond a round trip.
	if r := eu.Regions(); len(r) != 1 || r[0].Region != "eu" || r[0].LastOK.IsZero() || r[0].LastError != "" ||
		math.Abs(r[0].StoreClockOffsetMS) > 100 {
		t.Fatalf("eu's regions view: %+v", r)
	}
}

// TestRegionCapZeroAdmitsNothing: once one region has spent a budget
// whole and reported it, another's cap is 0, and it refuses even a
// request of one unit (1 nano-dollar), which a limit's least rate, 1,
// would admit.
func TestRegionCapZeroAdmitsNothing(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	eu := regionGate(t, dsn, "eu")
	c := eu.Identify("cg-acme")
	// eu alone has demand: its cap grows, rebalance after rebalance, to
	// the whole budget (100 requests of $0.0001), and it spends it.
	spent := 0
	for deadline := time.Now().Add(20 * time.Second); spent < 100 && time.Now().Before(deadline); {
		res, _ := eu.Reserve(ctx, &gate.Request{Caller: c, Route: "/x", Estimate: costmodel.Estimate{Cost: 100_000}})
		if res == nil {
			time.Sleep(60 * time.Millisecond)
			continue
		}
		res.Settle(ctx, gate.Charge{Cost: 100_000, HTTPStatus: 200})
		spent++
	}
	if spent != 100 {
		t.Fatalf("eu spent %d of 100 requests", spent)
	}
	waitRegionReported(t, dsn, "eu", 100*100_000)
	us := regionGate(t, dsn, "us")
	cu := us.Identify("cg-acme")
	for i := range 3 {
		res, d := us.Reserve(ctx, &gate.Request{Caller: cu, Route: "/x", Estimate: costmodel.Estimate{Cost: 1}})
		if res != nil {
			res.Settle(ctx, gate.Charge{Cost: 1, HTTPStatus: 200})
			t.Fatalf("request %d of 1 nano-dollar admitted by us with eu's report of the whole budget spent", i)
		}
		if d.Status != 402 {
			t.Fatalf("us refused with %d, want 402: %+v", d.Status, d)
		}
	}
}

// waitRegionReported waits, up to 20 s, until region's rows in the
// regions' table of the PostgreSQL at dsn report at least spent
// nano-dollars used: its spend reported to the other regions at a
// rebalance, which a machine under load may take longer than a few
// intervals to write.
func waitRegionReported(t *testing.T, dsn, region string, spent int64) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var used int64
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(used), 0) FROM costgate_region_caps WHERE region = $1`, region).Scan(&used)
		if err == nil && used >= spent {
			return
		}
	}
	t.Fatalf("%s reported %d nano-dollars used, not the %d it spent, in 20 s", region, used, spent)
}

// regionGate opens a gate of region (eu or us, rebalanced every 50 ms) on
// a Redis of its own and the ledger's PostgreSQL at dsn, with tenant acme
// (key cg-acme) and its daily budget of $0.01.
func regionGate(t *testing.T, dsn, region string) *gate.Gate {
	t.Helper()
	cfg, err := config.Parse([]byte(regionYAML(t.TempDir(), region, redistest.New(t).URL, dsn, "name: daily")))
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

// regionYAML is the configuration of region (eu or us, rebalanced every
// 50 ms) on Redis redis and the ledger's PostgreSQL at dsn, with tenant
// acme (key cg-acme) and a tenant budget of $0.01: budget is its YAML
// flow fields after its amount.
func regionYAML(dir, region, redis, dsn, budget string) string {
	return fmt.Sprintf(`
admin_token: t
data_dir: %q
region: %s
regions: {names: [eu, us], interval: 50ms}
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
budgets:
  - {scope: tenant, amount: "0.01", %s}
`, dir, region, redis, dsn, budget)
}
