package weighted

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestStaleCompensationForgetsTheID attacks the Cluster protocol's
// compensation after a stale tag: a debit whose later hash tag is stale
// cancels the groups debited before it, and the caller restores the tag
// and debits again under the same id (the package's loop, and the gate's).
// The reservation then admitted must settle and cancel on every group, as
// on Memory; before, the compensation marked the earlier groups' id
// settled, so that their settlement was dropped (a charge of 300 against
// an estimate of 10 never reached the model's token bucket or log, and
// the concurrency unit stayed held until its lease ran out), and a second
// stale tag's compensation found the id marked and refunded nothing.
func TestStaleCompensationForgetsTheID(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	tokens := Limit{Name: "model-tokens", Rate: 1000, Period: time.Hour}
	inflight := Limit{Name: "model-inflight", Algorithm: Concurrency, Rate: 5, Period: time.Hour}
	log := Limit{Name: "model-log", Algorithm: SlidingLog, Rate: 1000, Period: time.Hour}
	window := Limit{Name: "model-window", Algorithm: FixedWindow, Rate: 1000, Period: time.Hour}
	tenant := Limit{Name: "tenant", Rate: 100, Period: time.Hour}
	team := Limit{Name: "team", Algorithm: SlidingWindow, Rate: 100, Period: time.Hour}
	// "model=gpt-4o" sorts before "yak" and "zeta": its group is debited
	// first, and has no marker; "yak" is debited before "zeta". A window
	// in the model's group writes the reservation's record at each debit;
	// without one, only the compensation writes it.
	all := []Item{
		{Limit: tokens, Key: "model=gpt-4o", Cost: 10},
		{Limit: inflight, Key: "model=gpt-4o", Cost: 1},
		{Limit: log, Key: "model=gpt-4o", Cost: 10},
		{Limit: team, Key: "{yak}", Cost: 10},
		{Limit: tenant, Key: "{zeta}", Cost: 10},
		{Limit: window, Key: "model=gpt-4o", Cost: 10},
	}
	allActual := []int64{300, 1, 300, 10, 10, 300}
	allWant := []int64{700, 5, 700, 90, 90, 700}

	for _, n := range []int{5, 6} {
		items, actual, want := all[:n], allActual[:n], allWant[:n]
		for _, sharded := range []bool{true, false} {
			clk := newClock()
			r := NewRedis(c, patient(RedisConfig{Prefix: "comp" + strconv.FormatInt(prefixSeq.Add(1), 10) + ":", Sharded: sharded, Generations: true}))
			r.now = clk.Now
			stores := []namedStore{{"memory items " + strconv.Itoa(n), NewMemory(MemoryConfig{Now: clk.Now, Generations: true})}, {"redis sharded " + strconv.FormatBool(sharded) + " items " + strconv.Itoa(n), r}}
			for _, s := range stores {
				restores := 0
				for {
					res, err := s.Debit(ctx, "req", items)
					var se *StaleError
					if errors.As(err, &se) && restores < 4 {
						restores++
						var tagItems []Item
						for _, it := range items {
							if hasHashTag(it.Key) && slices.Contains(se.Tags, HashTag(it.Key)) {
								tagItems = append(tagItems, it)
							}
						}
						if err := s.Store.(Restorer).Restore(ctx, tagItems, make([]int64, len(tagItems))); err != nil {
							t.Fatal(err)
						}
						continue
					}
					if err != nil || !res.Allowed {
						t.Fatalf("%s: debit after %d restores: %+v %v", s.name, restores, res, err)
					}
					break
				}
				if err := s.Settle(ctx, "req", items, actual); err != nil {
					t.Fatal(err)
				}
				res, err := s.Peek(ctx, items)
				if err != nil {
					t.Fatal(err)
				}
				for i := range items {
					if got := res.Items[i].Remaining; got != want[i] {
						t.Errorf("%s: %s after the settlement: %d remaining, want %d", s.name, items[i].Limit.Name, got, want[i])
					}
				}
			}
		}
	}
}

// TestLeasedRegainSettlesOnEveryGroup drives the denial case through
// Leased, which debits a request again under its id when the store
// refused it for units this replica's leases held (see regain): on a
// sharded store, the group before the refused one was compensated, then
// debited again under that id. Its settlement must count there; before,
// the compensation had marked the id settled on that group, and the
// model's charge of 300 against an estimate of 10 was dropped (990 left
// of 1,000 where 700 should be).
func TestLeasedRegainSettlesOnEveryGroup(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	model := Limit{Name: "model", Rate: 1000, Period: 24 * time.Hour}
	for _, lim := range unrefilled(1000, 100) {
		for _, sn := range []string{"memory", "redis sharded"} {
			t.Run(lim.Name+"/"+sn, func(t *testing.T) {
				clk := newClock()
				var inner LeaseStore = NewMemory(MemoryConfig{Now: clk.Now})
				if sn != "memory" {
					r := NewRedis(c, patient(RedisConfig{Prefix: "regain" + strconv.FormatInt(prefixSeq.Add(1), 10) + ":", Sharded: true}))
					r.now = clk.Now
					inner = r
				}
				l := inlineOver(t, inner, clk)
				it := Item{Limit: lim, Key: "{zeta}", Cost: 1}
				l.state(&it).rate = 1e9 // hot: a lease from the first request
				if res, err := l.Debit(ctx, "first", []Item{it}); err != nil || !res.Allowed {
					t.Fatalf("the first request: %+v %v", res, err)
				}
				other := it
				other.Cost = 780
				if res, err := inner.Debit(ctx, "other", []Item{other}); err != nil || !res.Allowed {
					t.Fatalf("the other replica's %d: %+v %v", other.Cost, res, err)
				}
				// 150 is more than a lease holds: strict, refused by the
				// store (120 left), admitted again with the 99 held given
				// back. "model=gpt-4o" sorts before "zeta".
				it.Cost = 150
				big := []Item{{Limit: model, Key: "model=gpt-4o", Cost: 10}, it}
				if res, err := l.Debit(ctx, "big", big); err != nil || !res.Allowed {
					t.Fatalf("the request of 150: %+v %v", res, err)
				}
				if err := l.Settle(ctx, "big", big, []int64{300, 150}); err != nil {
					t.Fatal(err)
				}
				res, err := inner.Peek(ctx, big[:1])
				if err != nil {
					t.Fatal(err)
				}
				if got := res.Items[0].Remaining; got != 700 {
					t.Fatalf("the model after a settlement of 300: %d left, want 700", got)
				}
			})
		}
	}
}
