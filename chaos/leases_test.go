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
	cfg.WriteString(patientStoreYAML(redistest.New(t).URL) + upstreamsYAML(up) + pricesYAML + tenantsYAML(leased...) + "limits:\n")
	for _, a := range leased {
		fmt.Fprintf(&cfg, "  - {name: exact-%s, plans: [%s], dimensions: [tenant], algorithm: %s, unit: requests, rate: %d, period: 24h, on_store_failure: fail_closed, %s}\n",
			a, a, a, limit, leaseYAML)
	}
	p := startCostgate(t, cfg.String())
	for _, algo := range leased {
		t.Run(algo, func(t *testing.T) {
			t.Parallel()
			day := clearOfMidnight(t)
			statuses := race(p, "cg-"+algo, racers)
			if algo == "fixed_window" {
				sameDay(t, day)
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
// replica, for 2 s), kills one with SIGKILL while it holds leases, and
// drains the limit from the other; then, once the killed one's leases are
// past their TTL, drains again what Redis gave back.
//
// Bound: before the TTL, the two together admit at most 100, and at least
// 100 less what the killed one held unspent, at most its 50. After it,
// Redis gives back what the killed one had not reported spent, so the two
// together admit at least 100 and at most 100 plus what it spent
// unreported, at most its 50.
func TestLeasedReplicaKilled(t *testing.T) {
	const limit, share = 100, 50
	const ttl = 2 * time.Second
	up := newUpstream(t, 1)
	cfg := patientStoreYAML(redistest.New(t).URL) + upstreamsYAML(up) + pricesYAML + tenantsYAML("hot") +
		"limits:\n  - {name: hot, plans: [hot], dimensions: [tenant], algorithm: fixed_window, unit: requests, rate: 100, period: 24h, lease: {max_share: 0.5, ttl: 2s}}\n"
	a := startCostgate(t, cfg)
	b := startCostgate(t, cfg)
	day := clearOfMidnight(t)
	first := race(a, "cg-hot", 40)
	killed := time.Now()
	a.Kill()
	var admitted atomic.Int64
	admitted.Add(int64(first[200]))
	var drains []map[int]int // the survivor's answers, round by round
	drain := func() {
		for {
			s := race(b, "cg-hot", 20)
			drains = append(drains, s)
			admitted.Add(int64(s[200]))
			if s[200] == 0 {
				if s[429] != 20 {
					t.Fatalf("the survivor answered %v", s)
				}
				return
			}
		}
	}
	drain()
	before := admitted.Load()
	if time.Since(killed) < ttl && (before > limit || before < limit-share) {
		t.Fatalf("before the TTL: admitted %d in all, want between %d and %d (the killed replica answered %v, the survivor %v; %v after the kill)", before, limit-share, limit, first, drains, time.Since(killed))
	}
	// The survivor asks Redis again at most a TTL after a refusal; Redis
	// gives the killed one's leases back at their TTL.
	deadline := time.Now().Add(4 * ttl)
	for admitted.Load() < limit {
		if time.Now().After(deadline) {
			t.Fatalf("%d admitted %v after the kill, less than the limit %d: the killed replica's leases did not come back", admitted.Load(), time.Since(killed), limit)
		}
		s := race(b, "cg-hot", 1)
		admitted.Add(int64(s[200]))
		if s[200] == 0 {
			time.Sleep(100 * time.Millisecond) // real processes on the real clock
			continue
		}
		drain()
	}
	sameDay(t, day)
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
	t.Logf("killed replica admitted %d of 40 (statuses %v); %d admitted before its leases' TTL, %d in all of %d, %v after the kill",
		first[200], first, before, got, limit, time.Since(killed))
	if got < limit || got > limit+share {
		t.Fatalf("admitted %d in all, want between %d and %d", got, limit, limit+share)
	}
}

// TestBudgetUntil402Leased (drill 3, leased) is drill 3 with the budget
// leased (at most a tenth of it per replica, for 2 s), on Redis.
//
// Bound: as drill 3's: spend at most budget + C x O; spend, ledger and
// upstream bill agree.
func TestBudgetUntil402Leased(t *testing.T) {
	budgetUntil402(t, patientStoreYAML(redistest.New(t).URL), "{max_share: 0.1, ttl: 2s}")
}
