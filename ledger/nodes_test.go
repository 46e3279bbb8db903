package ledger_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// loseNode closes nothing: it destroys the node id and spool of cfg.Dir, as
// when a replica is deleted with its volume, and returns the config of
// another node on the same store. With PostgreSQL that node has a data
// directory of its own; the embedded store lives in Dir, so the new node
// takes over Dir, keeping only the database.
func loseNode(t *testing.T, cfg ledger.Config) (dead string, next ledger.Config) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cfg.Dir, "node"))
	if err != nil {
		t.Fatal(err)
	}
	dead = strings.TrimSpace(string(b))
	next = cfg
	if cfg.DSN != "" {
		if err := os.RemoveAll(cfg.Dir); err != nil {
			t.Fatal(err)
		}
		next.Dir = t.TempDir()
		return dead, next
	}
	for _, f := range []string{"node", "spool"} {
		if err := os.RemoveAll(filepath.Join(cfg.Dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return dead, next
}

func nodeState(t *testing.T, l *ledger.Ledger, node string) ledger.NodeState {
	t.Helper()
	ns, err := l.Nodes(context.Background())
	if err != nil {
		t.Fatalf("Nodes: %v", err)
	}
	for _, n := range ns {
		if n.Node == node {
			return n
		}
	}
	t.Fatalf("Nodes = %+v, without %s", ns, node)
	return ledger.NodeState{}
}

func TestRecoverALostNode(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		now := t0.Add(24 * time.Hour)
		cfg.Now = func() time.Time { return now }
		a := open(t, cfg)
		for _, r := range []struct {
			id string
			at time.Duration
		}{{"old", 0}, {"mid", time.Hour}, {"new", 3 * time.Hour}, {"done", 0}} {
			if err := a.Reserve(ctx, reservation(r.id, t0.Add(r.at))); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Settle(ctx, settlement("done", 7)); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil { // "old", "mid" and "new" stay open
			t.Fatal(err)
		}
		dead, bcfg := loseNode(t, cfg)

		b := open(t, bcfg)
		if err := b.Reserve(ctx, reservation("b-own", t0)); err != nil {
			t.Fatal(err)
		}
		flush(t, b)
		if got, want := nodeState(t, b, dead), (ledger.NodeState{Node: dead, Open: 3, Oldest: t0.Truncate(time.Microsecond)}); got != want {
			t.Fatalf("dead node: %+v, want %+v", got, want)
		}
		spend := func() int64 {
			t.Helper()
			sp, err := b.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0})
			if err != nil {
				t.Fatal(err)
			}
			return int64(sp)
		}
		if sp := spend(); sp != 4*3_000+7 {
			t.Fatalf("Spend = %d, want %d", sp, 4*3_000+7)
		}

		// The operator's tool: its own node is b's (the Dir it was given).
		acfg := bcfg
		acfg.Admin = true
		admin := open(t, acfg)
		before := t0.Add(2 * time.Hour)
		n, err := admin.RecoverNode(ctx, dead, before)
		if err != nil || n != 2 {
			t.Fatalf("RecoverNode = %d, %v, want 2 (old and mid)", n, err)
		}
		if n, err := admin.RecoverNode(ctx, dead, before); err != nil || n != 0 {
			t.Fatalf("second RecoverNode = %d, %v, want 0", n, err)
		}
		byID := map[string]ledger.Entry{}
		for _, e := range all(t, admin, ledger.Query{}) {
			byID[e.RequestID] = e
		}
		for _, id := range []string{"old", "mid"} {
			if e := byID[id]; e.Status != ledger.StatusRecovered || e.ActualCost != e.EstimatedCost || e.Actual != e.Estimated || !e.SettledAt.Equal(now) {
				t.Errorf("%s = %+v, want recovered at its estimate at %v", id, e, now)
			}
		}
		for _, id := range []string{"new", "b-own"} {
			if e := byID[id]; e.Status != ledger.StatusReserved {
				t.Errorf("%s = %+v, want still reserved", id, e)
			}
		}
		if e := byID["done"]; e.Status != ledger.StatusSettled || e.ActualCost != 7 {
			t.Errorf("done = %+v", e)
		}
		if sp := spend(); sp != 4*3_000+7 {
			t.Fatalf("Spend after recovery = %d, want it unchanged, %d", sp, 4*3_000+7)
		}
		if got, want := nodeState(t, admin, dead), (ledger.NodeState{Node: dead, Open: 1, Oldest: t0.Add(3 * time.Hour).Truncate(time.Microsecond)}); got != want {
			t.Fatalf("dead node after recovery: %+v, want %+v", got, want)
		}

		// b's reservations are its requests in flight.
		bNode := ownNode(t, bcfg.Dir)
		for name, l := range map[string]*ledger.Ledger{"admin": admin, "b": b} {
			if _, err := l.RecoverNode(ctx, bNode, now); !errors.Is(err, ledger.ErrOwnNode) {
				t.Errorf("%s recovering its own node: %v, want ErrOwnNode", name, err)
			}
		}
		if _, err := admin.RecoverNode(ctx, dead, time.Time{}); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("RecoverNode without a time: %v, want ErrInvalid", err)
		}
		rcfg := bcfg
		rcfg.ReadOnly = true
		if _, err := open(t, rcfg).RecoverNode(ctx, dead, now); !errors.Is(err, ledger.ErrReadOnly) {
			t.Errorf("RecoverNode read-only: %v, want ErrReadOnly", err)
		}
		if e := byID["b-own"]; e.Status != ledger.StatusReserved {
			t.Errorf("b-own = %+v", e)
		}

		// The node was alive after all: its settlement of a recovered entry
		// arrives later, and wins.
		if err := b.Settle(ctx, settlement("old", 1_234)); err != nil {
			t.Fatal(err)
		}
		flush(t, b)
		for _, e := range all(t, b, ledger.Query{}) {
			if e.RequestID == "old" && (e.Status != ledger.StatusSettled || e.ActualCost != 1_234) {
				t.Errorf("old after a late settlement = %+v, want settled at 1234", e)
			}
		}
		if sp := spend(); sp != 3*3_000+7+1_234 {
			t.Fatalf("Spend after the late settlement = %d, want %d", sp, 3*3_000+7+1_234)
		}

		// Everything else: nothing of the dead node stays open.
		if n, err := admin.RecoverNode(ctx, dead, now); err != nil || n != 1 {
			t.Fatalf("RecoverNode(now) = %d, %v, want 1 (new)", n, err)
		}
		if got := nodeState(t, admin, dead); got != (ledger.NodeState{Node: dead}) {
			t.Fatalf("dead node after full recovery: %+v, want nothing open", got)
		}
		if got := nodeState(t, admin, bNode); got.Open != 1 {
			t.Fatalf("b: %+v, want its one reservation open", got)
		}
		if sp := spend(); sp != 3*3_000+7+1_234 {
			t.Fatalf("Spend after full recovery = %d, want %d", sp, 3*3_000+7+1_234)
		}
	})
}

func ownNode(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "node"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestRecoverALiveNode: an operator recovers the reservations of a node
// that is in fact alive. Its settlements, arriving later, win; its own
// recovery at its next start still works.
func TestRecoverALiveNode(t *testing.T) {
	// PostgreSQL only: the embedded store has one node at a time, its Dir's.
	t.Parallel()
	cfg := postgresConfig(t)
	ctx := context.Background()
	now := t0.Add(time.Hour)
	cfg.Now = func() time.Time { return now }
	a := open(t, cfg)
	if err := a.Reserve(ctx, reservation("live", t0)); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	node := ownNode(t, cfg.Dir)
	admin := open(t, ledger.Config{DSN: cfg.DSN, Admin: true, Now: cfg.Now})
	if n, err := admin.RecoverNode(ctx, node, now); err != nil || n != 1 {
		t.Fatalf("RecoverNode = %d, %v, want 1", n, err)
	}
	if err := a.Settle(ctx, settlement("live", 1_234)); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve(ctx, reservation("later", t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	got := map[string]ledger.Entry{}
	for _, e := range all(t, admin, ledger.Query{}) {
		got[e.RequestID] = e
	}
	if e := got["live"]; e.Status != ledger.StatusSettled || e.ActualCost != 1_234 {
		t.Errorf("live = %+v, want settled at 1234: a recorded settlement beats a recovery", e)
	}
	if ns := nodeState(t, admin, node); ns.Open != 1 || !ns.Oldest.Equal(t0.Add(time.Minute)) {
		t.Errorf("node: %+v, want later open", ns)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a = open(t, cfg)
	flush(t, a)
	if ns := nodeState(t, admin, node); ns.Open != 0 {
		t.Errorf("node after its restart: %+v, want nothing open", ns)
	}
	sp, err := admin.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day", At: t0})
	if err != nil {
		t.Fatal(err)
	}
	if sp != 1_234+3_000 {
		t.Fatalf("Spend = %d, want %d", sp, 1_234+3_000)
	}
}
