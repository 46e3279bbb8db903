package control_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/control"
	"github.com/costgate/costgate/internal/pgtest"
)

// syncBuffer is a log sink safe for the replica's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRestartWithTheDatabaseDown: a replica that restarts while the
// database is down serves the control plane's keys from its snapshot (a
// revoked key stays revoked) and says so; a corrupt snapshot is ignored
// with a log line, and the keys come back when the database does.
func TestRestartWithTheDatabaseDown(t *testing.T) {
	pg := pgtest.NewPrivate(t)
	up := simulatorURL(t)
	dataDir := t.TempDir()
	r1 := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dataDir})
	r1.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	var live, revoked created
	r1.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"5"}]}`, &live)
	r1.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &revoked)
	r1.must(t, 200, "DELETE", "/admin/v1/keys/"+revoked.ID, "", nil)
	if st, body := r1.chat(t, live.Key); st != 200 {
		t.Fatalf("before the restart: %d %s", st, body)
	}
	r1.srv.Close() // writes the snapshot
	path := filepath.Join(dataDir, control.SnapshotFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot: %v %v", fi, err)
	}
	snap, _ := os.ReadFile(path)
	if bytes.Contains(snap, []byte(live.Key)) || bytes.Contains(snap, []byte(live.Key[12:])) {
		t.Fatal("the snapshot holds a secret")
	}
	pg.Stop()

	var logs syncBuffer
	r2 := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dataDir, log: slog.New(slog.NewJSONHandler(&logs, nil))})
	if st, body := r2.chat(t, live.Key); st != 200 {
		t.Fatalf("a key of the snapshot, with the database down: %d %s", st, body)
	}
	if st, _ := r2.chat(t, revoked.Key); st != 401 {
		t.Fatalf("a revoked key after the restart: %d, want 401", st)
	}
	if st, _ := r2.chat(t, "cg-test-yaml"); st != 200 {
		t.Fatalf("the config's key: %d", st)
	}
	if !strings.Contains(logs.String(), "serving the snapshot") {
		t.Fatalf("the log does not say it serves the snapshot: %s", logs.String())
	}
	var ready struct {
		Control map[string]any `json:"control"`
	}
	_, body := r2.call(t, "", "GET", "/readyz", "", nil)
	if err := json.Unmarshal([]byte(body), &ready); err != nil || ready.Control["serving_snapshot_of"] == nil {
		t.Fatalf("/readyz does not say it serves the snapshot: %s", body)
	}
	r2.srv.Close()

	cases := map[string]func([]byte) []byte{
		"corrupt":   func(b []byte) []byte { c := bytes.Clone(b); c[len(c)-5] ^= 0x20; return c },
		"truncated": func(b []byte) []byte { return b[:len(b)-10] },
		"foreign": func(b []byte) []byte {
			return bytes.Replace(b, []byte(`"costgate_control_snapshot":1`), []byte(`"costgate_control_snapshot":9`), 1)
		},
		"garbage": func([]byte) []byte { return []byte("\x00\x01not json at all") },
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(path, spoil(snap), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := control.ReadSnapshot(path); err == nil {
				t.Fatal("ReadSnapshot accepts it")
			}
			var logs syncBuffer
			r := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dataDir, log: slog.New(slog.NewJSONHandler(&logs, nil))})
			defer r.srv.Close()
			if !strings.Contains(logs.String(), "the snapshot is ignored") {
				t.Fatalf("no log line: %s", logs.String())
			}
			if st, _ := r.chat(t, live.Key); st != 401 {
				t.Fatalf("a key with the snapshot ignored: %d, want 401", st)
			}
			if st, _ := r.chat(t, "cg-test-yaml"); st != 200 {
				t.Fatalf("the config's key: %d", st)
			}
		})
	}

	t.Run("the database back replaces the snapshot", func(t *testing.T) {
		var logs syncBuffer
		r := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dataDir, log: slog.New(slog.NewJSONHandler(&logs, nil))})
		pg.Start()
		within(t, "the key back", 10*time.Second, func() bool { st, _ := r.chat(t, live.Key); return st == 200 })
		if st, _ := r.chat(t, revoked.Key); st != 401 {
			t.Fatalf("a revoked key: %d", st)
		}
	})
}
