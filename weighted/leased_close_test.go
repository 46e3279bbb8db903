package weighted

import (
	"context"
	"testing"
	"time"
)

// blockingStore is a LeaseStore whose lease calls wait for release once
// entered is signalled.
type blockingStore struct {
	LeaseStore
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Lease(ctx context.Context, it Item, c LeaseCall) (ItemState, error) {
	if it.Cost > 0 {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.LeaseStore.Lease(ctx, it, c)
}

// TestLeasedCloseDuringLease: Close runs while a request's lease call is
// on its way (the request's own goroutine takes it: a cold key whose
// leases hold part of the cost, or a hot key's first lease). Close "stops
// the sweeper and returns every lease held"; the store "stays usable,
// strictly: a Debit after Close takes no lease". After both return, the
// replica must hold nothing, and the store must count only what was
// admitted.
func TestLeasedCloseDuringLease(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	mem := NewMemory(MemoryConfig{Now: clk.Now})
	bs := &blockingStore{LeaseStore: mem, entered: make(chan struct{}), release: make(chan struct{})}
	l := NewLeased(bs, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
	l.inline = true
	lim := Limit{Name: "usd", Algorithm: FixedWindow, Rate: 1000, Period: 24 * time.Hour,
		Lease: Lease{Max: 500, TTL: time.Hour}}
	it := Item{Limit: lim, Key: "k", Cost: 10}
	l.state(&it).rate = 1e9 // hot: the first request takes a lease
	done := make(chan error, 1)
	go func() {
		res, err := l.Debit(ctx, "r", []Item{it})
		if err == nil && !res.Allowed {
			t.Errorf("refused: %+v", res)
		}
		done <- err
	}()
	<-bs.entered
	// Close returns while the lease call is on its way: it does not wait
	// for the request's own call.
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	close(bs.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	left, err := mem.Peek(ctx, []Item{it})
	if err != nil {
		t.Fatal(err)
	}
	counted := lim.Rate - left.Items[0].Remaining
	t.Logf("after Close: the replica holds %d unspent; the store counts %d for 10 admitted", l.Unspent(it), counted)
	if held := l.Unspent(it); held != 0 || counted != it.Cost {
		t.Fatalf("after Close the replica holds %d unspent of a lease it never returns; the store counts %d for %d admitted (until the lease's TTL, %s)",
			held, counted, it.Cost, lim.Lease.TTL)
	}
}
