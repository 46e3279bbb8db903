package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestLeasedKeysShareByTag: one tenant (hash tag) with more keys than its
// share of MaxKeys does not take every state: past its sixteenth its keys
// are debited strictly, and another tenant's key still gets a state and
// its leases. A tenant's count goes with its states (Reset, the sweeper),
// so it takes new keys again. Before, the table was one pool: a tenant
// sending many distinct keys (an RLS descriptor value is any string) left
// every other tenant's new keys strict.
func TestLeasedKeysShareByTag(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	mem := NewMemory(MemoryConfig{Now: clk.Now})
	l := NewLeased(mem, LeasedConfig{Now: clk.Now, Sweep: time.Hour, MaxKeys: 64})
	l.inline = true
	defer l.Close(ctx)
	lim := Limit{Name: "r", Algorithm: FixedWindow, Rate: 1_000_000, Period: time.Hour, Lease: Lease{Max: 1000, TTL: time.Minute}}
	item := func(tag string, i int) Item {
		return Item{Limit: lim, Key: fmt.Sprintf("{%s}:user=%d", tag, i), Cost: 1}
	}
	var mallory []Item
	for i := range 100 {
		it := item("mallory", i)
		mallory = append(mallory, it)
		if res, err := l.Debit(ctx, fmt.Sprint("m", i), []Item{it}); err != nil || !res.Allowed {
			t.Fatalf("mallory's debit %d: %+v %v", i, res, err)
		}
	}
	count := func(tag string) (n int) {
		l.mu.RLock()
		defer l.mu.RUnlock()
		for k := range l.keys {
			if HashTag(k.key) == tag {
				n++
			}
		}
		return n
	}
	if n := count("mallory"); n != 4 {
		t.Fatalf("mallory's keys hold %d states of 64; want its share, 4", n)
	}
	// Another tenant's hot key still leases: after a few debits it is
	// decided in process.
	acme := item("acme", 0)
	for i := range 50 {
		clk.Advance(time.Millisecond)
		if res, err := l.Debit(ctx, fmt.Sprint("a", i), []Item{acme}); err != nil || !res.Allowed {
			t.Fatalf("acme's debit %d: %+v %v", i, res, err)
		}
	}
	if l.known(&acme) == nil || l.Stats().Acquired == 0 {
		t.Fatalf("acme's key has no state or no lease: %+v", l.Stats())
	}
	// Mallory's count goes with its states.
	if err := l.Reset(ctx, mallory[:4]); err != nil {
		t.Fatal(err)
	}
	if n := count("mallory"); n != 0 || l.tags["mallory"] != 0 {
		t.Fatalf("after a reset of its keys mallory holds %d states, counted %d", n, l.tags["mallory"])
	}
	if res, err := l.Debit(ctx, "m-again", []Item{mallory[50]}); err != nil || !res.Allowed || l.known(&mallory[50]) == nil {
		t.Fatalf("mallory's key after the reset: %+v %v, state %v", res, err, l.known(&mallory[50]))
	}
}
