package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/logtest"
	"github.com/costgate/costgate/ledger"
)

// reserveAndClose opens the ledger of dir as a node would, reserves each id
// of ids, created at its time, without settling it, and closes it; it
// returns the node.
func reserveAndClose(t *testing.T, dir string, ids map[string]time.Time) string {
	t.Helper()
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for id, at := range ids {
		if err := l.Reserve(ctx, ledger.Entry{RequestID: id, Tenant: "acme", EstimatedCost: 3_000, CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "node"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestLedgerNodesAndRecover: a node dies for good with reservations open;
// the node that takes over its data directory (the embedded store lives
// there) lists them, and recovers them before a time.
func TestLedgerNodesAndRecover(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	dir := t.TempDir()
	config := writeConfig(t, dir, "./data")
	data := filepath.Join(dir, "data")
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	dead := reserveAndClose(t, data, map[string]time.Time{"d-1": at, "d-2": at, "d-3": at.Add(2 * time.Hour)})
	// The volume is lost but for the database: a new node starts there.
	for _, f := range []string{"node", "spool"} {
		if err := os.RemoveAll(filepath.Join(data, f)); err != nil {
			t.Fatal(err)
		}
	}
	own := reserveAndClose(t, data, map[string]time.Time{"own-1": at})

	out, _, err := runCmd(t, "", "ledger", "nodes", "--config", config)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	row := func(node string) []string {
		for _, l := range lines[1:] {
			if f := strings.Fields(l); f[0] == node {
				return f
			}
		}
		t.Fatalf("ledger nodes:\n%s\nwithout %s", out, node)
		return nil
	}
	if f := row(dead); f[1] != "3" || f[2] != "2026-03-14T15:00:00Z" {
		t.Errorf("dead node row %q, want 3 open since 2026-03-14T15:00:00Z", f)
	}
	if f := row(own); strings.Join(f[1:], " ") != "(this data dir) 1 2026-03-14T15:00:00Z" {
		t.Errorf("own node row %q", f)
	}

	recover := func(args ...string) (string, error) {
		out, _, err := runCmd(t, "", append([]string{"ledger", "recover", "--config", config}, args...)...)
		return out, err
	}
	out, err = recover("--node", dead, "--before", "2026-03-14T16:00:00Z")
	if err != nil || !strings.HasPrefix(out, "recovered 2 reservations of node "+dead) {
		t.Fatalf("recover: %q, %v", out, err)
	}
	if out, err = recover("--node", dead, "--before", "2026-03-14T16:00:00Z"); err != nil || !strings.HasPrefix(out, "recovered 0 ") {
		t.Fatalf("second recover: %q, %v", out, err)
	}
	if _, err := recover("--node", own, "--before", "2026-03-15"); !errors.Is(err, ledger.ErrOwnNode) {
		t.Errorf("recovering the own node: %v, want ErrOwnNode", err)
	}
	for _, args := range [][]string{{"--node", dead}, {"--before", "2026-03-15"}} {
		if _, err := recover(args...); err == nil || !strings.Contains(err.Error(), "--node and --before are required") {
			t.Errorf("recover %q: %v", args, err)
		}
	}
	if _, err := recover("--node", dead, "--before", "soon"); err == nil || !strings.Contains(err.Error(), "--before") {
		t.Errorf("recover --before soon: %v", err)
	}

	out, _, err = runCmd(t, "", "ledger", "export", "--config", config, "--tenant", "acme", "--format", "json",
		"--from", "2026-03-14", "--to", "2026-03-15")
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]ledger.Status{"d-1": ledger.StatusRecovered, "d-2": ledger.StatusRecovered,
		"d-3": ledger.StatusReserved, "own-1": ledger.StatusReserved} {
		if !strings.Contains(out, `"request_id":"`+id+`"`) {
			t.Fatalf("export without %s:\n%s", id, out)
		}
		i := strings.Index(out, `"request_id":"`+id+`"`)
		if j := strings.Index(out[i:], `"status":"`); j < 0 || !strings.HasPrefix(out[i+j+len(`"status":"`):], string(want)+`"`) {
			t.Errorf("%s is not %s in the export:\n%s", id, want, out)
		}
	}
	out, _, err = runCmd(t, "", "ledger", "nodes", "--config", config)
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if f := row(dead); f[1] != "1" || f[2] != "2026-03-14T17:00:00Z" {
		t.Errorf("dead node after recovery %q, want 1 open since 2026-03-14T17:00:00Z", f)
	}
}

// TestServeLogsLedgerRecovery: the ledger's own reports reach serve's log.
// A previous run left two reservations open; serve finalizes them at their
// estimate and says so on stderr, as a log record.
func TestServeLogsLedgerRecovery(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	config := writeConfig(t, dir, data)
	reserveAndClose(t, data, map[string]time.Time{"one": time.Now().Add(-time.Minute), "two": time.Now().Add(-time.Minute)})

	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr logtest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--config", config}, strings.NewReader(""), &stdout, &stderr)
	}()
	defer func() {
		cancel()
		<-done
	}()
	waitFor(t, "serve logs the ledger's recovery", 20*time.Second, func() bool {
		return strings.Contains(stderr.String(), `"msg":"ledger: recovered 2 reservations of a previous run at their estimate","component":"ledger"`)
	})
}
