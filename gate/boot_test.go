package gate

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// TestBootScanCutShortIsMadeAgain: a check that finds another Redis's
// run_id and cannot delete every generation marker (here SCAN is refused
// to its user; in production a timeout or a store that fails mid-scan)
// leaves the old run_id, so that the next check deletes them. Before, the
// run_id was swapped first: the next check found it current and left the
// rolled-back counters trusted.
func TestBootScanCutShortIsMadeAgain(t *testing.T) {
	srv := redistest.New(t)
	ctx := context.Background()
	c := srv.Client(t)
	if err := c.Do(ctx, "ACL", "SETUSER", "noscan", "on", ">pw", "~*", "+@all", "-scan").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Do(context.Background(), "ACL", "DELUSER", "noscan") })
	opt, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opt.Username, opt.Password = "noscan", "pw"
	noscan := redis.NewClient(opt)
	defer noscan.Close()
	const marker = "cg:g:{acme}"
	if err := c.MSet(ctx, bootKey, "an-older-run", marker, "7").Err(); err != nil {
		t.Fatal(err)
	}
	check := func(c *redis.Client) error {
		g := &Gate{redis: c, markerMatch: "cg:g:{*", log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		return g.checkBoot(ctx)
	}
	if err := check(noscan); err == nil {
		t.Fatal("a check whose SCAN is refused reported no error")
	}
	if got := c.Get(ctx, bootKey).Val(); got != "an-older-run" {
		t.Fatalf("after a check cut short, %s holds %q: the next check would find the markers current", bootKey, got)
	}
	if err := check(c); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, marker).Val(); n != 0 {
		t.Fatal("the next check left the marker of a Redis that restarted")
	}
	info := c.Info(ctx, "server").Val()
	if got := c.Get(ctx, bootKey).Val(); got != infoField(info, "run_id") {
		t.Fatalf("%s holds %q after a whole check, want the run_id", bootKey, got)
	}
	// The same Redis checked again: its markers are kept.
	c.Set(ctx, marker, "8", 0)
	if err := check(c); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, marker).Val(); n != 1 {
		t.Fatal("a check of the same Redis deleted a marker")
	}
}

// TestBootClusterPrimaryRestarted: on a Redis Cluster, each primary keeps
// its run_id in a key of its own slots, and a primary found with another
// (here the first, whose key says it restarted) has its generation
// markers deleted, the other primaries' kept. Before, a Cluster was not
// checked: a primary restarted on an older snapshot kept its rolled-back
// markers, which a replica that never saw newer ones trusted.
func TestBootClusterPrimaryRestarted(t *testing.T) {
	cl := redistest.NewCluster(t)
	c := cl.Client(t)
	ctx := context.Background()
	g := &Gate{redis: c, markerMatch: "cg:g:{*", log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := g.checkBoot(ctx); err != nil {
		t.Fatal(err)
	}
	// A marker in a slot of each primary (0-5460, 5461-10922, 10923-16383).
	markers := []string{"cg:g:{" + slotTag(100) + "}", "cg:g:{" + slotTag(6000) + "}", "cg:g:{" + slotTag(12000) + "}"}
	for i, m := range markers {
		if n := cl.Node(t, int(crc16([]byte(m[6:len(m)-1]))%16384)); n != i {
			t.Fatalf("marker %s is on primary %d, want %d", m, n, i)
		}
		if err := c.Set(ctx, m, "7", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Checked again, the same primaries: every marker is kept.
	if err := g.checkBoot(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range markers {
		if c.Exists(ctx, m).Val() != 1 {
			t.Fatalf("a check of primaries that did not restart deleted %s", m)
		}
	}
	// The first primary's key says another run: it restarted since.
	key := bootKey + ":{" + slotTag(0) + "}"
	if c.Get(ctx, key).Val() == "" {
		t.Fatalf("the first primary's run_id is not in %s", key)
	}
	if err := c.Set(ctx, key, "an-older-run", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.checkBoot(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Exists(ctx, markers[0]).Val() != 0 {
		t.Fatal("the marker of the primary that restarted is kept")
	}
	for _, m := range markers[1:] {
		if c.Exists(ctx, m).Val() != 1 {
			t.Fatalf("the marker %s of a primary that did not restart is deleted", m)
		}
	}
	if got := c.Get(ctx, key).Val(); got == "an-older-run" {
		t.Fatal("the restarted primary's new run_id is not written")
	}
}
