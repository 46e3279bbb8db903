package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// leaseStep is one call of TestRenew at time at: a debit ('d', allowed
// when allow), a renew ('r'), a settle ('s') or a peek ('p', of the
// concurrency limit, whose remaining is want).
type leaseStep struct {
	at    time.Duration
	op    byte
	id    string
	allow bool
	want  int64
}

// TestRenew holds a concurrency limit of 1 with a lease of 1s past its
// lease by renewing it, and requires of every store (Memory, and Redis one
// request at a time, with batching off, and in one batch) the same
// results: a renewed reservation keeps its slot, a settled one is not
// resurrected by a renewal, one whose lease expired frees its slot until
// it renews again (its holder still runs: it is held again), and a token
// bucket debited with it is not touched by renewals.
func TestRenew(t *testing.T) {
	c := testRedis(t)
	conc := Limit{Name: "streams", Algorithm: Concurrency, Rate: 1, Period: time.Second}
	tb := Limit{Name: "tb", Rate: 10, Period: time.Hour}
	items := []Item{{Limit: tb, Key: "{k}", Cost: 1}, {Limit: conc, Key: "{k}", Cost: 1}}
	const ms = time.Millisecond
	steps := []leaseStep{
		{at: 0, op: 'd', id: "a", allow: true},
		{at: 600 * ms, op: 'r', id: "a"},
		{at: 1200 * ms, op: 'r', id: "a"}, // without the renewal at 0.6s, a expired at 1s
		{at: 1500 * ms, op: 'd', id: "b", allow: false},
		{at: 1500 * ms, op: 'p', want: 0},
		{at: 1500 * ms, op: 's', id: "a"},
		{at: 1500 * ms, op: 'd', id: "b", allow: true},
		{at: 1600 * ms, op: 'r', id: "a"}, // settled: no resurrection
		{at: 1600 * ms, op: 'p', want: 0},
		{at: 2000 * ms, op: 'r', id: "b"}, // b's lease: 2.5s, then 3s
		{at: 2800 * ms, op: 'd', id: "c", allow: false},
		{at: 3050 * ms, op: 'p', want: 1}, // b's lease expired at 3s
		{at: 3100 * ms, op: 'r', id: "b"}, // renewed late: b still runs, held again
		{at: 3100 * ms, op: 'p', want: 0},
		{at: 3100 * ms, op: 'd', id: "c", allow: false},
		{at: 3100 * ms, op: 's', id: "b"},
		{at: 3100 * ms, op: 'd', id: "c", allow: true},
		{at: 3100 * ms, op: 's', id: "c"},
		{at: 3100 * ms, op: 'p', want: 1},
	}
	var want []string
	for _, name := range stepStores {
		t.Run(name, func(t *testing.T) {
			clk := newClock()
			s, batch := stepStore(c, clk, name)
			got := runLeaseSteps(t, s, clk, items, steps, batch)
			for i, st := range steps {
				switch st.op {
				case 'd':
					if got[i].res.Allowed != st.allow {
						t.Errorf("step %d: debit %s at %s: allowed %v, want %v", i, st.id, st.at, got[i].res.Allowed, st.allow)
					}
				case 'p':
					if r := got[i].res.Items[1].Remaining; r != st.want {
						t.Errorf("step %d: peek at %s: remaining %d, want %d", i, st.at, r, st.want)
					}
				}
			}
			var all []string
			for _, o := range got {
				all = append(all, fmt.Sprintf("%+v %v", o.res, o.err))
			}
			if want == nil {
				want = all
				return
			}
			for i := range all {
				if all[i] != want[i] {
					t.Errorf("step %d: %s, but %s: %s", i, all[i], stepStores[0], want[i])
				}
			}
		})
	}
}

type leaseOutcome struct {
	res Result
	err error
}

// runLeaseSteps runs steps on s, one by one, or when batch is set, all in
// one batch of it.
func runLeaseSteps(t *testing.T, s Store, clk *clock, items []Item, steps []leaseStep, batch *Redis) []leaseOutcome {
	t.Helper()
	ctx := context.Background()
	t0 := clk.Now()
	out := make([]leaseOutcome, len(steps))
	run := func(i int) {
		st := steps[i]
		o := &out[i]
		switch st.op {
		case 'd':
			o.res, o.err = s.Debit(ctx, st.id, items)
		case 'r':
			o.err = s.Renew(ctx, st.id, items)
		case 's':
			o.err = s.Settle(ctx, st.id, items, []int64{1, 1})
		case 'p':
			o.res, o.err = s.Peek(ctx, items)
		}
	}
	defer func() {
		for i, o := range out {
			if o.err != nil {
				t.Fatalf("step %d: %v", i, o.err)
			}
		}
	}()
	driveSteps(t, clk, t0, len(steps), func(i int) time.Duration { return steps[i].at }, batch, run)
	return out
}

// TestRenewErrors checks Renew's arguments as Debit does, and that a
// request without concurrency items costs no script call.
func TestRenewErrors(t *testing.T) {
	c := testRedis(t)
	clk := newClock()
	ctx := context.Background()
	conc := Limit{Name: "streams", Algorithm: Concurrency, Rate: 1, Period: time.Second}
	tb := Limit{Name: "tb", Rate: 10, Period: time.Hour}
	for _, s := range bothStores(c, clk) {
		t.Run(s.name, func(t *testing.T) {
			if err := s.Renew(ctx, "", []Item{{Limit: conc, Key: "k", Cost: 1}}); err == nil {
				t.Error("empty id: no error")
			}
			if err := s.Renew(ctx, "x", []Item{{Limit: conc, Key: "k", Cost: 2}}); err == nil {
				t.Error("cost above capacity: no error")
			}
			if err := s.Renew(ctx, "x", nil); err != nil {
				t.Error(err)
			}
			r, _ := s.Store.(*Redis)
			var calls int64
			if r != nil {
				calls = r.scriptCalls.Load()
			}
			if err := s.Renew(ctx, "x", []Item{{Limit: tb, Key: "k", Cost: 1}, {Limit: conc, Key: "k", Cost: 0}}); err != nil {
				t.Error(err)
			}
			if r != nil && r.scriptCalls.Load() != calls {
				t.Error("a renewal without leases ran a script")
			}
		})
	}
}
