package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/servicetest"
)

// Cluster is a private Redis Cluster of three primaries (no replicas) on
// loopback ports, holding slots 0-5460, 5461-10922 and 10923-16383.
type Cluster struct {
	// Addrs are the primaries' host:port, in slot order.
	Addrs []string
	ids   []string
	logs  []string // the nodes' log files
}

// NewCluster starts a Cluster for t and stops it when t ends. It needs
// redis-server on PATH; without it the test fails under CI and is skipped
// elsewhere.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		servicetest.Unavailable(t, "redis-server is not on PATH, needed for a Redis Cluster")
	}
	c := &Cluster{}
	var buses []int
	for range 3 {
		addr, bus, log, err := startClusterNode(t)
		if err != nil {
			t.Fatalf("redistest: cluster node: %v", err)
		}
		c.Addrs = append(c.Addrs, addr)
		c.logs = append(c.logs, log)
		buses = append(buses, bus)
	}
	// A failed test shows what the nodes logged of the cluster's
	// configuration: who owned which slot at which epoch. (Registered
	// after the nodes' temporary directories, so it runs before they go.)
	t.Cleanup(func() {
		if t.Failed() {
			c.logConfig(t)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	for i, addr := range c.Addrs {
		n := redis.NewClient(&redis.Options{Addr: addr})
		id, err := n.ClusterMyID(ctx).Result()
		if err == nil {
			// Each primary gets a config epoch of its own before it meets
			// the others, as redis-cli --cluster create gives them. Left
			// at 0, the nodes resolve the collisions by gossip, one bump
			// at a time, and one resolved while a slot migrates can give
			// its source an epoch above the target's: the target then
			// hands the slot back and drops its keys (seen once in CI:
			// TestCluster's migration admitted a concurrency limit
			// twice over, on a slot emptied under it).
			err = n.Do(ctx, "cluster", "set-config-epoch", i+1).Err()
		}
		if err == nil {
			err = n.ClusterAddSlotsRange(ctx, ranges[i][0], ranges[i][1]).Err()
		}
		if err == nil && i > 0 {
			// The bus port is not port+10000, so MEET must name it.
			host, port, _ := splitAddr(c.Addrs[0])
			err = n.Do(ctx, "cluster", "meet", host, port, buses[0]).Err()
		}
		n.Close()
		if err != nil {
			t.Fatalf("redistest: cluster setup on %s: %v", addr, err)
		}
		c.ids = append(c.ids, id)
	}
	c.waitConsistent(t, ctx)
	return c
}

// logConfig logs the lines of the nodes' logs about the cluster's
// configuration.
func (c *Cluster) logConfig(t testing.TB) {
	t.Helper()
	for i, path := range c.logs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Logf("redistest: node %d's log: %v", i, err)
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			// Not a client's connection, whose last command may name a slot.
			if strings.Contains(l, " addr=") {
				continue
			}
			if strings.Contains(l, "poch") || strings.Contains(strings.ToLower(l), "slot") {
				t.Logf("redistest: node %d (%s): %s", i, c.Addrs[i], l)
			}
		}
	}
}

// startClusterNode starts one cluster-enabled redis-server on free ports for
// its clients and its cluster bus, stopped when t ends (before its
// directory is removed, which it writes to), and returns its address, bus
// port and log file.
func startClusterNode(t testing.TB) (string, int, string, error) {
	var lastErr error
	for range 5 {
		port, bus := servicetest.FreePort(t), servicetest.FreePort(t)
		if port == bus {
			continue
		}
		dir := t.TempDir()
		cmd := exec.Command("redis-server",
			"--port", strconv.Itoa(port),
			"--cluster-port", strconv.Itoa(bus),
			"--bind", "127.0.0.1",
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "5000",
			"--save", "",
			"--appendonly", "no",
			"--dir", dir,
			"--logfile", filepath.Join(dir, "redis.log"),
			"--loglevel", "verbose", // epoch collisions are logged at verbose
		)
		if err := cmd.Start(); err != nil {
			return "", 0, "", err
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := waitOwn(addr, cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			lastErr = fmt.Errorf("%v: %s", err, log)
			continue
		}
		return addr, bus, filepath.Join(dir, "redis.log"), nil
	}
	return "", 0, "", lastErr
}

// waitOwn waits up to 5 s until the redis-server at addr answers and is
// process pid. A free port is found before the server binds it, so another
// test's server (another package's, run at the same time) may have taken
// it: the server started then fails to bind and exits, and the one that
// answers is the other's, whose keys the test would share.
func waitOwn(addr string, pid int) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		var info string
		info, err = c.Info(ctx, "server").Result()
		cancel()
		if err != nil {
			continue
		}
		if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
			return fmt.Errorf("port of %s taken by another redis-server (process %s)", addr, got)
		}
		return nil
	}
	return err
}

// infoField is the value of field in an INFO reply.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// waitConsistent waits until every node reports the cluster ok and sees
// every node with the slots the others see.
func (c *Cluster) waitConsistent(t testing.TB, ctx context.Context) {
	t.Helper()
	for {
		ok, last := c.consistent(ctx)
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: cluster did not become consistent: %s", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// consistent reports whether every node reports the cluster ok and sees
// every node with the slots the others see; when not, why.
func (c *Cluster) consistent(ctx context.Context) (bool, string) {
	ok, last := true, ""
	var views []string
	for _, addr := range c.Addrs {
		n := redis.NewClient(&redis.Options{Addr: addr})
		info, err1 := n.ClusterInfo(ctx).Result()
		nodes, err2 := n.ClusterNodes(ctx).Result()
		n.Close()
		if err1 != nil || err2 != nil {
			ok, last = false, fmt.Sprint(err1, err2)
			continue
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
			ok, last = false, info
		}
		views = append(views, slotView(nodes))
	}
	for _, v := range views {
		if v != views[0] {
			ok, last = false, "the nodes see different slot maps:\n"+strings.Join(views, "\n--\n")
		}
	}
	return ok, last
}

// slotView is a node's CLUSTER NODES output reduced to "id slots" per node,
// sorted, so that views of different nodes compare.
func slotView(nodes string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(l)
		if len(f) < 8 {
			continue
		}
		lines = append(lines, f[0]+" "+strings.Join(f[8:], " "))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// Client returns a cluster client for c, closed when t ends. It follows up
// to 64 redirects, TRYAGAIN retries included (go-redis counts them alike,
// with a backoff of up to half a second between them), so that a command
// outlasts a slot migration step even on a loaded machine: with 16, one
// ran out during a step of TestCluster and returned its last MOVED.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, MaxRedirects: 64, PoolSize: 64})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Node returns the index in Addrs of the primary that owns slot.
func (c *Cluster) Node(t testing.TB, slot int) int {
	t.Helper()
	n := redis.NewClient(&redis.Options{Addr: c.Addrs[0]})
	defer n.Close()
	slots, err := n.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatalf("redistest: cluster slots: %v", err)
	}
	for _, s := range slots {
		if slot >= s.Start && slot <= s.End && len(s.Nodes) > 0 {
			for i, id := range c.ids {
				if s.Nodes[0].ID == id {
					return i
				}
			}
		}
	}
	t.Fatalf("redistest: no node owns slot %d", slot)
	return -1
}

// Migration is a slot being moved between two primaries, as redis-cli
// --cluster reshard moves it: the slot is importing on the target and
// migrating on the source, its keys move in batches, and Finish assigns it
// to the target everywhere. While it runs, clients get ASK and TRYAGAIN
// replies for the slot.
type Migration struct {
	c        *Cluster
	slot     int
	from, to int
}

// StartMigration puts slot in migration from its owner to primary to.
func (c *Cluster) StartMigration(t testing.TB, slot, to int) *Migration {
	t.Helper()
	m := &Migration{c: c, slot: slot, from: c.Node(t, slot), to: to}
	if m.from == to {
		t.Fatalf("redistest: slot %d is already on node %d", slot, to)
	}
	m.do(t, to, "cluster", "setslot", slot, "importing", c.ids[m.from])
	m.do(t, m.from, "cluster", "setslot", slot, "migrating", c.ids[to])
	return m
}

// MoveKeys moves up to n of the slot's keys still on the source, and
// reports how many it moved.
func (m *Migration) MoveKeys(t testing.TB, n int) int {
	t.Helper()
	ctx := context.Background()
	src := redis.NewClient(&redis.Options{Addr: m.c.Addrs[m.from]})
	defer src.Close()
	keys, err := src.ClusterGetKeysInSlot(ctx, m.slot, n).Result()
	if err != nil {
		t.Fatalf("redistest: getkeysinslot: %v", err)
	}
	if len(keys) == 0 {
		return 0
	}
	host, port, _ := splitAddr(m.c.Addrs[m.to])
	args := []any{"migrate", host, port, "", 0, 5000, "keys"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := src.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("redistest: migrate: %v", err)
	}
	return len(keys)
}

// Finish moves the remaining keys and gives the slot to the target on every
// primary.
func (m *Migration) Finish(t testing.TB) {
	t.Helper()
	for m.MoveKeys(t, 100) > 0 {
	}
	// The slot's owner is told to every primary; should gossip of an older
	// epoch win on one of them (seen once in some tens of runs on a loaded
	// machine, before the primaries were given epochs of their own at the
	// start: the nodes kept different slot maps), telling them again
	// settles it, as redis-cli --cluster fix does.
	var last string
	for range 4 {
		for _, i := range []int{m.to, m.from, 3 - m.to - m.from} {
			m.do(t, i, "cluster", "setslot", m.slot, "node", m.c.ids[m.to])
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for {
			var ok bool
			if ok, last = m.c.consistent(ctx); ok {
				cancel()
				return
			}
			if ctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
	}
	t.Fatalf("redistest: cluster did not become consistent after the migration: %s", last)
}

func (m *Migration) do(t testing.TB, node int, args ...any) {
	t.Helper()
	n := redis.NewClient(&redis.Options{Addr: m.c.Addrs[node]})
	defer n.Close()
	if err := n.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("redistest: %v on node %d: %v", args, node, err)
	}
}
