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
