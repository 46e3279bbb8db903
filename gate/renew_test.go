package gate

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/weighted"
)

// TestRenewEvery checks how often a reservation is renewed: half its
// shortest concurrency Period, between 100 ms and 1 s, and never without
// a concurrency item.
func TestRenewEvery(t *testing.T) {
	conc := func(p time.Duration, cost int64) weighted.Item {
		return weighted.Item{Limit: weighted.Limit{Name: "c", Algorithm: weighted.Concurrency, Rate: 1, Period: p}, Cost: cost}
	}
	tb := weighted.Item{Limit: weighted.Limit{Name: "tb", Rate: 1, Period: time.Millisecond}, Cost: 1}
	for _, tc := range []struct {
		name  string
		items []weighted.Item
		want  time.Duration
	}{
		{"none", []weighted.Item{tb}, 0},
		{"zero cost", []weighted.Item{conc(time.Second, 0)}, 0},
		{"half", []weighted.Item{tb, conc(time.Second, 1)}, 500 * time.Millisecond},
		{"shortest", []weighted.Item{conc(time.Second, 1), conc(600*time.Millisecond, 1)}, 300 * time.Millisecond},
		{"at most 1s", []weighted.Item{conc(time.Minute, 1)}, time.Second},
		{"at least 100ms", []weighted.Item{conc(50*time.Millisecond, 1)}, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := renewEvery(tc.items)
			if got != tc.want || ok != (tc.want > 0) {
				t.Errorf("renewEvery = %s, %v; want %s", got, ok, tc.want)
			}
		})
	}
}

// renewCounter is a Store that counts renewals.
type renewCounter struct {
	store
	n atomic.Int64
}

func (c *renewCounter) Renew(ctx context.Context, id string, items []weighted.Item) error {
	c.n.Add(1)
	return nil
}

// TestRenewerStops checks that the renewer renews a registered request
// until it is removed, and that close stops it, also when called twice,
// and ignores what is added after.
func TestRenewerStops(t *testing.T) {
	store := &renewCounter{}
	g := &Gate{log: slog.New(slog.DiscardHandler)}
	g.store = g.fresh(store, 1)
	r := newRenewer(g)
	g.renewer = r
	r.start()
	x := &Reservation{g: g, req: Request{ID: "a"}, resID: "a", items: []weighted.Item{{Limit: weighted.Limit{Name: "c", Algorithm: weighted.Concurrency, Rate: 1, Period: 200 * time.Millisecond}, Cost: 1}}}
	r.add(x)
	for deadline := time.Now().Add(10 * time.Second); store.n.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in 10 s", store.n.Load())
		}
	}
	r.remove(x)
	r.close()
	r.close()
	r.add(x)
	r.mu.Lock()
	n := len(r.leases)
	r.mu.Unlock()
	if n != 0 {
		t.Errorf("%d leases registered after close", n)
	}
}
