package weighted

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestMarksAtkExpiredLogTrimIsBounded: a tenant fills its sliding log (or
// its concurrency limit) with many one-unit marks, lets them all stop
// counting, and sends one request. Redis runs one script at a time for
// every tenant, and a script call carries other tenants' requests (see
// Batching): what that one call does is time every other tenant waits.
// Before, the call dropped every expired mark at once: 300,000 held Redis
// about 250 ms, past every other tenant's CallTimeout (100 ms), so their
// requests failed as the store's (ErrUnknownOutcome) and opened the
// gate's breaker, which decides every tenant on its fallback. A call now
// drops maxTrim marks at most.
func TestMarksAtkExpiredLogTrimIsBounded(t *testing.T) {
	const n = 300000
	c := testRedis(t)
	ctx := context.Background()
	for _, algo := range []Algorithm{SlidingLog, Concurrency} {
		t.Run(algo.String(), func(t *testing.T) {
			clk := newClock()
			r := newRedisStore(c, clk)
			l := Limit{Name: "log", Algorithm: algo, Rate: 2 * n, Period: time.Minute}
			item := []Item{{Limit: l, Key: "{acme}", Cost: 1}}
			// The log as n debits of 1 leave it, written at once: members
			// "cost:id" scored by when they stop counting (a sliding log's
			// a period after its debit, a lease at its expiry), and the
			// member "" holding minus their sum (see lib.lua's marks_sum).
			key := r.key(&item[0])
			at := clk.Now().UnixMicro()
			if algo == Concurrency {
				at += l.Period.Microseconds()
			}
			p := c.Pipeline()
			for i := 0; i < n; i += 1000 {
				zs := make([]redis.Z, 0, 1000)
				for j := i; j < i+1000; j++ {
					zs = append(zs, redis.Z{Score: float64(at + int64(j%1000)), Member: fmt.Sprintf("1:m%d", j)})
				}
				p.ZAdd(ctx, key, zs...)
			}
			p.ZAdd(ctx, key, redis.Z{Score: -n, Member: ""})
			if _, err := p.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			if res, err := r.Peek(ctx, item); err != nil || res.Items[0].Remaining != n {
				t.Fatalf("peek of the full log: %+v %v; want %d remaining", res, err, n)
			}

			clk.Advance(3 * l.Period) // every mark stopped counting
			before := scriptUsec(t, c)
			res, err := r.Debit(ctx, "after", item)
			took := time.Duration(scriptUsec(t, c)-before) * time.Microsecond
			t.Logf("one debit on %d expired marks held Redis %s: %+v %v", n, took, res, err)
			if took > 50*time.Millisecond {
				t.Errorf("one debit on %d expired marks held Redis %s: every other tenant's request waits that long", n, took)
			}
			if err != nil || !res.Allowed {
				t.Fatalf("a debit of 1 on a log of %d, all expired: %+v %v; want admitted", 2*n, res, err)
			}
		})
	}
}

// TestMarksTrimCatchUp: a log whose expired marks are more than one call
// drops (maxTrim) counts those left over until later calls drop them: it
// refuses early, never late, tells the refused to come again at once
// (RetryAfter 1 µs), and after a few calls counts exactly again. Settles
// and restores of the log meanwhile charge in full. Both stores agree at
// every step.
func TestMarksTrimCatchUp(t *testing.T) {
	const n = 3*maxTrim + 100
	c := testRedis(t)
	for _, algo := range []Algorithm{SlidingLog, Concurrency} {
		t.Run(algo.String(), func(t *testing.T) {
			clk := newClock()
			d := newDiffRun(t, bothStores(c, clk), clk)
			l := Limit{Name: "log", Algorithm: algo, Rate: n + 1000, Period: time.Hour}
			item := func(cost int64) []Item { return []Item{{Limit: l, Key: "{tenant}", Cost: cost}} }
			for i := range n {
				if res, err := d.debit(fmt.Sprint("m", i), item(1)); err != nil || !res.Allowed {
					t.Fatalf("mark %d: %+v %v", i, res, err)
				}
				clk.Advance(time.Microsecond)
			}
			// A reservation that still counts, charged more later.
			if res, err := d.debit("held", item(10)); err != nil || !res.Allowed {
				t.Fatalf("held: %+v %v", res, err)
			}
			clk.Advance(l.Period - time.Microsecond)
			// Every mark but held's stopped counting: the log counts 10.
			// Behind, it counts more until later calls drop the rest.
			calls := 0
			for {
				res, err := d.debit(fmt.Sprint("big", calls), item(l.Rate-15))
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					break
				}
				if calls++; calls > n/maxTrim+1 || res.Items[0].RetryAfter > time.Microsecond {
					t.Fatalf("denial %d on a log behind: %+v; want RetryAfter 1 µs at most, within %d calls", calls, res, n/maxTrim+1)
				}
				if calls == 1 {
					// Behind, held settles at 15 (a sliding log's), or ends
					// (a concurrency limit's).
					if err := d.end("held", item(10), []int64{15}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if calls == 0 {
				t.Fatalf("the first debit after %d marks expired was admitted: the log was not behind", n)
			}
			// Exact again: held's 15 and the big debit fill a sliding log;
			// a concurrency limit holds the big debit only.
			want := int64(0)
			if algo == Concurrency {
				want = 15
			}
			res, err := d.peek(item(1))
			if err != nil || res.Items[0].Remaining != want {
				t.Fatalf("after %d denials: %+v %v; want %d remaining", calls, res, err, want)
			}
		})
	}
}

// TestMarksAtkManyLogsOneRequest: a request of many sliding logs (a rate
// limit service request has up to 64 descriptors, each a counter of its
// own), each holding thousands of marks that stopped counting. With a
// bound per key, the request dropped 1,024 marks of each, 65,536 in one
// call (about 60 ms of Redis unloaded, every other tenant waiting, its
// batch's requests with it); the bound is the request's, all its keys
// together: it drops maxTrim marks, and the logs it did not reach count
// their expired marks until later requests drop them.
func TestMarksAtkManyLogsOneRequest(t *testing.T) {
	const logs, per = 64, 4096
	c := testRedis(t)
	ctx := context.Background()
	clk := newClock()
	r := newRedisStore(c, clk)
	l := Limit{Name: "desc", Algorithm: SlidingLog, Rate: per, Period: time.Minute}
	items := make([]Item, logs)
	keys := make([]string, logs)
	at := clk.Now().UnixMicro()
	p := c.Pipeline()
	for i := range items {
		items[i] = Item{Limit: l, Key: fmt.Sprintf("{acme}v%d", i), Cost: 1}
		keys[i] = r.key(&items[i])
		for j := 0; j < per; j += 1024 {
			zs := make([]redis.Z, 0, 1024)
			for m := j; m < j+1024; m++ {
				zs = append(zs, redis.Z{Score: float64(at + int64(m)), Member: fmt.Sprintf("1:m%d", m)})
			}
			p.ZAdd(ctx, keys[i], zs...)
		}
		p.ZAdd(ctx, keys[i], redis.Z{Score: -per, Member: ""})
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	marks := func() int64 {
		var n int64
		for _, k := range keys {
			n += c.ZCard(ctx, k).Val()
		}
		return n
	}
	before := marks()
	clk.Advance(3 * l.Period) // every mark stopped counting
	usec := scriptUsec(t, c)
	res, err := r.Debit(ctx, "many", items)
	took := time.Duration(scriptUsec(t, c)-usec) * time.Microsecond
	dropped := before - marks()
	t.Logf("one request of %d logs of %d expired marks dropped %d marks and held Redis %s: allowed %v %v", logs, per, dropped, took, res.Allowed, err)
	if err != nil {
		t.Fatal(err)
	}
	if dropped > maxTrim {
		t.Errorf("one request dropped %d marks (Redis held %s): every other tenant waits for it; want %d at most", dropped, took, maxTrim)
	}
	// The logs it did not reach count their expired marks: full, they
	// refuse the request, and say to come again at once.
	if res.Allowed || res.RetryAfter != time.Microsecond {
		t.Errorf("a request of %d logs, %d of them behind and full: %v, RetryAfter %s; want refused, 1µs", logs, logs-1, res.Allowed, res.RetryAfter)
	}
}
