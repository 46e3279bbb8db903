package weighted

import (
	"context"
	"errors"
	"testing"
)

// TestStagedLossAtkLossBetweenTheCalls: a restore of a tag too large for
// one call is made in several, the last of which writes the tag's
// marker. The store loses its data between two of them: the counters the
// first calls raised are gone, and a last call that marked the tag fresh
// left them at zero. As stages (RestoreStage), each call after the first
// finds the note of the one before or fails stale, writing nothing: the
// tag stays stale, its debits refused until a restore of it is made
// again. Without a loss, the stages restore as RestoreCounters, then
// Restore, do; a stage whose restore another's first call replaced fails
// too.
func TestStagedLossAtkLossBetweenTheCalls(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	clk := newClock()
	day := genLimits[1]
	newStore := func() (Store, StagedRestorer) {
		r := newRedisStore(c, clk)
		r.gens = true
		return r, r
	}
	leased := func() (Store, StagedRestorer) {
		s, _ := newStore()
		l := NewLeased(s, LeasedConfig{Now: clk.Now})
		t.Cleanup(func() { l.Close(ctx) })
		return l, l
	}
	first := []Item{{Limit: day, Key: "{sl}:user=ann"}}
	last := []Item{{Limit: day, Key: "{sl}"}}
	for name, open := range map[string]func() (Store, StagedRestorer){"redis": newStore, "leased": leased} {
		t.Run(name+"/loss", func(t *testing.T) {
			s, sr := open()
			if err := sr.RestoreStage(ctx, first, []int64{400}, Stage{ID: "a", Step: 0}); err != nil {
				t.Fatal(err)
			}
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			err := sr.RestoreStage(ctx, last, []int64{450}, Stage{ID: "a", Step: 1, Last: true})
			wantStale(t, err, "sl")
			_, err = s.Debit(ctx, "d", []Item{{Limit: day, Key: "{sl}:user=ann", Cost: 1}})
			wantStale(t, err, "sl") // ann's 400 went with the data: not decided on
		})
		t.Run(name+"/noloss", func(t *testing.T) {
			s, sr := open()
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			mid := []Item{{Limit: day, Key: "{sl}:user=bob"}}
			for i, st := range []struct {
				items   []Item
				counted int64
				stage   Stage
			}{
				{first, 400, Stage{ID: "b", Step: 0}},
				{mid, 300, Stage{ID: "b", Step: 1}},
				{last, 450, Stage{ID: "b", Step: 2, Last: true}},
			} {
				if i < 2 {
					_, err := s.Debit(ctx, "d", []Item{{Limit: day, Key: "{sl}", Cost: 1}})
					wantStale(t, err, "sl")
				}
				if err := sr.RestoreStage(ctx, st.items, []int64{st.counted}, st.stage); err != nil {
					t.Fatal(err)
				}
			}
			for _, tc := range []struct {
				it   Item
				want int64
			}{{first[0], 100}, {mid[0], 200}, {last[0], 50}} {
				res, err := s.Peek(ctx, []Item{tc.it})
				if err != nil {
					t.Fatal(err)
				}
				if got := res.Items[0].Remaining; got != tc.want {
					t.Errorf("%s after the restore: %d remaining, want %d", tc.it.Key, got, tc.want)
				}
			}
		})
		t.Run(name+"/replaced", func(t *testing.T) {
			_, sr := open()
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := sr.RestoreStage(ctx, first, []int64{400}, Stage{ID: "c", Step: 0}); err != nil {
				t.Fatal(err)
			}
			if err := sr.RestoreStage(ctx, first, []int64{400}, Stage{ID: "d", Step: 0}); err != nil {
				t.Fatal(err)
			}
			err := sr.RestoreStage(ctx, last, []int64{450}, Stage{ID: "c", Step: 1, Last: true})
			if !errors.Is(err, ErrStale) {
				t.Fatalf("a stage whose restore another replaced: %v, want stale", err)
			}
		})
	}
}
