package weighted

import (
	"context"
	"testing"
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
			for _, s := range []namedStore{
				{"memory", NewMemory(MemoryConfig{Now: clk.Now, Generations: true})},
				{"redis", func() Store { r := newRedisStore(c, clk); r.gens = true; return r }()},
			} {
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
