package weighted

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSettleClaimed: replicas that end one reservation at once (settle,
// cancel, each twice, in batches) agree on one end: exactly one wins,
// every other one is told the winner's claim, and the limits move once,
// by the winner's settlement.
func TestSettleClaimed(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	r := newBatchStore(c, newClock(), RedisConfig{})
	items := []Item{
		{Limit: Limit{Name: "tb", Rate: 10000, Period: time.Hour}, Key: "{k}", Cost: 10},
		{Limit: Limit{Name: "sw", Algorithm: SlidingWindow, Rate: 10000, Period: time.Hour}, Key: "{k}", Cost: 10},
	}
	const n = 60
	for i := range n {
		if res, err := r.Debit(ctx, fmt.Sprint("id", i), items); err != nil || !res.Allowed {
			t.Fatalf("debit %d: %+v %v", i, res, err)
		}
	}
	type end struct {
		won   bool
		prior string
		value string
	}
	ends := make([][]end, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for e := range 4 {
		for i := range n {
			wg.Go(func() {
				id := fmt.Sprint("id", i)
				cl := Claim{Key: "{k}:held:" + id, Value: fmt.Sprintf("end %d of %s", e, id), TTL: time.Minute}
				var actual []int64
				if e%2 == 0 {
					actual = []int64{4, 4} // a settlement: 6 back on each
				}
				won, prior, err := r.SettleClaimed(ctx, id, items, actual, cl)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ends[i] = append(ends[i], end{won, prior, cl.Value})
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	used := int64(0)
	for i, es := range ends {
		var winner string
		for _, e := range es {
			if e.won {
				if winner != "" {
					t.Fatalf("id%d: two ends won: %q and %q", i, winner, e.value)
				}
				winner = e.value
			}
		}
		if winner == "" {
			t.Fatalf("id%d: no end won: %+v", i, es)
		}
		for _, e := range es {
			if !e.won && e.prior != winner {
				t.Fatalf("id%d: a loser was told %q; the winner was %q", i, e.prior, winner)
			}
		}
		if strings.HasPrefix(winner, "end 0") || strings.HasPrefix(winner, "end 2") {
			used += 4
		}
	}
	checkRemaining(t, r, items, used)
	// A later plain Settle of a claimed id changes nothing either.
	if err := r.Settle(ctx, "id0", items, []int64{0, 0}); err != nil {
		t.Fatal(err)
	}
	checkRemaining(t, r, items, used)
}

// TestSettleClaimedAfterPlainSettle: an id settled without a claim (a
// replica that could not claim) is claimed by the next end, which changes
// no limit: the refund is not given twice.
func TestSettleClaimedAfterPlainSettle(t *testing.T) {
	c, r, items := debitedA(t)
	ctx := context.Background()
	if err := r.Settle(ctx, "a", items, []int64{10}); err != nil {
		t.Fatal(err)
	}
	won, prior, err := r.SettleClaimed(ctx, "a", items, nil, Claim{Key: "held:a", Value: "released", TTL: time.Minute})
	if err != nil || !won || prior != "" {
		t.Fatalf("claim after a plain settle: won %v, prior %q, %v", won, prior, err)
	}
	checkRemaining(t, r, items, 10)
	if won, prior, err := r.SettleClaimed(ctx, "a", items, []int64{0}, Claim{Key: "held:a", Value: "settled", TTL: time.Minute}); err != nil || won || prior != "released" {
		t.Fatalf("second claim: won %v, prior %q, %v", won, prior, err)
	}
	checkRemaining(t, r, items, 10)
	if ttl := c.PTTL(ctx, "held:a").Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("claim TTL %s, want up to a minute", ttl)
	}
}

// TestSettleClaimedInput: a claim the store cannot make in one call, or
// one that is malformed, is refused and changes nothing.
func TestSettleClaimedInput(t *testing.T) {
	c, r, items := debitedA(t)
	ctx := context.Background()
	ok := Claim{Key: "held:a", Value: "x", TTL: time.Minute}
	for name, tc := range map[string]struct {
		id     string
		items  []Item
		actual []int64
		claim  Claim
		want   error
	}{
		"no items":        {"a", nil, nil, ok, ErrUnclaimable},
		"no id":           {"", items, nil, ok, errNoID},
		"negative actual": {"a", items, []int64{-1}, ok, errNegative},
		"actual size":     {"a", items, []int64{1, 2}, ok, errActualSize},
		"empty claim":     {"a", items, nil, Claim{Key: "held:a", TTL: time.Minute}, nil},
		"long claim":      {"a", items, nil, Claim{Key: "held:a", Value: strings.Repeat("x", MaxClaim+1), TTL: time.Minute}, nil},
		"no claim key":    {"a", items, nil, Claim{Value: "x", TTL: time.Minute}, nil},
		"sub-millisecond": {"a", items, nil, Claim{Key: "held:a", Value: "x", TTL: time.Microsecond}, nil},
	} {
		won, _, err := r.SettleClaimed(ctx, tc.id, tc.items, tc.actual, tc.claim)
		if err == nil || won || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: won %v, %v; want an error (%v)", name, won, err, tc.want)
		}
	}
	checkRemaining(t, r, items, 30)
	if n := c.Exists(ctx, "held:a").Val(); n != 0 {
		t.Fatal("a refused claim was recorded")
	}
}

// debitedA returns a Redis store on a private Redis (and its client)
// where reservation "a" debited 30 of a bucket of 100: its items.
func debitedA(t *testing.T) (*redis.Client, *Redis, []Item) {
	t.Helper()
	c := testRedis(t)
	r := newRedisStore(c, newClock())
	items := []Item{{Limit: Limit{Name: "tb", Rate: 100, Period: time.Hour}, Key: "acme", Cost: 30}}
	if res, err := r.Debit(context.Background(), "a", items); err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	return c, r, items
}
