package weighted

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// step is one operation of a scripted sequence.
type step struct {
	at     time.Duration // since start; may go backwards
	op     byte          // 'd' debit, 'p' peek, 's' settle, 'c' cancel
	cost   int64         // debit, peek
	actual int64         // settle
	id     string        // debit, settle, cancel; default "r" + step index
	want   string        // debit, peek: "ok" or "deny", checked besides the model
}

// reservation is what a runner remembers of an admitted debit.
type reservation struct{ cost, at int64 }

// runSteps runs steps on s and on l's model, comparing every state.
func runSteps(t *testing.T, s Store, clk *clock, l Limit, key string, steps []step) {
	t.Helper()
	ctx := context.Background()
	m := newModel(l)
	held := map[string]reservation{}
	settled := map[string]bool{}
	for i, st := range steps {
		now := start.Add(st.at)
		clk.Set(now)
		us := now.UnixMicro()
		id := st.id
		if id == "" {
			id = fmt.Sprintf("r%d", i)
		}
		where := fmt.Sprintf("step %d (%c cost %d at %s)", i, st.op, st.cost, st.at)
		if testing.Verbose() {
			t.Logf("%s id %s actual %d", where, id, st.actual)
		}
		switch st.op {
		case 'd', 'p':
			items := []Item{{Limit: l, Key: key, Cost: st.cost}}
			var res Result
			var err error
			if st.op == 'd' {
				res, err = s.Debit(ctx, id, items)
			} else {
				res, err = s.Peek(ctx, items)
			}
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			m.read(us)
			ok := m.admits(us, st.cost)
			if st.op == 'd' && ok && st.cost > 0 {
				m.debit(us, st.cost, id)
				held[id] = reservation{st.cost, us}
			}
			want := modelState(m, l, us, st.cost, ok)
			if got := res.Items[0]; got != want {
				t.Fatalf("%s:\n got %+v\nwant %+v (model)", where, got, want)
			}
			if st.want != "" && (st.want == "ok") != res.Allowed {
				t.Fatalf("%s: allowed %v, the script says %s", where, res.Allowed, st.want)
			}
		case 's', 'c':
			r, ok := held[id]
			if !ok && !settled[id] {
				continue // never admitted: nothing to settle
			}
			items := []Item{{Limit: l, Key: key, Cost: r.cost}}
			var err error
			actual := st.actual
			if st.op == 's' {
				err = s.Settle(ctx, id, items, []int64{st.actual})
			} else {
				err, actual = s.Cancel(ctx, id, items), 0
			}
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if ok {
				if actual != r.cost || l.Algorithm == Concurrency {
					// Settling the reserved cost changes nothing, except
					// that a concurrency reservation is released.
					m.settle(us, id, r.cost, actual, r.at)
				}
				delete(held, id)
				settled[id] = true // a second settle changes nothing
			}
			res, err := s.Peek(ctx, []Item{{Limit: l, Key: key}})
			if err != nil {
				t.Fatalf("%s: peek: %v", where, err)
			}
			m.read(us)
			if got, want := res.Items[0], modelState(m, l, us, 0, m.admits(us, 0)); got != want {
				t.Fatalf("%s: after settling:\n got %+v\nwant %+v (model)", where, got, want)
			}
		}
	}
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// TestAlgorithmsAgainstModels runs scripted time sequences on both stores
// and checks every reported state against the algorithm's model.
func TestAlgorithmsAgainstModels(t *testing.T) {
	c := testRedis(t)
	perSecond := func(a Algorithm, rate, burst int64) Limit {
		return Limit{Name: "l", Algorithm: a, Rate: rate, Period: time.Second, Burst: burst}
	}
	meterCases := func(a Algorithm) map[string][]step {
		return map[string][]step{
			"burst then refill": {
				{at: 0, op: 'd', cost: 4, want: "ok"},
				{at: 0, op: 'd', cost: 4, want: "ok"},
				{at: 0, op: 'd', cost: 4, want: "deny"}, // 2 left; 2 more take 200ms
				{at: ms(199), op: 'd', cost: 4, want: "deny"},
				{at: ms(200), op: 'd', cost: 4, want: "ok"},
				{at: ms(5000), op: 'p', cost: 10, want: "ok"}, // full again, never more than burst
				{at: ms(5000), op: 'd', cost: 10, want: "ok"},
				{at: ms(5001), op: 'd', cost: 1, want: "deny"},
			},
			"fractional refill": {
				{at: 0, op: 'd', cost: 10, want: "ok"},
				{at: ms(33), op: 'p', cost: 1, want: "deny"}, // 0.33 units back
				{at: ms(150), op: 'd', cost: 1, want: "ok"},  // 1.5 back, 0.5 left
				{at: ms(199), op: 'd', cost: 1, want: "deny"},
				{at: ms(200), op: 'd', cost: 1, want: "ok"},
			},
			"settle refunds and charges, a charge owed up to a capacity": {
				{at: 0, op: 'd', cost: 8, id: "a", want: "ok"},
				{at: ms(100), op: 's', id: "a", actual: 3},             // refund 5
				{at: ms(100), op: 's', id: "a", actual: 0},             // retried settle: nothing
				{at: ms(100), op: 'd', cost: 9, id: "b", want: "deny"}, // 8 left
				{at: ms(100), op: 'd', cost: 8, id: "b", want: "ok"},
				{at: ms(100), op: 's', id: "b", actual: 1000}, // charge, clamped to one capacity owed
				{at: ms(100), op: 'd', cost: 1, want: "deny"},
				{at: ms(1199), op: 'd', cost: 1, want: "deny"}, // the debt is paid at the rate: 0.99 back
				{at: ms(1300), op: 'd', cost: 2, id: "c", want: "ok"},
				{at: ms(1300), op: 'c', id: "c"},
				{at: ms(1300), op: 'p', cost: 2, want: "ok"},
			},
			"clock goes backwards": {
				{at: ms(500), op: 'd', cost: 6, want: "ok"},
				{at: ms(400), op: 'd', cost: 4, want: "ok"}, // no refill from going back
				{at: ms(300), op: 'd', cost: 1, want: "deny"},
				{at: ms(550), op: 'd', cost: 1, want: "deny"},
				{at: ms(600), op: 'd', cost: 1, want: "ok"},
			},
		}
	}
	cases := map[Algorithm]struct {
		limit Limit
		steps map[string][]step
	}{
		TokenBucket: {perSecond(TokenBucket, 10, 0), meterCases(TokenBucket)},
		GCRA:        {perSecond(GCRA, 10, 0), meterCases(GCRA)},
		FixedWindow: {perSecond(FixedWindow, 10, 0), map[string][]step{
			"window boundary": {
				{at: ms(900), op: 'd', cost: 6, want: "ok"},
				{at: ms(950), op: 'd', cost: 6, want: "deny"}, // retry at the boundary, 50ms
				{at: ms(999), op: 'd', cost: 4, want: "ok"},
				{at: ms(1000), op: 'd', cost: 10, want: "ok"}, // a fresh window: 20 in 101ms
				{at: ms(1999), op: 'd', cost: 1, want: "deny"},
			},
			"refund only into the debited window": {
				{at: ms(900), op: 'd', cost: 8, id: "a", want: "ok"},
				{at: ms(950), op: 's', id: "a", actual: 2},
				{at: ms(960), op: 'd', cost: 8, id: "b", want: "ok"},
				{at: ms(1100), op: 'd', cost: 10, id: "c", want: "ok"},
				{at: ms(1100), op: 's', id: "b", actual: 0}, // window over: no refund
				{at: ms(1100), op: 'd', cost: 1, want: "deny"},
				{at: ms(1200), op: 's', id: "c", actual: 12}, // charge, clamped to full
			},
			"clock goes backwards across the boundary": {
				{at: ms(1001), op: 'd', cost: 9, want: "ok"},
				{at: ms(999), op: 'd', cost: 2, want: "deny"}, // still counted in the later window
				{at: ms(998), op: 'd', cost: 1, want: "ok"},
			},
		}},
		SlidingWindow: {perSecond(SlidingWindow, 10, 0), map[string][]step{
			"weighted previous window": {
				{at: ms(500), op: 'd', cost: 10, want: "ok"},
				{at: ms(1000), op: 'd', cost: 1, want: "deny"}, // previous weighs 10
				{at: ms(1500), op: 'd', cost: 5, want: "ok"},   // 10 × 0.5 + 5
				{at: ms(1600), op: 'd', cost: 2, want: "deny"}, // 4 + 5 + 2
				{at: ms(1600), op: 'd', cost: 1, want: "ok"},
				{at: ms(2000), op: 'p', cost: 5, want: "deny"}, // 6 × 1.0 + 5
				{at: ms(2000), op: 'p', cost: 4, want: "ok"},
				{at: ms(2999), op: 'p', cost: 10, want: "deny"}, // 6 × 0.001
				{at: ms(3000), op: 'p', cost: 10, want: "ok"},
				{at: ms(4000), op: 'p', cost: 10, want: "ok"},
			},
			"refund into the previous window": {
				{at: ms(900), op: 'd', cost: 10, id: "a", want: "ok"},
				{at: ms(1100), op: 'd', cost: 2, want: "deny"},
				{at: ms(1100), op: 's', id: "a", actual: 4},
				{at: ms(1100), op: 'd', cost: 2, want: "ok"},
				{at: ms(2500), op: 's', id: "a", actual: 0}, // settled already
			},
			"clock goes backwards": {
				{at: ms(1500), op: 'd', cost: 8, want: "ok"},
				{at: ms(900), op: 'd', cost: 3, want: "deny"},
				{at: ms(900), op: 'd', cost: 2, want: "ok"},
			},
		}},
		SlidingLog: {perSecond(SlidingLog, 10, 0), map[string][]step{
			"exact window": {
				{at: 0, op: 'd', cost: 4, want: "ok"},
				{at: ms(400), op: 'd', cost: 4, want: "ok"},
				{at: ms(800), op: 'd', cost: 4, want: "deny"}, // the first leaves at 1000ms
				{at: ms(999), op: 'd', cost: 4, want: "deny"},
				{at: ms(1000), op: 'd', cost: 4, want: "ok"},
				{at: ms(1000), op: 'd', cost: 3, want: "deny"},
				{at: ms(1400), op: 'd', cost: 6, want: "ok"},
			},
			"settle adjusts the entry": {
				{at: 0, op: 'd', cost: 9, id: "a", want: "ok"},
				{at: ms(10), op: 's', id: "a", actual: 2},
				{at: ms(20), op: 'd', cost: 8, id: "b", want: "ok"},
				{at: ms(30), op: 's', id: "b", actual: 20}, // clamped to full
				{at: ms(999), op: 'd', cost: 1, want: "deny"},
				{at: ms(1000), op: 'd', cost: 2, want: "ok"},
				{at: ms(1500), op: 's', id: "a", actual: 9}, // settled already
			},
		}},
		Concurrency: {perSecond(Concurrency, 10, 0), map[string][]step{
			"release and lease": {
				{at: 0, op: 'd', cost: 4, id: "a", want: "ok"},
				{at: ms(100), op: 'd', cost: 4, id: "b", want: "ok"},
				{at: ms(200), op: 'd', cost: 4, id: "c", want: "deny"}, // until a's lease ends
				{at: ms(300), op: 's', id: "a", actual: 4},
				{at: ms(300), op: 'd', cost: 4, id: "c", want: "ok"},
				{at: ms(1100), op: 'd', cost: 6, id: "d", want: "ok"}, // b's lease ended
				{at: ms(1100), op: 'c', id: "c"},
				{at: ms(1100), op: 'p', cost: 4, want: "ok"},
			},
		}},
	}
	for a := Algorithm(0); a < numAlgorithms; a++ {
		tc, ok := cases[a]
		if !ok {
			t.Fatalf("no scripted cases for %s", a)
		}
		for name, steps := range tc.steps {
			for _, s := range bothStores(c, newClock()) {
				t.Run(a.String()+"/"+name+"/"+s.name, func(t *testing.T) {
					clk := newClock()
					if r, ok := s.Store.(*Redis); ok {
						r.now = clk.Now
					} else {
						s.Store = NewMemory(MemoryConfig{Now: clk.Now})
					}
					runSteps(t, s.Store, clk, tc.limit, "k-"+name, steps)
				})
			}
		}
	}
}

// randomSeeds is how many random sequences each test runs per limit.
const randomSeeds = 4

// TestRandomSequencesAgainstModels runs random sequences of debits, peeks,
// settles and cancels, with time jumping forwards and sometimes backwards,
// on both stores against the models.
func TestRandomSequencesAgainstModels(t *testing.T) {
	c := testRedis(t)
	limits := []Limit{
		{Name: "tb", Algorithm: TokenBucket, Rate: 7, Period: 300 * time.Millisecond, Burst: 13},
		{Name: "tb-small-burst", Algorithm: TokenBucket, Rate: 20, Period: time.Second, Burst: 5},
		{Name: "gcra", Algorithm: GCRA, Rate: 9, Period: 700 * time.Millisecond, Burst: 4},
		{Name: "fw", Algorithm: FixedWindow, Rate: 11, Period: 250 * time.Millisecond},
		{Name: "sw", Algorithm: SlidingWindow, Rate: 12, Period: 400 * time.Millisecond},
		{Name: "log", Algorithm: SlidingLog, Rate: 10, Period: 350 * time.Millisecond},
		{Name: "conc", Algorithm: Concurrency, Rate: 6, Period: 500 * time.Millisecond},
	}
	for _, l := range limits {
		for seed := range uint64(randomSeeds) {
			for _, name := range []string{"memory", "redis"} {
				t.Run(fmt.Sprintf("%s/seed%d/%s", l.Name, seed, name), func(t *testing.T) {
					clk := newClock()
					var s Store = NewMemory(MemoryConfig{Now: clk.Now})
					if name == "redis" {
						s = newRedisStore(c, clk)
					}
					rng := rand.New(rand.NewPCG(seed, uint64(l.Algorithm)))
					runSteps(t, s, clk, l, "k", randomSteps(rng, l, 300))
				})
			}
		}
	}
}

// randomSteps returns n random steps on l: time mostly moves forward by up
// to half a period and now and then back by a little.
func randomSteps(rng *rand.Rand, l Limit, n int) []step {
	var steps []step
	var at time.Duration
	var ids []string
	p := l.Period
	for i := range n {
		switch r := rng.IntN(20); {
		case r < 2:
			at -= time.Duration(rng.Int64N(int64(p / 10)))
		case r < 14:
			at += time.Duration(rng.Int64N(int64(p / 2))).Truncate(time.Microsecond)
		}
		at = max(at, 0)
		cost := rng.Int64N(l.Capacity()/2 + 1)
		switch r := rng.IntN(10); {
		case r < 6 || len(ids) == 0:
			id := fmt.Sprintf("r%d", i)
			ids = append(ids, id)
			steps = append(steps, step{at: at, op: 'd', cost: cost, id: id})
		case r < 7:
			steps = append(steps, step{at: at, op: 'p', cost: cost})
		case r < 9:
			steps = append(steps, step{at: at, op: 's', id: ids[rng.IntN(len(ids))], actual: rng.Int64N(l.Capacity() + 2)})
		default:
			steps = append(steps, step{at: at, op: 'c', id: ids[rng.IntN(len(ids))]})
		}
	}
	return steps
}
