package weighted

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestOwedLossAtkRestoreKeepsTheDebt: a meter charged beyond empty owes
// up to one capacity (TestChargesAreOwed); a restore of a counter lost
// with Redis to what the ledger counted, 3 capacities spent in its
// window, must leave it owing one as a settlement left it, on both
// stores: half a period later it has no room yet. Before, a restore
// raised a meter by one capacity at most, so the debt was forgiven and
// half a capacity was admitted again half a period after the loss.
func TestOwedLossAtkRestoreKeepsTheDebt(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, l := range faultAtkMeters {
		t.Run(l.Name, func(t *testing.T) {
			clk := newClock()
			for _, s := range owedStores(c, clk) {
				items := []Item{{Limit: l, Key: "{owed-" + l.Name + "}"}}
				if err := s.Store.(Restorer).Restore(ctx, items, []int64{3 * l.Capacity()}); err != nil {
					t.Fatal(err)
				}
				clk.Advance(l.Period / 2)
				if faultAtkAdmit(t, s.Store, "after", items[0], 1) {
					t.Errorf("%s: half a period after a restore of 3 capacities spent, one unit admitted: the debt beyond empty was forgiven", s.name)
				}
				clk.Advance(-l.Period / 2)
			}
		})
	}
}

// TestOwedLossAtkRestoreTwiceChargesOnce: a restore leaves a counter
// already at what the ledger counted alone (see Restorer), a meter that
// owes beyond empty too. Two restores of 1.5 capacities (a scheduled one
// and a replica's, or a loss's after a scheduled one) must leave the
// meter owing half a capacity, so that 0.55 of a period later it has
// room for a unit, on both stores. Before, a meter in debt read as
// holding one capacity at most: the second restore added half a
// capacity more, and each further one again, up to two capacities.
func TestOwedLossAtkRestoreTwiceChargesOnce(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, l := range faultAtkMeters {
		t.Run(l.Name, func(t *testing.T) {
			clk := newClock()
			for _, s := range owedStores(c, clk) {
				items := []Item{{Limit: l, Key: "{twice-" + l.Name + "}"}}
				for range 2 {
					if err := s.Store.(Restorer).Restore(ctx, items, []int64{3 * l.Capacity() / 2}); err != nil {
						t.Fatal(err)
					}
				}
				clk.Advance(l.Period * 55 / 100)
				if !faultAtkAdmit(t, s.Store, "after", items[0], 1) {
					t.Errorf("%s: 0.55 of a period after two restores of 1.5 capacities, no room for a unit: the second restore charged again", s.name)
				}
				clk.Advance(-l.Period * 55 / 100)
			}
		})
	}
}

// owedStores are a memory store and a Redis one on c, both with
// generation markers, on clk.
func owedStores(c *redis.Client, clk *clock) []namedStore {
	r := newRedisStore(c, clk)
	r.gens = true
	return []namedStore{
		{"memory", NewMemory(MemoryConfig{Now: clk.Now, Generations: true})},
		{"redis", r},
	}
}
