package weighted

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// lossyStore is a store under test and how it loses its state: Redis by
// FLUSHALL, Memory by a restart (a new Memory on the same clock).
type lossyStore struct {
	name  string
	store func() Store
	lose  func(t *testing.T)
}

// lossyStores returns a Memory and a Redis store on c that share clk, with
// generation markers when gens is set.
func lossyStores(c *redis.Client, clk *clock, gens bool) []lossyStore {
	mem := NewMemory(MemoryConfig{Now: clk.Now, Generations: gens})
	rs := NewRedis(c, patient(RedisConfig{Prefix: "cl" + strconv.FormatInt(prefixSeq.Add(1), 10) + ":", Generations: gens}))
	rs.now = clk.Now
	return []lossyStore{
		{"memory", func() Store { return mem }, func(*testing.T) {
			mem = NewMemory(MemoryConfig{Now: clk.Now, Generations: gens})
		}},
		{"redis", func() Store { return rs }, func(t *testing.T) {
			t.Helper()
			if err := c.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

// debitFresh is Debit that restores a stale tag first, as the gate does,
// with concurrency counted 0 (no ledger counts what is in flight).
func debitFresh(t *testing.T, s Store, id string, items []Item) Result {
	t.Helper()
	ctx := context.Background()
	res, err := s.Debit(ctx, id, items)
	if errors.Is(err, ErrStale) {
		if err := s.(Restorer).Restore(ctx, items, make([]int64, len(items))); err != nil {
			t.Fatal(err)
		}
		res, err = s.Debit(ctx, id, items)
	}
	if err != nil {
		t.Fatalf("debit %s: %v", id, err)
	}
	return res
}

// TestConcLossAtkRenewHoldsAgain: a concurrency limit of 5 with 5 held,
// and the store loses its state. The 5 still run and renew: their holds
// are back, and a 6th is refused, whether the tag is restored before or
// after the renewals (a restore counts concurrency 0 and leaves the holds
// alone). The holds of ids settled or cancelled after the loss are not
// back. Before, a renewal of a hold that was gone changed nothing: 5 more
// were admitted while the first 5 ran.
func TestConcLossAtkRenewHoldsAgain(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	conc := Limit{Name: "streams", Algorithm: Concurrency, Rate: 5, Period: 10 * time.Second}
	items := []Item{{Limit: conc, Key: "{acme}", Cost: 1}}
	for _, restoreFirst := range []bool{false, true} {
		for _, ls := range lossyStores(c, newClock(), true) {
			t.Run(fmt.Sprintf("%s/restore first %v", ls.name, restoreFirst), func(t *testing.T) {
				for i := range 5 {
					if res := debitFresh(t, ls.store(), fmt.Sprint("a", i), items); !res.Allowed {
						t.Fatalf("a%d refused: %+v", i, res)
					}
				}
				if res := debitFresh(t, ls.store(), "full", items); res.Allowed {
					t.Fatalf("a 6th admitted before the loss: %+v", res)
				}
				ls.lose(t)
				if restoreFirst {
					if res := debitFresh(t, ls.store(), "probe", []Item{{Limit: conc, Key: "{acme}"}}); !res.Allowed {
						t.Fatalf("a probe of cost 0: %+v", res)
					}
				}
				// a0 settled and a1 cancelled after the loss, then renewed
				// as a renewal under way when they ended would be.
				s := ls.store()
				if err := s.Settle(ctx, "a0", items, []int64{1}); err != nil {
					t.Fatal(err)
				}
				if err := s.Cancel(ctx, "a1", items); err != nil {
					t.Fatal(err)
				}
				for i := range 5 {
					if err := s.Renew(ctx, fmt.Sprint("a", i), items); err != nil {
						t.Fatal(err)
					}
				}
				// a2, a3, a4 run: 2 more fit, and no 3rd.
				for i := range 2 {
					if res := debitFresh(t, s, fmt.Sprint("b", i), items); !res.Allowed {
						t.Fatalf("b%d refused with a2..a4 held: %+v (a settled or cancelled id held again?)", i, res)
					}
				}
				if res := debitFresh(t, s, "b2", items); res.Allowed {
					t.Fatalf("a 6th in flight admitted after the loss: %+v", res)
				}
			})
		}
	}
}

// TestConcLossAtkFullAfterLoss: 5 of 5 held, the store's data lost, the 5
// renewed: a debit is refused, with the Retry-After of the holds renewed,
// and the Remaining of a peek is 0. Before, it was admitted, and 4 more.
func TestConcLossAtkFullAfterLoss(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	conc := Limit{Name: "streams", Algorithm: Concurrency, Rate: 5, Period: 10 * time.Second}
	items := []Item{{Limit: conc, Key: "{acme}", Cost: 1}}
	clk := newClock()
	for _, ls := range lossyStores(c, clk, false) {
		t.Run(ls.name, func(t *testing.T) {
			for i := range 5 {
				if res := debitFresh(t, ls.store(), fmt.Sprint("a", i), items); !res.Allowed {
					t.Fatalf("a%d refused: %+v", i, res)
				}
			}
			ls.lose(t)
			clk.Advance(time.Second)
			for i := range 5 {
				if err := ls.store().Renew(ctx, fmt.Sprint("a", i), items); err != nil {
					t.Fatal(err)
				}
			}
			res := debitFresh(t, ls.store(), "b", items)
			if res.Allowed {
				t.Fatalf("a 6th admitted after the loss, with 5 in flight renewed: %+v", res)
			}
			if got := res.Items[0].RetryAfter; got != conc.Period {
				t.Errorf("Retry-After %s, want %s (the holds renewed)", got, conc.Period)
			}
			p, err := ls.store().Peek(ctx, items)
			if err != nil || p.Items[0].Remaining != 0 {
				t.Errorf("peek: %+v %v, want 0 remaining", p, err)
			}
		})
	}
}

// TestConcLossAtkRenewRacingSettle: renewals of reservations race their
// settlements and cancellations, many at once, with the store's state
// lost before (the holds gone: a renewal would hold them again) or not. A
// renewal that comes after the end never holds again: once all are done
// no hold is left, in the count and, on Redis, in the sorted set (no mark,
// no sum).
func TestConcLossAtkRenewRacingSettle(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	const n = 200
	conc := Limit{Name: "streams", Algorithm: Concurrency, Rate: n, Period: time.Minute}
	items := []Item{{Limit: conc, Key: "{acme}", Cost: 1}}
	for _, lost := range []bool{false, true} {
		for _, ls := range lossyStores(c, newClock(), false) {
			t.Run(fmt.Sprintf("%s/lost %v", ls.name, lost), func(t *testing.T) {
				for i := range n {
					if res := debitFresh(t, ls.store(), fmt.Sprint("a", i), items); !res.Allowed {
						t.Fatalf("a%d refused: %+v", i, res)
					}
				}
				if lost {
					ls.lose(t)
				}
				s := ls.store()
				var wg sync.WaitGroup
				errs := make(chan error, 4*n)
				for i := range n {
					id := fmt.Sprint("a", i)
					for range 3 {
						wg.Go(func() { errs <- s.Renew(ctx, id, items) })
					}
					wg.Go(func() {
						if i%2 == 0 {
							errs <- s.Settle(ctx, id, items, []int64{1})
						} else {
							errs <- s.Cancel(ctx, id, items)
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
				// Renewals after the ends, as a renewal already sent.
				for i := range n {
					if err := s.Renew(ctx, fmt.Sprint("a", i), items); err != nil {
						t.Fatal(err)
					}
				}
				p, err := s.Peek(ctx, items)
				if err != nil || p.Items[0].Remaining != n {
					t.Fatalf("peek after every reservation ended: %+v %v, want %d remaining", p, err, n)
				}
				if r, ok := s.(*Redis); ok {
					key := r.key(&items[0])
					if m, err := c.ZRangeWithScores(ctx, key, 0, -1).Result(); err != nil || len(m) != 0 {
						t.Fatalf("%s holds %v (%v), want nothing", key, m, err)
					}
				}
				if m, ok := s.(*Memory); ok {
					var hb heldBufs
					h := hb.held()
					m.lock(&h, items, "", false, false, nil)
					e := m.get(&h, 0)
					m.unlock(&h)
					if e != nil && e.marks.len() != 0 {
						t.Fatalf("memory holds %d marks, want none", e.marks.len())
					}
				}
			})
		}
	}
}

// TestConcLossAtkRenewAfterSettleOfTwoTags: a reservation of a token
// bucket of one tenant and a concurrency limit of another, settled after
// its hold was lost, then renewed (a renewal under way when it was
// settled). On one Redis the settlement records the end under the
// bucket's tag, which the renewal, of the concurrency item alone, reads
// too: the hold is not resurrected.
func TestConcLossAtkRenewAfterSettleOfTwoTags(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	conc := Limit{Name: "streams", Algorithm: Concurrency, Rate: 1, Period: time.Minute}
	tb := Limit{Name: "tb", Rate: 10, Period: time.Hour}
	items := []Item{{Limit: tb, Key: "{globex}", Cost: 1}, {Limit: conc, Key: "{acme}", Cost: 1}}
	for _, ls := range lossyStores(c, newClock(), false) {
		t.Run(ls.name, func(t *testing.T) {
			if res := debitFresh(t, ls.store(), "a", items); !res.Allowed {
				t.Fatalf("a refused: %+v", res)
			}
			ls.lose(t)
			s := ls.store()
			if err := s.Settle(ctx, "a", items, []int64{1, 1}); err != nil {
				t.Fatal(err)
			}
			if err := s.Renew(ctx, "a", items); err != nil {
				t.Fatal(err)
			}
			if res := debitFresh(t, s, "b", items[1:]); !res.Allowed {
				t.Fatalf("the slot of a, settled, is held: %+v", res)
			}
		})
	}
}
