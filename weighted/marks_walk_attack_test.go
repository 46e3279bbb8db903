package weighted

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// scriptUsec is the time Redis has spent in script calls so far, in µs
// (INFO commandstats, EVALSHA and EVAL).
func scriptUsec(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var usec int64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:")
		if !ok {
			rest, ok = strings.CutPrefix(line, "cmdstat_eval:")
		}
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				usec += n
			}
		}
	}
	return usec
}

// TestMarksAtkLongLogDenial: a tenant fills its sliding log (or its
// concurrency limit) with many one-unit marks, then asks for a cost the
// log cannot hold. Redis runs one script at a time, so what one denial
// reads of the log is time every other tenant waits: a denial reads a
// bounded number of marks to tell its Retry-After, and the marks that
// stopped counting are read once, not again by every denial after. Both
// stores answer the same Retry-After: exact when the oldest maxRetryWalk
// marks free enough, else the time the last of them frees (a lower bound).
// Before, the walk to the Retry-After paged through the log from its start
// again for every page (a denial of 20,000 one-unit marks held Redis for
// seconds), and every denial summed every expired mark again.
func TestMarksAtkLongLogDenial(t *testing.T) {
	const n = 20000
	c := testRedis(t)
	ctx := context.Background()
	for _, algo := range []Algorithm{SlidingLog, Concurrency} {
		t.Run(algo.String(), func(t *testing.T) {
			clk := newClock()
			stores := bothStores(c, clk)
			d := newDiffRun(t, stores, clk)
			l := Limit{Name: "log", Algorithm: algo, Rate: n, Period: time.Hour}
			item := func(cost int64) []Item { return []Item{{Limit: l, Key: "{tenant}", Cost: cost}} }
			first := clk.Now()
			const step = 100 * time.Microsecond
			for i := range n {
				for _, s := range stores {
					if res, err := s.Debit(ctx, fmt.Sprint("m", i), item(1)); err != nil || !res.Allowed {
						t.Fatalf("%s: mark %d: %+v %v", s.name, i, res, err)
					}
				}
				clk.Advance(step)
			}
			// The mark debited at first + i*step stops counting a period
			// later: a sliding log's leaves the window, a concurrency
			// mark's lease ends.
			lag := l.Period
			freeAt := func(i int) time.Duration { return first.Add(time.Duration(i)*step + lag).Sub(clk.Now()) }

			// Exact: 100 units free when the 100th oldest mark stops counting.
			res, err := d.debit("need-100", item(100))
			if err != nil || res.Allowed || res.RetryAfter != freeAt(99) {
				t.Fatalf("a cost of 100 on a full log: %+v %v; want denied, Retry-After %s", res, err, freeAt(99))
			}
			// Past the walk: the whole log must free; the answer is when the
			// last mark walked frees, sooner than the exact one.
			before := scriptUsec(t, c)
			res, err = d.debit("need-all", item(n))
			took := time.Duration(scriptUsec(t, c)-before) * time.Microsecond
			t.Logf("a denial on %d marks held Redis %s", n, took)
			if took > 50*time.Millisecond {
				t.Errorf("a denial on %d marks held Redis %s: every other tenant waits that long", n, took)
			}
			if err != nil || res.Allowed || res.RetryAfter != freeAt(maxRetryWalk-1) {
				t.Fatalf("a cost of the whole log: %+v %v; want denied, Retry-After %s (the last mark walked)", res, err, freeAt(maxRetryWalk-1))
			}

			// All but the newest mark stop counting: the log holds 1, and a
			// cost of n is denied until the last frees. The first denials
			// after read the expired marks, maxTrim a call (until then
			// they are told to come again at once); the next ones must not
			// read them again.
			clk.Set(first.Add(time.Duration(n-2)*step + lag + time.Microsecond))
			before = scriptUsec(t, c)
			for k := 0; ; k++ {
				res, err := d.debit(fmt.Sprint("after-expiry", k), item(n))
				if err == nil && !res.Allowed && res.RetryAfter == time.Microsecond && k < (n-1)/maxTrim {
					continue // behind
				}
				if err != nil || res.Allowed || res.RetryAfter != freeAt(n-1) || k != (n-1)/maxTrim {
					t.Fatalf("a cost of %d with one mark left, call %d: %+v %v; want denied, Retry-After %s, at call %d", n, k, res, err, freeAt(n-1), (n-1)/maxTrim)
				}
				break
			}
			firstDenial := (scriptUsec(t, c) - before) / ((n-1)/maxTrim + 1)
			const more = 50
			before = scriptUsec(t, c)
			for i := range more {
				if res, err := d.debit(fmt.Sprint("again", i), item(n)); err != nil || res.Allowed {
					t.Fatalf("denial %d: %+v %v", i, res, err)
				}
			}
			later := (scriptUsec(t, c) - before) / more
			t.Logf("denials that dropped %d expired marks: %d µs each; the next %d: %d µs each", n-1, firstDenial, more, later)
			if later*5 > firstDenial {
				t.Errorf("each denial after the log caught up costs Redis %d µs, those before %d µs: every denial reads the expired marks again", later, firstDenial)
			}
			// The log still counts what it holds: the newest mark, then
			// nothing once it frees.
			if res, err := d.debit("fits", item(n-1)); err != nil || !res.Allowed {
				t.Fatalf("a cost of %d with one mark left: %+v %v; want admitted", n-1, res, err)
			}
		})
	}
}
