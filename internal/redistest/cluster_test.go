package redistest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

func TestClusterServesAndMigrates(t *testing.T) {
	ctx := context.Background()
	cl := redistest.NewCluster(t)
	c := cl.Client(t)
	keys := []string{"a", "b", "c", "d", "e", "f"}
	owners := map[int]bool{}
	for _, k := range keys {
		if err := c.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatal(err)
		}
		owners[cl.Node(t, int(c.ClusterKeySlot(ctx, k).Val()))] = true
	}
	if len(owners) < 2 {
		t.Fatalf("keys %v all on one primary", keys)
	}
	slot := int(c.ClusterKeySlot(ctx, "a").Val())
	from := cl.Node(t, slot)
	m := cl.StartMigration(t, slot, (from+1)%3)
	m.Finish(t)
	if got := cl.Node(t, slot); got != (from+1)%3 {
		t.Fatalf("slot %d on node %d after migrating it to %d", slot, got, (from+1)%3)
	}
	// The nodes agree on the slot's new owner by gossip: a node that has
	// not heard yet may answer for a slot it gave away, for a moment.
	for _, k := range keys {
		v, err := c.Get(ctx, k).Result()
		for deadline := time.Now().Add(5 * time.Second); (err != nil || v != k) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			v, err = c.Get(ctx, k).Result()
		}
		if err != nil || v != k {
			t.Fatalf("get %s after the migration: %q %v", k, v, err)
		}
	}
}

// TestClusterEpochsAreDistinct requires each primary's config epoch to be
// its own from the start, as redis-cli --cluster create leaves them: with
// a collision left to gossip, a migration that ends while it is resolved
// can hand the slot back to its source, which drops the target's keys.
func TestClusterEpochsAreDistinct(t *testing.T) {
	cl := redistest.NewCluster(t)
	for i, addr := range cl.Addrs {
		n := redis.NewClient(&redis.Options{Addr: addr})
		nodes, err := n.ClusterNodes(context.Background()).Result()
		n.Close()
		if err != nil {
			t.Fatal(err)
		}
		epochs := map[string]bool{}
		for _, l := range strings.Split(strings.TrimSpace(nodes), "\n") {
			f := strings.Fields(l)
			if len(f) < 8 || !strings.Contains(f[2], "master") {
				t.Fatalf("node %d: CLUSTER NODES line %q", i, l)
			}
			if f[6] == "0" || epochs[f[6]] {
				t.Fatalf("node %d sees config epochs that are not distinct and set:\n%s", i, nodes)
			}
			epochs[f[6]] = true
		}
		if len(epochs) != 3 {
			t.Fatalf("node %d sees %d primaries:\n%s", i, len(epochs), nodes)
		}
	}
}
