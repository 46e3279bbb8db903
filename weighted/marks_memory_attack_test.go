package weighted

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestMarksAtkLongLogMemoryCost: on the memory store, one tenant's
// sliding log (or concurrency limit) of many marks must not make each of
// its calls read them all. Its keys share a shard's lock with other
// tenants' keys, and a call holds that lock while it works: summing every
// mark on each call, and scanning every mark to find a member on each
// debit and settlement, a debit on a log of 100,000 marks held the lock
// 0.7 ms, and building the log took time quadratic in its length. A call
// now costs what it changes. Timed as a ratio, the median of a call on a
// long log against one on a short log, both on this machine at once.
func TestMarksAtkLongLogMemoryCost(t *testing.T) {
	const long, short, calls = 40000, 100, 201
	ctx := context.Background()
	for _, algo := range []Algorithm{SlidingLog, Concurrency} {
		t.Run(algo.String(), func(t *testing.T) {
			clk := newClock()
			m := NewMemory(MemoryConfig{Now: clk.Now})
			lim := Limit{Name: "log", Algorithm: algo, Rate: 10 * long, Period: time.Hour}
			items := func(key string) []Item { return []Item{{Limit: lim, Key: key, Cost: 1}} }
			fill := func(key string, n int) {
				for i := range n {
					clk.Advance(time.Microsecond)
					if res, err := m.Debit(ctx, fmt.Sprintf("%s-%d", key, i), items(key)); err != nil || !res.Allowed {
						t.Fatalf("filling %s: debit %d: %+v %v", key, i, res, err)
					}
				}
			}
			began := time.Now()
			fill("{acme}:long", long)
			t.Logf("%d debits filled the long log in %s", long, time.Since(began))
			fill("{other}:short", short)

			// A debit and its settlement at another cost, in turn on
			// each log, so that the machine's drift weighs on both.
			per := map[string][]time.Duration{}
			for i := range calls {
				for _, key := range []string{"{acme}:long", "{other}:short"} {
					clk.Advance(time.Microsecond)
					id := fmt.Sprintf("timed-%s-%d", key, i)
					t0 := time.Now()
					res, err := m.Debit(ctx, id, items(key))
					if err == nil {
						err = m.Settle(ctx, id, items(key), []int64{2})
					}
					per[key] = append(per[key], time.Since(t0))
					if err != nil || !res.Allowed {
						t.Fatalf("%s: %+v %v", key, res, err)
					}
				}
			}
			median := func(ds []time.Duration) time.Duration {
				slices.Sort(ds)
				return ds[len(ds)/2]
			}
			l, s := median(per["{acme}:long"]), median(per["{other}:short"])
			ratio := float64(l) / float64(s)
			t.Logf("a debit and its settlement: %s on %d marks, %s on %d: %.1fx", l, long, s, short, ratio)
			if ratio > 20 {
				t.Errorf("a debit and its settlement on a log of %d marks took %.1fx the time of one on %d (%s against %s): the call reads the whole log under its shard's lock", long, ratio, short, l, s)
			}
			// The sum the calls keep is the log's: a sliding log's timed
			// marks were settled at 2 each, a concurrency limit's released.
			want := lim.Rate - long
			if algo == SlidingLog {
				want -= 2 * calls
			}
			if res, err := m.Peek(ctx, items("{acme}:long")); err != nil || res.Items[0].Remaining != want {
				t.Errorf("peek of the long log: %+v %v; want %d remaining", res, err, want)
			}
		})
	}
}
