package chaos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
)

var algorithms = []string{"token_bucket", "gcra", "sliding_window", "fixed_window", "sliding_log", "concurrency"}

// storeYAML is the store section for the in-memory store ("") or a Redis
// URL, with the default timeouts: a loaded machine must not look like an
// outage (a busy queue sheds, it does not fail open).
func storeYAML(redisURL string) string {
	return fmt.Sprintf("store:\n  redis: %q\n", redisURL)
}

// patientStoreYAML is the store section of the drills that count what is
// admitted, not how fast: Redis calls get 5 s, so that a loaded machine is
// no outage (a fail-closed limit would answer 503 after the default
// 100 ms).
func patientStoreYAML(redisURL string) string {
	return fmt.Sprintf("store:\n  redis: %q\n  timeout: 5s\n", redisURL)
}

// stores runs f as a parallel subtest on the in-memory store and on a
// private Redis.
func stores(t *testing.T, f func(t *testing.T, redisURL string)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f(t, "")
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		f(t, redistest.New(t).URL)
	})
}

// TestRacersExactLimits (drill 1) sends 200 concurrent racers, all released
// at once, against a limit of 50 requests per 24 h on every algorithm, on
// both stores, with no fault injected.
//
// Bound: admitted == 50 exactly, and every other racer gets 429 (none gets
// 5xx). For concurrency the upstream holds every admitted request until all
// 200 have an answer or are in flight, so that "admitted" is "in flight at
// once". A fixed window that crosses its boundary (UTC midnight) during the
// drill is skipped, as the bound does not apply.
func TestRacersExactLimits(t *testing.T) {
	const racers, limit = 200, 50
	stores(t, func(t *testing.T, redisURL string) {
		up := newUpstream(t, 1)
		release := make(chan struct{})
		up.hold = func(r *http.Request) {
			if r.Header.Get("X-Chaos-Group") == "hold" {
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}
		}
		var cfg strings.Builder
		cfg.WriteString(patientStoreYAML(redisURL) + upstreamsYAML(up) + pricesYAML + tenantsYAML(algorithms...) + "limits:\n")
		for _, a := range algorithms {
			period := "24h"
			if a == "concurrency" {
				period = "1m" // the lease, renewed while a request runs
			}
			fmt.Fprintf(&cfg, "  - {name: exact-%s, plans: [%s], dimensions: [tenant], algorithm: %s, unit: requests, rate: %d, period: %s, on_store_failure: fail_closed}\n",
				a, a, a, limit, period)
		}
		p := startCostgate(t, cfg.String())
		for _, algo := range algorithms {
			t.Run(algo, func(t *testing.T) {
				t.Parallel()
				day := clearOfMidnight(t)
				c := newClient(p)
				header := map[string]string{}
				if algo == "concurrency" {
					header["X-Chaos-Group"] = "hold"
				}
				var (
					start    = make(chan struct{})
					wg       sync.WaitGroup
					mu       sync.Mutex
					statuses = map[int]int{}
					refusals = map[string]int{} // by status and error code
					answered atomic.Int64
				)
				for i := range racers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						r := c.call(context.Background(), "cg-"+algo, "/v1/chat/completions",
							chatBody("gpt-4o-mini", 4, false, fmt.Sprintf("racer %d", i)), header, 0)
						if r.Err != nil {
							r.Status = -1
						}
						answered.Add(1)
						mu.Lock()
						statuses[r.Status]++
						if r.Status != 200 {
							refusals[refusalCode(r)]++
						}
						mu.Unlock()
					}()
				}
				close(start)
				if algo == "concurrency" {
					g := up.group("hold")
					waitFor(t, 90*time.Second, "every racer answered or held at the upstream", func() bool {
						return answered.Load()+g.now.Load() == racers
					})
					t.Logf("concurrency: %d in flight at the upstream when all others were answered (most at once: %d)", g.now.Load(), g.max.Load())
					close(release)
				}
				wg.Wait()
				if algo == "fixed_window" {
					sameDay(t, day)
				}
				t.Logf("%s: %d racers, limit %d: admitted %d, 429 %d, other %v", algo, racers, limit, statuses[200], statuses[429], statuses)
				if statuses[200] != limit || statuses[429] != racers-limit {
					t.Errorf("%s: admitted %d and refused %d of %d racers, want exactly %d admitted and %d refused with 429 (all statuses %v, refusals %v)",
						algo, statuses[200], statuses[429], racers, limit, racers-limit, statuses, refusals)
				}
			})
		}
	})
}

// TestConcurrencySlowUpstream (drill 2) runs 16 clients in a loop against
// a concurrency limit of 4 whose lease (period 1 s) is shorter than the
// upstream's answer (1.5 s), so every admitted request must renew its
// lease to keep its slot, on both stores.
//
// Bound: at most 4 requests in flight at the upstream at any moment
// (measured at the upstream), and at least one moment with 4 (the limit was
// reached, so the bound was tested).
func TestConcurrencySlowUpstream(t *testing.T) {
	const limit, clients = 4, 16
	run := 4 * time.Second
	if long() {
		run = 30 * time.Second
	}
	stores(t, func(t *testing.T, redisURL string) {
		up := newUpstream(t, 2)
		up.hold = func(r *http.Request) {
			tm := time.NewTimer(1500 * time.Millisecond)
			defer tm.Stop()
			select {
			case <-tm.C:
			case <-r.Context().Done():
			}
		}
		p := startCostgate(t, storeYAML(redisURL)+upstreamsYAML(up)+pricesYAML+tenantsYAML("slow")+fmt.Sprintf(`limits:
  - {name: slow-concurrency, dimensions: [tenant], algorithm: concurrency, unit: requests, rate: %d, period: 1s, on_store_failure: fail_closed}
`, limit))
		c := newClient(p)
		ctx, cancel := context.WithTimeout(context.Background(), run)
		defer cancel()
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			statuses = map[int]int{}
		)
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ctx.Err() == nil; n++ {
					r := c.call(context.Background(), "cg-slow", "/v1/chat/completions",
						chatBody("gpt-4o-mini", 4, false, fmt.Sprintf("client %d call %d", i, n)), nil, 0)
					mu.Lock()
					statuses[r.Status]++
					mu.Unlock()
					if r.Status != 200 {
						// Pace the retries of a refused client (load
						// shaping, not a wait for an event).
						select {
						case <-ctx.Done():
						case <-time.After(20 * time.Millisecond):
						}
					}
				}
			}()
		}
		wg.Wait()
		most := up.group("").max.Load()
		t.Logf("concurrency %d, lease 1s, upstream 1.5s, %d clients for %v: most in flight at the upstream %d; statuses %v",
			limit, clients, run, most, statuses)
		if most > limit {
			t.Errorf("%d requests were in flight at the upstream at once, limit %d", most, limit)
		}
		if most < limit {
			t.Errorf("never more than %d in flight: the limit of %d was not reached, so the drill tested nothing", most, limit)
		}
	})
}

// maxDrill is how long a drill over a daily fixed window may take.
const maxDrill = 3 * time.Minute

// clearOfMidnight returns the UTC day a drill over a daily fixed window
// runs in, first waiting for the next day when less than maxDrill of this
// one is left, so that the window cannot end during the drill.
func clearOfMidnight(t *testing.T) time.Time {
	t.Helper()
	now := time.Now().UTC()
	day := now.Truncate(24 * time.Hour)
	if left := day.Add(24 * time.Hour).Sub(now); left < maxDrill {
		t.Logf("waiting %v for UTC midnight, so that the daily window holds the whole drill", left)
		time.Sleep(left + time.Second)
		day = day.Add(24 * time.Hour)
	}
	return day
}

// sameDay fails the test when the drill outlasted the day it began in:
// it took longer than maxDrill.
func sameDay(t *testing.T, day time.Time) {
	t.Helper()
	if now := time.Now().UTC(); !now.Truncate(24 * time.Hour).Equal(day) {
		t.Fatalf("the drill ran past UTC midnight (more than %v): the daily window it measures ended", maxDrill)
	}
}

// refusalCode is a refused answer's status and its error's code, as
// "429 rate_limit_exceeded".
func refusalCode(r result) string {
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.Body, &body)
	return fmt.Sprintf("%d %s", r.Status, body.Error.Code)
}
