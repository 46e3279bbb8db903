package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestMemoryForgetsWhatExpired: the in-memory store's entries made
// faster than the small sweeps find them (here a reservation's record
// per request, and a counter per request's new key, which a tenant that
// sends a new attribute with each request makes) are dropped once expired
// for the sweep's minute of grace: the store holds about twice what is
// alive or within the grace, not everything ever written. 60,000
// requests 10 ms apart on keys of a 1 s window, records kept 1 s after
// settlement, leave at most 25,000 entries (about 12,200 are alive or
// within the grace, records and counters; twice that); the small sweeps
// alone left 105,000.
func TestMemoryForgetsWhatExpired(t *testing.T) {
	clk := newClock()
	m := NewMemory(MemoryConfig{Now: clk.Now, SettleTTL: time.Second})
	ctx := context.Background()
	l := Limit{Name: "per-job", Algorithm: FixedWindow, Rate: 100, Period: time.Second}
	for i := range 60_000 {
		id := fmt.Sprint("req-", i)
		items := []Item{{Limit: l, Key: fmt.Sprint("{acme}:attr.job=", i), Cost: 1}}
		if res, err := m.Debit(ctx, id, items); err != nil || !res.Allowed {
			t.Fatalf("debit %d: %+v %v", i, res, err)
		}
		if err := m.Settle(ctx, id, items, []int64{1}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(10 * time.Millisecond)
	}
	n := 0
	for i := range m.shards {
		n += len(m.shards[i].m)
	}
	if n > 25_000 {
		t.Errorf("%d entries held after 60,000 requests, 10 minutes, of which about 12,200 are alive or within the grace", n)
	}
	t.Logf("%d entries", n)
}
