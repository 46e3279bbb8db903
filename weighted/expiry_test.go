package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestEveryKeyExpires checks that every key the Redis store writes has a
// TTL no longer than its state lasts plus the documented slack.
func TestEveryKeyExpires(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	r := newRedisStore(c, nil) // the server's clock and real TTLs
	r.settleTTL = 5000
	var items []Item
	for a := Algorithm(0); a < numAlgorithms; a++ {
		items = append(items, Item{Limit: Limit{Name: "l", Algorithm: a, Rate: 10, Period: 2 * time.Second}, Key: "{k}", Cost: 4})
	}
	if res, err := r.Debit(ctx, "a", items); err != nil || !res.Allowed {
		t.Fatalf("debit: %+v %v", res, err)
	}
	if err := r.Settle(ctx, "b", items[:1], []int64{1}); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, r.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(items)+2 { // the limits, a's record, b's marker
		t.Fatalf("keys %v", keys)
	}
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// Every state here is empty within two periods (a sliding window's
		// count lasts until the end of the next window); meters and windows
		// may keep their key up to min(period, 60s) longer; b's marker
		// lasts SettleTTL.
		if limit := 6 * time.Second; ttl <= 0 || ttl > limit {
			t.Errorf("key %s: TTL %s, want within (0, %s]", k, ttl, limit)
		}
	}
}

// TestMemorySweep checks that the in-memory sweep drops the keys expired
// for sweepGrace and keeps the others.
func TestMemorySweep(t *testing.T) {
	clk := newClock()
	m := NewMemory(MemoryConfig{Now: clk.Now})
	ctx := context.Background()
	l := Limit{Name: "l", Rate: 10, Period: time.Second}
	for i := range 500 {
		if _, err := m.Debit(ctx, "r", []Item{{Limit: l, Key: fmt.Sprint("old-", i), Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Second + time.Duration(sweepGrace)*time.Microsecond)
	for i := range 100 {
		if _, err := m.Debit(ctx, "r", []Item{{Limit: l, Key: fmt.Sprint("new-", i), Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	now := clk.Now().UnixMicro()
	for i := range m.shards {
		sh := &m.shards[i]
		for range len(sh.m)/sweepScan + 1 {
			sh.sweep(now)
		}
	}
	n := 0
	for i := range m.shards {
		for k := range m.shards[i].m {
			if k.key[:4] != "new-" {
				t.Fatalf("expired key %q survived the sweep", k.key)
			}
			n++
		}
	}
	if n != 100 {
		t.Fatalf("%d keys after the sweep, want the 100 live ones", n)
	}
}
