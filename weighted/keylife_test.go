package weighted

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestKeyLifeBoundsEveryKey: no key of a limit outlives Limit.KeyLife
// after a debit of its whole capacity and a settlement that charges what
// a settlement may (a token bucket's debt of two capacities), in Redis
// (each key's TTL, by the server's clock) and in memory (each entry's
// expiry): a caller that counts the keys it makes may forget one then.
func TestKeyLifeBoundsEveryKey(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, l := range []Limit{
		{Name: "tb", Algorithm: TokenBucket, Rate: 10, Period: time.Minute, Burst: 30},
		{Name: "tb-second", Algorithm: TokenBucket, Rate: 20, Period: time.Second},
		{Name: "gcra", Algorithm: GCRA, Rate: 3, Period: time.Hour, Burst: 5},
		{Name: "fw", Algorithm: FixedWindow, Rate: 10, Period: 24 * time.Hour},
		{Name: "month", Algorithm: FixedWindow, Rate: 10, Calendar: Month},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 10, Period: time.Hour},
		{Name: "log", Algorithm: SlidingLog, Rate: 10, Period: time.Hour},
		{Name: "conc", Algorithm: Concurrency, Rate: 10, Period: time.Minute},
	} {
		t.Run(l.Name, func(t *testing.T) {
			life := l.KeyLife()
			items := []Item{{Limit: l, Key: "{acme}:attr.job=x", Cost: l.Capacity()}}
			actual := []int64{2 * l.Capacity()}
			if l.Algorithm == Concurrency {
				actual = nil
			}
			rs := newRedisStore(c, nil)
			if res, err := rs.Debit(ctx, "req-1", items); err != nil || !res.Allowed {
				t.Fatalf("redis debit: %+v %v", res, err)
			}
			if actual != nil {
				if err := rs.Settle(ctx, "req-1", items, actual); err != nil {
					t.Fatal(err)
				}
			}
			keys, err := c.Keys(ctx, rs.prefix+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, k := range keys {
				if strings.HasPrefix(k, rs.prefix+"r:") {
					continue // a reservation's record: one per request, not per key
				}
				n++
				ttl, err := c.PTTL(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ttl < 0 || ttl > life {
					t.Errorf("redis key %s: TTL %s, KeyLife %s", k, ttl, life)
				}
			}
			if n == 0 {
				t.Fatalf("no key of the limit among %q", keys)
			}
			clk := newClock()
			m := NewMemory(MemoryConfig{Now: clk.Now})
			if res, err := m.Debit(ctx, "req-1", items); err != nil || !res.Allowed {
				t.Fatalf("memory debit: %+v %v", res, err)
			}
			if actual != nil {
				if err := m.Settle(ctx, "req-1", items, actual); err != nil {
					t.Fatal(err)
				}
			}
			now := clk.Now().UnixMicro()
			for i := range m.shards {
				for k, e := range m.shards[i].m {
					if k.algo == recordAlgo {
						continue
					}
					if d := time.Duration(e.expires-now) * time.Microsecond; d > life {
						t.Errorf("memory key %+v expires in %s, KeyLife %s", k, d, life)
					}
				}
			}
		})
	}
}
