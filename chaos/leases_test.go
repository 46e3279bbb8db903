package chaos_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
)

// leaseYAML is the lease policy of the leased drills: a large share, so
// that leases matter to the outcome.
const leaseYAML = "lease: {max_share: 0.2, ttl: 1m}"

// leasedStoreYAML is the store section of the leased drills: Redis with a
// call timeout long enough that a machine loaded by the race detector and
// parallel drills never turns a slow call into a fail-closed 503 (the
// timeouts have drills of their own).
func leasedStoreYAML(redisURL string) string {
	return fmt.Sprintf("store:\n  redis: %q\n  timeout: 5s\n", redisURL)
}

// TestRacersExactLimitsLeased (drill 1, leased) is drill 1 with every
// algorithm but concurrency leased, on Redis: 200 racers at once against
// 50 requests per 24 h.
//
// Bound: admitted == 50 exactly with one replica (its leases are taken
// from what is left, and the last one is what is left), every other racer
// 429.
func TestRacersExactLimitsLeased(t *testing.T) {
	const racers, limit = 200, 50
	leased := []string{"token_bucket", "gcra", "sliding_window", "fixed_window", "sliding_log"}
	up := newUpstream(t, 1)
	var cfg strings.Builder
	cfg.WriteString(leasedStoreYAML(redistest.New(t).URL) + upstreamsYAML(up) + pricesYAML + tenantsYAML(leased...) + "limits:\n")
	for _, a := range leased {
		fmt.Fprintf(&cfg, "  - {name: exact-%s, plans: [%s], dimensions: [tenant], algorithm: %s, unit: requests, rate: %d, period: 24h, on_store_failure: fail_closed, %s}\n",
			a, a, a, limit, leaseYAML)
	}
	p := startCostgate(t, cfg.String())
	for _, algo := range leased {
		t.Run(algo, func(t *testing.T) {
			t.Parallel()
			day := time.Now().UTC().Truncate(24 * time.Hour)
			statuses := race(p, "cg-"+algo, racers)
			if algo == "fixed_window" && !time.Now().UTC().Truncate(24*time.Hour).Equal(day) {
				t.Skip("the fixed window's boundary passed during the drill")
			}
			t.Logf("%s leased: %d racers, limit %d: admitted %d, 429 %d, other %v", algo, racers, limit, statuses[200], statuses[429], statuses)
			if statuses[200] != limit || statuses[429] != racers-limit {
				t.Errorf("%s: admitted %d and refused %d of %d racers, want exactly %d and %d (all statuses %v)",
					algo, statuses[200], statuses[429], racers, limit, racers-limit, statuses)
			}
		})
	}
}

// race sends n racers released at once and counts their statuses (-1 for
// a transport error).
func race(p *process, key string, n int) map[int]int {
	c := newClient(p)
	var (
		start    = make(chan struct{})
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
	)
	for i := range n {
		wg.Go(func() {
			<-start
			r := c.call(context.Background(), key, "/v1/chat/completions", chatBody("gpt-4o-mini", 4, false, fmt.Sprintf("racer %d", i)), nil, 0)
			if r.Err != nil {
				r.Status = -1
			}
			mu.Lock()
			statuses[r.Status]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return statuses
}

// TestLeasedReplicaKilled runs two costgate processes on one Redis against
// a leased fixed window of 100 requests per 24 h (at most 50 leased per
// replica), kills one with SIGKILL while it holds leases, and drains the
// limit from the other.
//
// Bound: the two together admit at most 100 (a dead replica's leases are
// spent in Redis, never admitted twice), and at least 100 less what the
// killed one held unspent, at most its 50.
func TestLeasedReplicaKilled(t *testing.T) {
	const limit, share = 100, 50
	up := newUpstream(t, 1)
	cfg := leasedStoreYAML(redistest.New(t).URL) + upstreamsYAML(up) + pricesYAML + tenantsYAML("hot") +
		"limits:\n  - {name: hot, plans: [hot], dimensions: [tenant], algorithm: fixed_window, unit: requests, rate: 100, period: 24h, lease: {max_share: 0.5, ttl: 1m}}\n"
	a := startCostgate(t, cfg)
	b := startCostgate(t, cfg)
	day := time.Now().UTC().Truncate(24 * time.Hour)
	first := race(a, "cg-hot", 40)
	a.Kill()
	var admitted atomic.Int64
	admitted.Add(int64(first[200]))
	for {
		s := race(b, "cg-hot", 20)
		admitted.Add(int64(s[200]))
		if s[200] == 0 {
			if s[429] != 20 {
				t.Fatalf("the survivor answered %v", s)
			}
			break
		}
	}
	if !time.Now().UTC().Truncate(24 * time.Hour).Equal(day) {
		t.Skip("the fixed window's boundary passed during the drill")
	}
	var view struct {
		Limits []struct {
			Name string `json:"name"`
			Mode string `json:"mode"`
		} `json:"limits"`
		Store map[string]int64 `json:"store"`
	}
	if err := b.admin("/admin/v1/leases", &view); err != nil {
		t.Fatal(err)
	}
	if len(view.Limits) != 1 || view.Limits[0].Mode != "leased" {
		t.Fatalf("the survivor's leases: %+v", view)
	}
	got := admitted.Load()
	t.Logf("killed replica admitted %d of 40 (statuses %v); both together %d of %d", first[200], first, got, limit)
	if got > limit || got < limit-share {
		t.Fatalf("admitted %d in all, want between %d and %d", got, limit-share, limit)
	}
}

// TestBudgetUntil402Leased (drill 3, leased) is drill 3 with the budget
// leased (at most a tenth of it per replica, for 2 s), on Redis.
//
// Bound: as drill 3's: spend at most budget + C x O; spend, ledger and
// upstream bill agree.
func TestBudgetUntil402Leased(t *testing.T) {
	const clients = 8
	const budget = int64(20_000_000)
	up := newUpstream(t, 3)
	p := startCostgate(t, leasedStoreYAML(redistest.New(t).URL)+upstreamsYAML(up)+pricesYAML+"  output_reserve: 50\n"+tenantsYAML("spender")+`budgets:
  - {name: spender-daily, plans: [spender], scope: tenant, period: day, amount: "0.02", lease: {max_share: 0.1, ttl: 2s}}
`)
	statuses := budgetRun(t, p, "cg-spender", clients, 2000, func(n int) string {
		return chatBody("gpt-4o-mini", 100, false, prompt(n, 150))
	})
	up.waitDone(t, 30*time.Second)
	bills, _ := up.snapshot()
	es := p.finalLedger(t, "spender", statuses[200])
	var sum, billed, over int64
	for _, e := range es {
		sum += e.charge()
		over = max(over, e.ActualCost-e.EstimatedCost)
		if b, ok := bills[e.RequestID]; ok {
			billed += billCost(b)
		}
	}
	spent, err := p.spend("spender")
	if err != nil {
		t.Fatal(err)
	}
	bound := budget + clients*max(over, 0)
	t.Logf("leased budget %d nUSD, %d clients: statuses %v; spend %d nUSD (%.3f of the budget); bound %d", budget, clients, statuses, spent, float64(spent)/float64(budget), bound)
	if spent > bound {
		t.Errorf("spend %d nUSD exceeds the bound %d", spent, bound)
	}
	if statuses[402] == 0 {
		t.Errorf("no request was refused with 402")
	}
	if spent != sum || sum != billed {
		t.Errorf("spend %d, ledger sum %d and upstream billed %d differ", spent, sum, billed)
	}
}
