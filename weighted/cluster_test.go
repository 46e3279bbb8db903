package weighted

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// TestCluster runs on a real three-primary Redis Cluster.
func TestCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	cc := cl.Client(t)
	ctx := context.Background()

	tokens := Limit{Name: "tokens", Rate: 1000, Period: time.Minute}
	requests := Limit{Name: "requests", Algorithm: FixedWindow, Rate: 50, Period: time.Minute}
	inflight := Limit{Name: "inflight", Algorithm: Concurrency, Rate: 40, Period: time.Minute}
	global := Limit{Name: "global", Algorithm: SlidingWindow, Rate: 300, Period: time.Minute}
	model := Limit{Name: "model", Algorithm: SlidingLog, Rate: 200, Period: time.Minute}
	request := func(tenant string, cost int64) []Item {
		return []Item{
			{Limit: tokens, Key: "{" + tenant + "}", Cost: cost},
			{Limit: requests, Key: "{" + tenant + "}", Cost: 1},
			{Limit: inflight, Key: "{" + tenant + "}", Cost: 1},
			{Limit: global, Key: "all", Cost: cost},
			{Limit: model, Key: "model=gpt-4o", Cost: 1},
		}
	}

	t.Run("keys of a scope share a slot", func(t *testing.T) {
		r := newRedisStore(cc, nil)
		gs := r.groups(request("acme", 1))
		if len(gs) != 3 {
			t.Fatalf("%d groups, want 3 (acme, all, model=gpt-4o): %+v", len(gs), gs)
		}
		for _, g := range gs {
			slot := cc.ClusterKeySlot(ctx, g.keys[0]).Val()
			for _, k := range append(g.keys, r.recordKey(g.tag, "id")) {
				if s := cc.ClusterKeySlot(ctx, k).Val(); s != slot {
					t.Fatalf("key %s in slot %d, its group's first key in %d", k, s, slot)
				}
			}
		}
		nodes := map[int]bool{}
		for _, g := range gs {
			nodes[cl.Node(t, int(cc.ClusterKeySlot(ctx, g.keys[0]).Val()))] = true
		}
		if len(nodes) < 2 {
			t.Fatalf("all groups on one primary: the test would not cross nodes")
		}
	})

	t.Run("a later slot's denial is compensated", func(t *testing.T) {
		clk := newClock()
		r := newRedisStore(cc, clk)
		tight := Limit{Name: "tight", Rate: 10, Period: time.Hour}
		items := []Item{
			{Limit: tokens, Key: "{acme}", Cost: 100},
			{Limit: inflight, Key: "{acme}", Cost: 1},
			{Limit: tight, Key: "{zeta}", Cost: 8}, // "zeta" sorts after "acme"
		}
		if res, err := r.Debit(ctx, "a", items); err != nil || !res.Allowed {
			t.Fatalf("first debit: %+v %v", res, err)
		}
		res, err := r.Debit(ctx, "b", items)
		if err != nil || res.Allowed || res.Decider != 2 {
			t.Fatalf("second debit: want denied by tight, got %+v %v", res, err)
		}
		// The acme group was debited, then refunded and released: it shows
		// only the first request.
		if res.Items[0].Remaining != 900 || res.Items[1].Remaining != 39 {
			t.Fatalf("reported state after compensation: %+v", res.Items)
		}
		peek, err := r.Peek(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		if got := [3]int64{peek.Items[0].Remaining, peek.Items[1].Remaining, peek.Items[2].Remaining}; got != [3]int64{900, 39, 2} {
			t.Fatalf("remaining after a compensated denial: %v, want [900 39 2]", got)
		}
		// The compensation left no record of b on the acme slot, as a
		// denial on one node leaves none: b debited again later (see
		// TestLeasedRegainSettlesOnEveryGroup) settles there.
		if n, err := cc.Exists(ctx, r.recordKey("acme", "b")).Result(); err != nil || n != 0 {
			t.Fatalf("b's record on the acme slot after its compensation: %d %v", n, err)
		}
		if err := r.Cancel(ctx, "a", items); err != nil {
			t.Fatal(err)
		}
		if peek, _ := r.Peek(ctx, items); !peek.Allowed || peek.Items[0].Remaining != 1000 || peek.Items[1].Remaining != 40 || peek.Items[2].Remaining != 10 {
			t.Fatalf("after cancelling a: %+v", peek.Items)
		}
		if err := r.Reset(ctx, items); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("an empty key and one that starts with a brace", func(t *testing.T) {
		// A limit without dimensions has the key "": its Redis key must
		// still carry a hash tag, or its record lands on another slot.
		r := newRedisStore(cc, nil)
		win := Limit{Name: "global-window", Algorithm: SlidingWindow, Rate: 100, Period: time.Minute}
		for _, key := range []string{"", "}odd"} {
			items := []Item{{Limit: win, Key: key, Cost: 3}, {Limit: tokens, Key: key, Cost: 5}}
			if res, err := r.Debit(ctx, "empty-"+key, items); err != nil || !res.Allowed {
				t.Fatalf("debit of key %q: %+v %v", key, res, err)
			}
			if err := r.Settle(ctx, "empty-"+key, items, []int64{1, 2}); err != nil {
				t.Fatalf("settle of key %q: %v", key, err)
			}
		}
	})

	t.Run("a claim in its items' slot", func(t *testing.T) {
		r := newRedisStore(cc, nil)
		one := []Item{{Limit: tokens, Key: "{claims}", Cost: 5}, {Limit: requests, Key: "{claims}", Cost: 1}}
		if res, err := r.Debit(ctx, "c1", one); err != nil || !res.Allowed {
			t.Fatalf("debit: %+v %v", res, err)
		}
		if _, _, err := r.SettleClaimed(ctx, "c1", one, []int64{2, 1}, Claim{Key: "{elsewhere}:held:c1", Value: "s", TTL: time.Minute}); !errors.Is(err, ErrUnclaimable) {
			t.Fatalf("a claim key in another slot: %v, want ErrUnclaimable", err)
		}
		if won, _, err := r.SettleClaimed(ctx, "c1", one, []int64{2, 1}, Claim{Key: "{claims}:held:c1", Value: "s", TTL: time.Minute}); err != nil || !won {
			t.Fatalf("a claim in the items' slot: won %v, %v", won, err)
		}
		if won, prior, err := r.SettleClaimed(ctx, "c1", one, nil, Claim{Key: "{claims}:held:c1", Value: "r", TTL: time.Minute}); err != nil || won || prior != "s" {
			t.Fatalf("a second claim: won %v, prior %q, %v", won, prior, err)
		}
		checkRemaining(t, r, one[:1], 2)
		spread := request("claims", 1)
		if res, err := r.Debit(ctx, "c2", spread); err != nil || !res.Allowed {
			t.Fatalf("debit: %+v %v", res, err)
		}
		if _, _, err := r.SettleClaimed(ctx, "c2", spread, nil, Claim{Key: "{claims}:held:c2", Value: "r", TTL: time.Minute}); !errors.Is(err, ErrUnclaimable) {
			t.Fatalf("items over three slots: %v, want ErrUnclaimable", err)
		}
		if err := r.Cancel(ctx, "c2", spread); err != nil {
			t.Fatal(err)
		}
		for _, items := range [][]Item{one, spread} {
			if err := r.Reset(ctx, items); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("leases renewed across slots", func(t *testing.T) {
		clk := newClock()
		r := newRedisStore(cc, clk)
		one := Limit{Name: "one-stream", Algorithm: Concurrency, Rate: 1, Period: time.Second}
		items := []Item{
			{Limit: one, Key: "{acme}", Cost: 1},
			{Limit: tokens, Key: "{acme}", Cost: 5},
			{Limit: one, Key: "{zeta}", Cost: 1},
		}
		if gs := r.groups(items); len(gs) != 2 {
			t.Fatalf("%d groups, want 2", len(gs))
		}
		t0 := clk.Now()
		at := func(d time.Duration) { clk.Set(t0.Add(d)) }
		if res, err := r.Debit(ctx, "lease-a", items); err != nil || !res.Allowed {
			t.Fatalf("debit a: %+v %v", res, err)
		}
		for _, d := range []time.Duration{600 * time.Millisecond, 1200 * time.Millisecond} {
			at(d)
			if err := r.Renew(ctx, "lease-a", items); err != nil {
				t.Fatalf("renew at %v: %v", d, err)
			}
		}
		// Past a's first lease, both slots are still a's.
		at(1500 * time.Millisecond)
		res, err := r.Peek(ctx, items)
		if err != nil || res.Allowed || res.Items[0].Allowed || res.Items[2].Allowed {
			t.Fatalf("at 1.5s, with a's leases renewed: %+v %v, want both slots held", res, err)
		}
		if err := r.Settle(ctx, "lease-a", items, []int64{1, 5, 1}); err != nil {
			t.Fatal(err)
		}
		if err := r.Renew(ctx, "lease-a", items); err != nil {
			t.Fatal(err)
		}
		if res, err := r.Debit(ctx, "lease-b", items); err != nil || !res.Allowed {
			t.Fatalf("debit b after a settled (and a renewed after): %+v %v", res, err)
		}
	})

	t.Run("200 goroutines across three slots", func(t *testing.T) {
		r := newRedisStore(cc, newClock())
		// Costs are set by the goroutines: inflight (40) runs out first.
		// Compensations can deny a goroutine while another's reservation is
		// being returned, so the racers may stop short; the drain after
		// them must find exactly the rest.
		items := request("acme", 0)
		admitted := raceDebits(t, r, items, 200)
		drained := drain(t, r, items)
		if admitted+drained != minCapacity(items) {
			t.Fatalf("admitted %d racing and %d after, want %d in all", admitted, drained, minCapacity(items))
		}
		checkRemaining(t, r, items, minCapacity(items))
	})

	t.Run("debits while a slot migrates", func(t *testing.T) {
		r := newRedisStore(cc, newClock())
		items := request("mig", 0)
		key := r.key(&items[0])
		slot := int(cc.ClusterKeySlot(ctx, key).Val())
		var admitted atomic.Int64
		var seq atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Go(func() {
				mine := request("mig", 1)
				for {
					select {
					case <-stop:
						return
					default:
					}
					res, err := r.Debit(ctx, fmt.Sprint("m", seq.Add(1)), mine)
					if err != nil {
						errs <- err
						return
					}
					if res.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		// Move the slot in steps, so that debits meet keys split between
		// nodes (TRYAGAIN), a slot whose keys have all left (ASK), and
		// finally a stale slot map (MOVED). Each step lasts until the
		// debits have met its reply (or 10s): batched debits of one hash
		// tag wait for each other, and a batch told TRYAGAIN waits out
		// go-redis's backoff before it tries again.
		before := errorStats(t, cl)
		met := func(e string) {
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if errorStats(t, cl)[e] > before[e] {
					return
				}
			}
		}
		// A second client that learns the slot map before the migration
		// ends, and is used once after it: its map is stale then, so it
		// meets MOVED even when the racing client's map was refreshed
		// while the nodes converged.
		late := NewRedis(cl.Client(t), patient(RedisConfig{Prefix: r.prefix}))
		if _, err := late.Peek(ctx, items); err != nil {
			t.Fatal(err)
		}
		m := cl.StartMigration(t, slot, (cl.Node(t, slot)+1)%3)
		m.MoveKeys(t, 1)
		met("TRYAGAIN")
		for m.MoveKeys(t, 100) > 0 {
		}
		met("ASK")
		m.Finish(t)
		met("MOVED")
		if _, err := late.Peek(ctx, items); err != nil {
			t.Fatalf("peek with a stale slot map: %v", err)
		}
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("debit during the migration: %v", err)
		}
		if admitted.Load() == 0 {
			t.Fatal("nothing admitted during the migration")
		}
		after := errorStats(t, cl)
		t.Logf("error replies during the migration: before %v, after %v", before, after)
		for _, e := range []string{"TRYAGAIN", "ASK", "MOVED"} {
			if after[e] <= before[e] {
				t.Errorf("no %s reply during the migration: the test did not exercise it (%v)", e, after)
			}
		}
		n := admitted.Load() + drain(t, r, items)
		if n != minCapacity(items) {
			t.Fatalf("admitted %d in all, want %d", n, minCapacity(items))
		}
		checkRemaining(t, r, items, minCapacity(items))
	})
}

// drain debits items at cost 1 until denied and returns how many it
// admitted.
func drain(t *testing.T, s Store, items []Item) int64 {
	t.Helper()
	mine := append([]Item(nil), items...)
	for i := range mine {
		mine[i].Cost = 1
	}
	var n int64
	for {
		res, err := s.Debit(context.Background(), fmt.Sprint("drain", n), mine)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			return n
		}
		n++
	}
}

// checkRemaining requires that every item's limit lost exactly used units.
func checkRemaining(t *testing.T, s Store, items []Item, used int64) {
	t.Helper()
	res, err := s.Peek(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range res.Items {
		if want := items[i].Limit.Capacity() - used; it.Remaining != want {
			t.Fatalf("%s: remaining %d, want %d", items[i].Limit.Name, it.Remaining, want)
		}
	}
}

func minCapacity(items []Item) int64 {
	c := items[0].Limit.Capacity()
	for _, it := range items {
		c = min(c, it.Limit.Capacity())
	}
	return c
}

// errorStats sums the error replies of every primary by their prefix, from
// INFO errorstats.
func errorStats(t *testing.T, cl *redistest.Cluster) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, addr := range cl.Addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		info, err := c.Info(context.Background(), "errorstats").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			// errorstat_ASK:count=12
			name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "errorstat_"), ":count=")
			if n, err := strconv.Atoi(rest); ok && err == nil {
				out[name] += n
			}
		}
	}
	return out
}
