package weighted

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// finalWindows are a fixed and a sliding window of a week, whose windows
// end far from any test's time.
func finalWindows(key string, cost int64, final bool) []Item {
	return []Item{
		{Limit: Limit{Name: "fixed", Algorithm: FixedWindow, Rate: 10, Period: 7 * 24 * time.Hour}, Key: key, Cost: cost, Final: final},
		{Limit: Limit{Name: "sliding", Algorithm: SlidingWindow, Rate: 10, Period: 7 * 24 * time.Hour}, Key: key, Cost: cost, Final: final},
	}
}

// TestFinalDebitKeepsItsRecordBriefly checks that a debit of Final items
// keeps its reservation record FinalRecordTTL at most, where a debit that
// will be settled keeps it until its window ends: in Redis, by the
// record key's TTL on the server's clock; in memory, by the entry's expiry.
func TestFinalDebitKeepsItsRecordBriefly(t *testing.T) {
	ctx := context.Background()
	t.Run("redis", func(t *testing.T) {
		c := testRedis(t)
		r := newRedisStore(c, nil) // the server's clock and real TTLs
		for _, final := range []bool{false, true} {
			id := "final-" + strconv.FormatBool(final)
			if res, err := r.Debit(ctx, id, finalWindows("{k}", 1, final)); err != nil || !res.Allowed {
				t.Fatalf("debit: %+v %v", res, err)
			}
			keys, err := c.Keys(ctx, r.prefix+"r:*"+id).Result()
			if err != nil || len(keys) != 1 {
				t.Fatalf("records of %s: %v %v", id, keys, err)
			}
			ttl, err := c.PTTL(ctx, keys[0]).Result()
			if err != nil {
				t.Fatal(err)
			}
			if final && (ttl <= 0 || ttl > FinalRecordTTL) {
				t.Errorf("final debit: record TTL %s, want within (0, %s]", ttl, FinalRecordTTL)
			}
			if !final && ttl <= time.Hour {
				t.Errorf("debit: record TTL %s, want until its week's window ends", ttl)
			}
		}
	})
	t.Run("memory", func(t *testing.T) {
		clk := newClock()
		m := NewMemory(MemoryConfig{Now: clk.Now})
		for _, final := range []bool{false, true} {
			id := "final-" + strconv.FormatBool(final)
			if res, err := m.Debit(ctx, id, finalWindows("k", 1, final)); err != nil || !res.Allowed {
				t.Fatalf("debit: %+v %v", res, err)
			}
			var ttl time.Duration
			for i := range m.shards {
				for k, e := range m.shards[i].m {
					if k.algo == recordAlgo && k.key == id {
						ttl = time.Duration(e.expires-clk.Now().UnixMicro()) * time.Microsecond
					}
				}
			}
			if final && (ttl <= 0 || ttl > FinalRecordTTL) {
				t.Errorf("final debit: record expires in %s, want within (0, %s]", ttl, FinalRecordTTL)
			}
			if !final && ttl <= time.Hour {
				t.Errorf("debit: record expires in %s, want until its week's window ends", ttl)
			}
		}
	})
}

// TestFinalDebitIsAllOrNothing checks that a Final debit refused on one
// hash tag of a sharded store gives back what it took on the others
// (the compensation reads the record), as the memory store, whose debit
// is one step, never takes it.
func TestFinalDebitIsAllOrNothing(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	clk := newClock()
	sharded := NewRedis(c, patient(RedisConfig{Prefix: "tf" + strconv.FormatInt(prefixSeq.Add(1), 10) + ":", Sharded: true}))
	sharded.now = clk.Now
	for _, s := range append(bothStores(c, clk), namedStore{"redis-sharded", sharded}) {
		t.Run(s.name, func(t *testing.T) {
			// {b}'s windows hold 8 of 10; a debit of 5 on {a} and {b}
			// fits {a} ({a} sorts first: debited, then given back) and
			// not {b}.
			if res, err := s.Debit(ctx, "fill", finalWindows("{b}", 8, true)); err != nil || !res.Allowed {
				t.Fatalf("fill: %+v %v", res, err)
			}
			both := append(finalWindows("{a}", 5, true), finalWindows("{b}", 5, true)...)
			res, err := s.Debit(ctx, "r", both)
			if err != nil || res.Allowed {
				t.Fatalf("debit: %+v %v, want refused", res, err)
			}
			after, err := s.Peek(ctx, finalWindows("{a}", 0, false))
			if err != nil {
				t.Fatal(err)
			}
			for i, it := range after.Items {
				if it.Remaining != 10 {
					t.Errorf("{a} item %d: remaining %d after a refused final debit, want 10", i, it.Remaining)
				}
			}
		})
	}
}

// TestFinalDebitSettledLate checks what Item.Final states of a Settle past
// FinalRecordTTL: it refunds nothing into a window (memory store, on its
// clock; Redis expires the record on its own clock, which a test does not
// move).
func TestFinalDebitSettledLate(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	m := NewMemory(MemoryConfig{Now: clk.Now})
	fixed := finalWindows("k", 4, true)[:1]
	for _, late := range []bool{false, true} {
		id := "r-" + strconv.FormatBool(late)
		if res, err := m.Debit(ctx, id, fixed); err != nil || !res.Allowed {
			t.Fatalf("debit: %+v %v", res, err)
		}
		if late {
			clk.Advance(FinalRecordTTL + time.Duration(sweepGrace)*time.Microsecond + time.Second)
		}
		if err := m.Cancel(ctx, id, fixed); err != nil {
			t.Fatal(err)
		}
		res, err := m.Peek(ctx, finalWindows("k", 0, false)[:1])
		if err != nil {
			t.Fatal(err)
		}
		want := int64(10)
		if late {
			want = 6
		}
		if got := res.Items[0].Remaining; got != want {
			t.Errorf("cancelled %s: remaining %d, want %d", map[bool]string{false: "at once", true: "late"}[late], got, want)
		}
	}
}
