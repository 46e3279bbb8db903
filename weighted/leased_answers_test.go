package weighted

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
)

// TestLeasedStaleNamesTheRequestsItems: a Leased store decides a request
// in several store calls (a lease per leased item, one debit of the strict
// rest), each of some of its items. When one of them finds a tag stale,
// the *StaleError must name the request's items of that tag, by their
// indexes in the request: the caller restores those (gate.freshStore), and
// a restore of the wrong items leaves the tag stale for good. Before,
// the indexes were the call's: item 0 of a lease of one.
func TestLeasedStaleNamesTheRequestsItems(t *testing.T) {
	ctx := context.Background()
	onLeasedStores(t, true, func(t *testing.T, l *Leased, clk *clock) {
		leased := Limit{Name: "leased", Algorithm: TokenBucket, Rate: 1000, Period: time.Hour, Lease: Lease{Max: 100, TTL: time.Minute}}
		strict := Limit{Name: "strict", Algorithm: FixedWindow, Rate: 1000, Period: time.Hour}
		fresh := Item{Limit: leased, Key: "{a}:k", Cost: 1}
		l.state(&fresh).rate = 1e9 // hot: its requests take leases
		if err := l.Restore(ctx, []Item{fresh}, []int64{0}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			new  Item // an item of a tag the store has no marker of
		}{
			{"a lease", Item{Limit: leased, Key: "{b}:k", Cost: 1}},
			{"the strict rest", Item{Limit: strict, Key: "{c}:k", Cost: 1}},
		} {
			if tc.new.Limit.Lease.On() {
				l.state(&tc.new).rate = 1e9
			}
			clk.Advance(time.Millisecond)
			items := []Item{fresh, tc.new}
			_, err := l.Debit(ctx, "r-"+tc.name, items)
			var se *StaleError
			if !errors.As(err, &se) {
				t.Fatalf("%s: %v, want a *StaleError", tc.name, err)
			}
			tag := HashTag(tc.new.Key)
			if !slices.Equal(se.Tags, []string{tag}) || !slices.Equal(se.Items, []int{1}) {
				t.Fatalf("%s: stale tags %v items %v, want [%s] and the request's item [1]", tc.name, se.Tags, se.Items, tag)
			}
			// Restored as the error says, the request goes through.
			var named []Item
			for _, i := range se.Items {
				named = append(named, items[i])
			}
			if err := l.Restore(ctx, named, make([]int64, len(named))); err != nil {
				t.Fatal(err)
			}
			if res, err := l.Debit(ctx, "r-"+tc.name, items); err != nil || !res.Allowed {
				t.Fatalf("%s: after the restore: %+v %v", tc.name, res, err)
			}
		}
	})
}

// TestLeasedPeekCountsHeldUnits: a Peek (the rate limit service's check,
// hits_addend 0) asks the store, where a lease's units count as spent; the
// units this replica holds unspent are its to spend, and a check must
// count them: with 5 in the store and 4 held, a check of 6 fits. Before,
// it was refused while a Debit of 6 would have been admitted.
func TestLeasedPeekCountsHeldUnits(t *testing.T) {
	ctx := context.Background()
	onLeasedStores(t, false, func(t *testing.T, l *Leased, clk *clock) {
		lim := Limit{Name: "w", Algorithm: FixedWindow, Rate: 10, Period: time.Hour, Lease: Lease{Max: 5, TTL: time.Minute}}
		it := Item{Limit: lim, Key: "{t}:k", Cost: 1}
		l.state(&it).rate = 1e9 // hot: the first debit takes a lease of 5
		if res, err := l.Debit(ctx, "a", []Item{it}); err != nil || !res.Allowed {
			t.Fatalf("first debit: %+v %v", res, err)
		}
		if held := l.Unspent(it); held != 4 {
			t.Fatalf("held %d after the first debit, want 4 (a lease of 5)", held)
		}
		for _, tc := range []struct {
			cost      int64
			allowed   bool
			remaining int64
		}{{6, true, 9}, {9, true, 9}, {10, false, 9}} {
			check := it
			check.Cost = tc.cost
			res, err := l.Peek(ctx, []Item{check})
			if err != nil || res.Allowed != tc.allowed || res.Items[0].Remaining != tc.remaining {
				t.Fatalf("check of %d: allowed %v remaining %d (%v), want %v and %d", tc.cost, res.Allowed, res.Items[0].Remaining, err, tc.allowed, tc.remaining)
			}
		}
		// What a check admits, a debit admits; spent whole, a check of
		// one is refused.
		big := it
		big.Cost = 9
		if res, err := l.Debit(ctx, "b", []Item{big}); err != nil || !res.Allowed {
			t.Fatalf("a debit of 9 after the check: %+v %v", res, err)
		}
		if res, err := l.Peek(ctx, []Item{it}); err != nil || res.Allowed || res.Items[0].Remaining != 0 {
			t.Fatalf("check on the spent window: %+v %v", res, err)
		}
	})
}

// onLeasedStores runs f with an inline Leased store (see inlineOver) over
// a Memory store and over a Redis one, each on a clock of its own, with
// generation markers when gens is set.
func onLeasedStores(t *testing.T, gens bool, f func(t *testing.T, l *Leased, clk *clock)) {
	srv := redistest.New(t)
	for _, sn := range []string{"memory", "redis"} {
		t.Run(sn, func(t *testing.T) {
			clk := newClock()
			var s Store = NewMemory(MemoryConfig{Now: clk.Now, Generations: gens})
			if sn == "redis" {
				r := newRedisStore(srv.Client(t), clk)
				r.gens = gens
				s = r
			}
			f(t, inlineOver(t, s, clk), clk)
		})
	}
}
