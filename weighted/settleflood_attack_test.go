package weighted

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestBatchFaultAtkOneTenantFloodsWithSettlements: a tenant's debits may
// keep 16 script calls' worth waiting in a queue of the store (see
// queuedPerTag), but its settlements, which are never shed, were not
// bounded: a tenant that ended 400 reservations at once (the reserve
// API's settle, streams timed to end together) put every other tenant's
// debit behind all 400, past QueueTimeout, where it was shed (a 503, or
// UNAVAILABLE, which Envoy lets through). Another tenant's request now
// waits behind at most 16 script calls' worth of one tenant's calls,
// settlements included.
func TestBatchFaultAtkOneTenantFloodsWithSettlements(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	const maxBatch, flood = 4, 400
	lim := Limit{Name: "per-user", Rate: 1000, Period: time.Hour}
	items := func(tenant, user string) []Item {
		return []Item{{Limit: lim, Key: "{" + tenant + "}:user=" + user, Cost: 1}}
	}
	r := newBatchStore(c, newClock(), RedisConfig{MaxBatch: maxBatch})
	for i := range flood {
		if res, err := r.Debit(ctx, "e"+strconv.Itoa(i), items("evil", strconv.Itoa(i))); err != nil || !res.Allowed {
			t.Fatalf("evil's reservation %d: %+v %v", i, res, err)
		}
	}
	hold(r)
	var wg sync.WaitGroup
	for i := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Settle(ctx, "e"+strconv.Itoa(i), items("evil", strconv.Itoa(i)), []int64{2}); err != nil {
				t.Error(err)
			}
		}()
	}
	waitPending(t, r, flood)
	before := r.scriptCalls.Load()
	done := make(chan int64, 1)
	go func() {
		res, err := r.Debit(ctx, "victim", items("acme", "u"))
		if err != nil || !res.Allowed {
			t.Errorf("the victim's debit behind the settlements: %+v, %v", res, err)
		}
		done <- r.scriptCalls.Load() - before
	}()
	waitPending(t, r, flood+1)
	release(r)
	if calls := <-done; calls > 16+1+1 {
		t.Errorf("the victim's debit was answered after %d script calls of %d requests each, behind %d settlements of one tenant", calls, maxBatch, flood)
	}
	wg.Wait()
}
