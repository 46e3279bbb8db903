package gate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/weighted"
)

// TestRegionsInFlightAcrossRebalances: three regions whose demand moves
// from one to another, so that their caps are lowered and raised again
// and again, while requests read a cap and debit it some time later, the
// rebalances running in between. The bound stated in the README holds
// for every request that lands before its region's next rebalance but
// one (here enforced: a region's rebalancer waits, after each rebalance,
// for the requests that read a cap before it): global spend is at most
// the budget, whatever the interleaving.
func TestRegionsInFlightAcrossRebalances(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	const key = "{acme}:tenant=acme"
	const budget = 30000
	lim := weighted.Limit{Name: "daily", Algorithm: weighted.FixedWindow, Rate: budget, Period: 24 * time.Hour}
	names := []string{"eu", "us", "ap"}
	type region struct {
		rg      *gate.Regions
		st      weighted.Store
		landing sync.RWMutex // held for reading from a cap's read to its debit's end
		spent   atomic.Int64
	}
	var regions []*region
	for _, n := range names {
		st := weighted.NewMemory(weighted.MemoryConfig{})
		// A rebalance's peeks are slow, so that requests land between a
		// peek and the row's write.
		rg := newRegion(t, dsn, n, slowPeeks{st}, time.Now, names...)
		regions = append(regions, &region{rg: rg, st: st})
	}
	stop := make(chan struct{})
	var phase atomic.Int64 // which region is busy
	var seq atomic.Int64
	var wg sync.WaitGroup
	for ri, r := range regions {
		for w := range 3 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(ri), uint64(w)))
				for {
					select {
					case <-stop:
						return
					default:
					}
					if phase.Load()%int64(len(regions)) != int64(ri) && rng.IntN(8) != 0 {
						time.Sleep(200 * time.Microsecond) // an idle region's trickle
						continue
					}
					cost := 1 + rng.Int64N(5)
					r.landing.RLock()
					l := r.rg.LimitContext(ctx, lim, key)
					if rng.IntN(2) == 0 {
						time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond) // the debit is slow
					}
					res, err := r.st.Debit(ctx, fmt.Sprint("q", seq.Add(1)), []weighted.Item{{Limit: l, Key: key, Cost: cost}})
					if ce := (*weighted.CostError)(nil); errors.As(err, &ce) {
						// A cap not read yet, or 0, is a limit of 1: the
						// gate refuses a larger cost (402), as here.
						res, err = weighted.Result{}, nil
					}
					if err != nil {
						r.landing.RUnlock()
						t.Error(err)
						return
					}
					if res.Allowed {
						r.spent.Add(cost)
					} else {
						r.rg.Refused(lim, key, cost)
					}
					r.landing.RUnlock()
				}
			})
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := r.rg.Rebalance(ctx); err != nil {
					t.Error(err)
					return
				}
				// The requests that read a cap before this rebalance land
				// before the next one.
				r.landing.Lock()
				r.landing.Unlock()
				time.Sleep(time.Millisecond)
			}
		})
	}
	spent := func() (n int64) {
		for _, r := range regions {
			n += r.spent.Load()
		}
		return n
	}
	// Twelve phases of 100 ms, and more (10 s in all at most) while the
	// regions have spent less than half the budget: a loaded machine
	// makes slow progress.
	for i := 0; i < 12 || i < 100 && spent() < budget/2; i++ {
		time.Sleep(100 * time.Millisecond)
		phase.Add(1)
	}
	close(stop)
	wg.Wait()
	var global int64
	for i, r := range regions {
		t.Logf("%s spent %d", names[i], r.spent.Load())
		global += r.spent.Load()
	}
	t.Logf("global %d of %d", global, budget)
	if global > budget {
		t.Fatalf("global spend %d, above the budget %d (no request overran its estimate)", global, budget)
	}
	if global < budget/2 {
		t.Fatalf("global spend %d of %d: the regions barely spent, the test shows nothing", global, budget)
	}
}

// slowPeeks is a store whose Peeks take a millisecond more.
type slowPeeks struct{ weighted.Store }

func (s slowPeeks) Peek(ctx context.Context, items []weighted.Item) (weighted.Result, error) {
	res, err := s.Store.Peek(ctx, items)
	time.Sleep(time.Millisecond)
	return res, err
}
