package control_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/costgate/costgate/control"
	"github.com/costgate/costgate/internal/pgtest"
)

// TestSnapshotAtkRevokedKeyAfterACrash: a key revoked, and a team turned
// off, are in the replica's snapshot on disk within a few polls, however
// recently it wrote one. A replica killed then (no Close to write it) and
// started again while the database is down serves from that file: before,
// the poll wrote a snapshot at most every 10 s, so one that had just
// written kept the old file for up to 10 s, and the revoked key (the
// leaked one, say) and the team's key worked again after the restart.
func TestSnapshotAtkRevokedKeyAfterACrash(t *testing.T) {
	pg := pgtest.NewPrivate(t)
	up := simulatorURL(t)
	dir := t.TempDir()
	r1 := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dir})
	r1.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	var team created
	r1.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"t1","name":"ops"}`, &team)
	var leaked, member, live created
	r1.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &leaked)
	r1.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","team":"ops"}`, &member)
	r1.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &live)
	r1.srv.Close() // writes the snapshot

	// A replica on the same data directory: its first poll writes a
	// snapshot; the changes come right after it.
	path := filepath.Join(dir, control.SnapshotFile)
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	r2 := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: dir})
	within(t, "r2's first snapshot", 5*time.Second, func() bool {
		fi, err := os.Stat(path)
		return err == nil && !fi.ModTime().Equal(before.ModTime())
	})
	r2.must(t, 200, "DELETE", "/admin/v1/keys/"+leaked.ID, "", nil)
	r2.must(t, 200, "PATCH", "/admin/v1/teams/"+team.ID, `{"active":false}`, nil)
	time.Sleep(time.Second) // ten polls: the changes are applied, and written if they are going to be

	// The crash: r2 is not closed; what its disk holds is what a restart
	// reads.
	crashed := t.TempDir()
	snap, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(crashed, control.SnapshotFile), snap, 0o600); err != nil {
		t.Fatal(err)
	}
	pg.Stop()
	r3 := newReplica(t, up, replicaOptions{dsn: pg.URL(), dir: crashed})
	if st, body := r3.chat(t, live.Key); st != 200 {
		t.Fatalf("a live key, from the snapshot: %d %s", st, body)
	}
	if st, _ := r3.chat(t, leaked.Key); st != 401 {
		t.Errorf("the key revoked a second before the crash, after the restart: %d, want 401", st)
	}
	if st, _ := r3.chat(t, member.Key); st != 401 {
		t.Errorf("a key of the team turned off a second before the crash, after the restart: %d, want 401", st)
	}
}
