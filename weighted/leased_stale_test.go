package weighted

import (
	"context"
	"errors"
	"fmt"
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
	srv := redistest.New(t)
	ctx := context.Background()
	for _, sn := range []string{"memory", "redis"} {
		t.Run(sn, func(t *testing.T) {
			clk := newClock()
			var s Store
			if sn == "redis" {
				r := NewRedis(srv.Client(t), patient(RedisConfig{Prefix: fmt.Sprintf("st%d:", prefixSeq.Add(1)), Generations: true}))
				r.now = clk.Now
				s = r
			} else {
				s = NewMemory(MemoryConfig{Now: clk.Now, Generations: true})
			}
			l := NewLeased(s, LeasedConfig{Now: clk.Now, Sweep: time.Hour})
			l.inline = true
			defer l.Close(ctx)
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
}
