package weighted

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLeasedConcurrentEverything runs Debit, Settle, Cancel, Peek, Stats,
// Leases, Unspent, sweeps, limit changes and finally Close on
// replicas sharing one Redis from many goroutines, for the race detector,
// and checks a fixed window that does not refill admits no more than its
// capacity (what is admitted, less what is refunded). The TTLs are long
// enough that every lease's end reaches the store within half of one
// under the race detector: a report later than that counts its replica as
// dead until it arrives, and adds Lease.Max to the bound (see Leased).
func TestLeasedConcurrentEverything(t *testing.T) {
	raceEverything(t, [2]time.Duration{2 * time.Second, 1500 * time.Millisecond}, 50, 600*time.Millisecond)
}

// TestLeasedTinyTTLsFlapping is TestLeasedConcurrentEverything with leases
// of 150 and 200 ms and a reload every 10 requests of each goroutine, for
// 1.5 s: the sweeper, every 5 ms, forgets idle states ten TTLs old within
// the run, while the reloads keep making new ones. Before, a state just
// made (by a reload's first request) was forgotten before the request
// took its lease into it: nobody spent or reported that lease, and the
// store, at its expiry, gave back as unspent the units requests had
// spent from it: 3,015 to 3,025 admitted net of refunds in a window of
// 3,000, four runs of four.
func TestLeasedTinyTTLsFlapping(t *testing.T) {
	raceEverything(t, [2]time.Duration{200 * time.Millisecond, 150 * time.Millisecond}, 10, 1500*time.Millisecond)
}

// raceEverything is TestLeasedConcurrentEverything's run: leases of the
// two TTLs (a reload switches between them every reloadEvery requests of
// each goroutine), for run.
func raceEverything(t *testing.T, ttls [2]time.Duration, reloadEvery int, run time.Duration) {
	t.Helper()
	c := testRedis(t)
	prefix := fmt.Sprintf("race%d:", prefixSeq.Add(1))
	lims := []Limit{
		{Name: "fw", Algorithm: FixedWindow, Rate: 3000, Period: time.Hour, Lease: Lease{Max: 100, TTL: ttls[0]}},
		{Name: "fw", Algorithm: FixedWindow, Rate: 3000, Period: time.Hour, Lease: Lease{Max: 50, TTL: ttls[1]}},
	}
	var reps []*Leased
	for range 3 {
		reps = append(reps, NewLeased(NewRedis(c, patient(RedisConfig{Prefix: prefix})), LeasedConfig{Sweep: 5 * time.Millisecond}))
	}
	var admitted, refunded, seq atomic.Int64
	// The fixed window is an hour from each hour's start: a run across
	// one admits up to a capacity in each window it spans.
	first := time.Now().Truncate(lims[0].Period)
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	for r, l := range reps {
		for g := range 6 {
			wg.Go(func() {
				ctx := context.Background()
				for n := 0; time.Now().Before(stop); n++ {
					lim := lims[(n/reloadEvery)%2] // a reload now and then
					it := Item{Limit: lim, Key: "k", Cost: 1 + int64(n%5)}
					id := fmt.Sprint("c", r, "-", seq.Add(1))
					res, err := l.Debit(ctx, id, []Item{it})
					if err != nil {
						t.Error(err)
						return
					}
					if res.Allowed {
						admitted.Add(it.Cost)
						switch n % 3 {
						case 0:
							if err := l.Settle(ctx, id, []Item{it}, []int64{it.Cost - 1}); err != nil {
								t.Error(err)
							}
							refunded.Add(1)
						case 1:
							// Settled twice, on another replica: never refunds twice.
							if err := reps[(r+1)%3].Settle(ctx, id, []Item{it}, []int64{it.Cost}); err != nil {
								t.Error(err)
							}
							if err := l.Settle(ctx, id, []Item{it}, []int64{it.Cost}); err != nil {
								t.Error(err)
							}
						}
					}
					switch g {
					case 0:
						_, _ = l.Peek(ctx, []Item{it})
					case 1:
						_ = l.Stats()
						_ = l.Leases()
						_ = l.Unspent(it)
					case 2:
						l.sweepOnce(ctx)
					}
				}
			})
		}
	}
	wg.Wait()
	for _, l := range reps {
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	windows := int64(time.Since(first)/lims[0].Period) + 1
	net := admitted.Load() - refunded.Load()
	t.Logf("admitted %d, refunded %d, in %d windows", admitted.Load(), refunded.Load(), windows)
	if net > windows*lims[0].Rate {
		t.Fatalf("admitted %d net of refunds in %d windows of %d", net, windows, lims[0].Rate)
	}
}
