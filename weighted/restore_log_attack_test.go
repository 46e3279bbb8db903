package weighted

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRestoreLogAtkCounted: a sliding log restored to what the caller
// counted in its window (the ledger's count after the store lost its
// data) admits only the rest of its capacity, on Memory, Redis and a
// Leased over each, step by step the same on Memory and Redis; the
// restore's mark, at the restore's time, stops counting exactly one
// Period later, when the allowance comes back; a restore repeated adds no
// mark, and each one adds at most one. Before, Restore refused counted > 0
// on a sliding log (ErrInvalidCost), and a log that lost its marks admitted
// its whole capacity again: 10 more of 10 where 6 had been spent.
func TestRestoreLogAtkCounted(t *testing.T) {
	ctx := context.Background()
	c := testRedis(t)
	log := Limit{Name: "daylog", Algorithm: SlidingLog, Rate: 10, Period: 24 * time.Hour}
	one := func(cost int64) []Item { return []Item{{Limit: log, Key: "{acme}:tenant=acme", Cost: cost}} }
	clk := newClock()
	mem := NewMemory(MemoryConfig{Now: clk.Now, Generations: true})
	rs := newRedisStore(c, clk)
	rs.gens = true
	stores := []namedStore{
		{"memory", mem},
		{"redis", rs},
		{"leased/memory", inlineOver(t, NewMemory(MemoryConfig{Now: clk.Now, Generations: true}), clk)},
		{"leased/redis", inlineOver(t, func() Store { r := newRedisStore(c, clk); r.gens = true; return r }(), clk)},
	}
	var trace [4][]string
	step := func(what string, f func(k int, s namedStore) string) {
		t.Helper()
		for k, s := range stores {
			trace[k] = append(trace[k], what+": "+f(k, s))
		}
	}
	restore := func(counted int64) func(int, namedStore) string {
		return func(_ int, s namedStore) string {
			if err := s.Store.(Restorer).Restore(ctx, one(0), []int64{counted}); err != nil {
				t.Fatalf("%s: restore to %d: %v", s.name, counted, err)
			}
			return "ok"
		}
	}
	admit := func(name string) func(int, namedStore) string {
		return func(_ int, s namedStore) string {
			n := 0
			for i := range 11 {
				res, err := s.Debit(ctx, fmt.Sprint(name, "-", i), one(1))
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if !res.Allowed {
					return fmt.Sprintf("admitted %d, then %+v", n, res.Items[0])
				}
				n++
			}
			return fmt.Sprintf("admitted %d", n)
		}
	}
	peek := func(_ int, s namedStore) string {
		res, err := s.Peek(ctx, one(1))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		return fmt.Sprintf("%+v", res.Items[0])
	}
	wantAdmitted := func(k int, want int) {
		t.Helper()
		last := trace[k][len(trace[k])-1]
		_, got, _ := strings.Cut(last, ": ")
		if w := fmt.Sprintf("admitted %d", want); got != w && !strings.HasPrefix(got, w+",") {
			t.Fatalf("%s: %s, want %s", stores[k].name, last, w)
		}
	}

	step("restore", restore(6)) // 6 of 10 spent before the loss
	step("restore again", restore(6))
	step("peek", peek)
	clk.Advance(time.Hour)
	step("admit", admit("a")) // 4 at t0 + 1h
	for k := range stores {
		wantAdmitted(k, 4)
	}
	step("restore after", restore(10)) // counted 10: nothing to add
	if n := c.ZCard(ctx, rs.key(&one(0)[0])).Val(); n != 1+4+1 {
		t.Fatalf("redis: %d members, want the restore's mark, 4 debits' and the sum", n)
	}
	clk.Advance(23*time.Hour - time.Microsecond)
	step("just before the restore's mark leaves", admit("b"))
	for k := range stores {
		wantAdmitted(k, 0)
	}
	clk.Advance(time.Microsecond)
	step("the restore's mark left", admit("c"))
	for k := range stores {
		wantAdmitted(k, 6)
	}
	clk.Advance(time.Hour)
	step("a day after the debits", admit("d"))
	for k := range stores {
		wantAdmitted(k, 4)
	}
	for i := range trace[0] {
		if trace[0][i] != trace[1][i] {
			t.Fatalf("step %d:\nmemory: %s\nredis:  %s", i, trace[0][i], trace[1][i])
		}
	}
}
