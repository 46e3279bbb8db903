package control_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/control"
	"github.com/costgate/costgate/internal/logtest"
	"github.com/costgate/costgate/internal/pgtest"
)

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

	var logs logtest.Buffer
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
			var logs logtest.Buffer
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
		var logs logtest.Buffer
		r := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dataDir, log: slog.New(slog.NewJSONHandler(&logs, nil))})
		pg.Start()
		within(t, "the key back", 10*time.Second, func() bool { st, _ := r.chat(t, live.Key); return st == 200 })
		if st, _ := r.chat(t, revoked.Key); st != 401 {
			t.Fatalf("a revoked key: %d", st)
		}
	})
}

// TestDatabaseBehindTheCopy: a database restored to an older version (a
// backup) is behind a running replica's copy. The changes made there
// afterwards carry versions the replica has seen: without a reload it
// would miss them, and a key revoked there would keep working on it,
// also when they bring the database back to the replica's version before
// it polls (the entity written at that version differs). The
// replica takes the database's data whole, drops what the database no
// longer holds, and writes its snapshot of it.
func TestDatabaseBehindTheCopy(t *testing.T) {
	dsn := pgtest.New(t)
	up := simulatorURL(t)
	dir := t.TempDir()
	var logs logtest.Buffer
	r := newReplica(t, up, replicaOptions{dsn: dsn, dir: dir, log: slog.New(slog.NewJSONHandler(&logs, nil))})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	var k1, k2 created
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &k1)
	db := openDB(t, dsn)
	var backup int64
	if err := db.QueryRow("SELECT seq FROM control_version WHERE id = 1").Scan(&backup); err != nil {
		t.Fatal(err)
	}
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &k2)
	within(t, "k2 known", 5*time.Second, func() bool { st, _ := r.chat(t, k2.Key); return st == 200 })
	r2 := newReplica(t, up, replicaOptions{dsn: dsn})

	// The database goes back to the backup (k2 is not in it), and another
	// replica revokes k1 there at once, before the first one polls: the
	// database is back at the first replica's version, with another
	// write at it.
	if _, err := db.Exec("DELETE FROM control_entities WHERE seq > $1", backup); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE control_version SET seq = $1 WHERE id = 1", backup); err != nil {
		t.Fatal(err)
	}
	r2.must(t, 200, "DELETE", "/admin/v1/keys/"+k1.ID, "", nil)

	within(t, "k1 revoked on the first replica", 5*time.Second, func() bool { st, _ := r.chat(t, k1.Key); return st == 401 })
	if st, _ := r.chat(t, k2.Key); st != 401 {
		t.Fatalf("a key the restored database does not hold: %d, want 401", st)
	}
	if !strings.Contains(logs.String(), "the database is behind this replica's copy") {
		t.Fatalf("no log line: %s", logs.String())
	}
	// The snapshot is rewritten from the database (it was of the newer
	// copy), so that a restart with the database down does not bring k2
	// back.
	within(t, "the snapshot rewritten", 5*time.Second, func() bool {
		snap, err := control.ReadSnapshot(filepath.Join(dir, control.SnapshotFile))
		if err != nil || snap.Version > backup+1 {
			return false
		}
		for _, e := range snap.Entities {
			if e.ID == k2.ID {
				return false
			}
		}
		return true
	})
}

// TestRestoredDatabaseAfterASnapshot: a replica that started from its
// snapshot while the database was down, which comes back restored to an
// older version, serves the database's data, not the snapshot's, and
// rewrites the snapshot, so that the next restart with the database down
// does not bring back a key the database no longer holds.
func TestRestoredDatabaseAfterASnapshot(t *testing.T) {
	pg := pgtest.NewPrivate(t)
	up := simulatorURL(t)
	dir := t.TempDir()
	r1 := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dir})
	r1.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	var k1, k2 created
	r1.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &k1)
	db := openDB(t, pg.URL())
	var backup int64
	if err := db.QueryRow("SELECT seq FROM control_version WHERE id = 1").Scan(&backup); err != nil {
		t.Fatal(err)
	}
	r1.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &k2)
	r1.srv.Close() // writes the snapshot, k2 in it
	// The database is restored to the backup, then goes down.
	if _, err := db.Exec("DELETE FROM control_entities WHERE seq > $1", backup); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE control_version SET seq = $1 WHERE id = 1", backup); err != nil {
		t.Fatal(err)
	}
	db.Close()
	pg.Stop()

	r2 := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dir})
	if st, _ := r2.chat(t, k2.Key); st != 200 {
		t.Fatalf("k2 from the snapshot, the database down: %d", st)
	}
	pg.Start()
	within(t, "k2 gone with the database back", 10*time.Second, func() bool { st, _ := r2.chat(t, k2.Key); return st == 401 })
	if st, _ := r2.chat(t, k1.Key); st != 200 {
		t.Fatalf("k1, which the database holds: %d", st)
	}
	within(t, "the snapshot rewritten without k2", 5*time.Second, func() bool {
		snap, err := control.ReadSnapshot(filepath.Join(dir, control.SnapshotFile))
		if err != nil {
			return false
		}
		for _, e := range snap.Entities {
			if e.ID == k2.ID {
				return false
			}
		}
		return true
	})
}
