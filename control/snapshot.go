package control

// The snapshot is a replica's last good copy of the control plane, on its
// disk: every entity with its keys' hashes (never a secret) and the policy
// promotions, at one version. A replica that starts while the database is
// down serves from it, and the poll replaces it once the database
// answers. The file (data_dir/control.snapshot, mode 0600) is a header
// line, then the body:
//
//	{"costgate_control_snapshot":1,"version":V,"written_at":"…","bytes":N,"sha256":"…"}
//	{"entities":[…],"promotions":[…]}
//
// It is written to a temporary file, synced and renamed over the last one,
// so that a reader sees the old snapshot or the new one whole.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/costgate/costgate/internal/atomicfile"
)

// SnapshotFile is the snapshot's name in the data directory.
const SnapshotFile = "control.snapshot"

// snapshotVersion is the snapshot format's version.
const snapshotVersion = 1

// snapshotEvery is the least time between two snapshots the poll writes.
const snapshotEvery = 10 * time.Second

type snapshotHeader struct {
	Format    int       `json:"costgate_control_snapshot"`
	Version   int64     `json:"version"`
	WrittenAt time.Time `json:"written_at"`
	Bytes     int       `json:"bytes"`
	SHA256    string    `json:"sha256"`
}

type snapshotBody struct {
	Entities   []snapEntity `json:"entities"`
	Promotions []Promotion  `json:"promotions"`
}

// snapEntity is an entity with what its JSON leaves out.
type snapEntity struct {
	*Entity
	Hash     string `json:"key_sha256,omitempty"`
	OldHash  string `json:"old_key_sha256,omitempty"`
	OldUntil int64  `json:"old_until_us,omitempty"`
	Seq      int64  `json:"seq"`
}

// Snapshot is a snapshot read back.
type Snapshot struct {
	Version    int64
	WrittenAt  time.Time
	Entities   []*Entity
	Promotions []Promotion
}

// SnapshotError is a snapshot file that cannot be used: corrupt,
// truncated, or of another format version.
type SnapshotError struct {
	Path   string
	Reason string
}

func (e *SnapshotError) Error() string {
	return fmt.Sprintf("control: snapshot %s: %s", e.Path, e.Reason)
}

// ReadSnapshot reads the snapshot at path. A missing file is an error
// that wraps fs.ErrNotExist; an unusable one a *SnapshotError.
func ReadSnapshot(path string) (*Snapshot, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("control: snapshot: %w", err)
	}
	bad := func(format string, args ...any) error {
		return &SnapshotError{Path: path, Reason: fmt.Sprintf(format, args...)}
	}
	line, body, ok := bytes.Cut(b, []byte("\n"))
	if !ok {
		return nil, bad("no header line (truncated?)")
	}
	var h snapshotHeader
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, bad("header: %v", err)
	}
	switch {
	case h.Format == 0:
		return nil, bad("not a costgate control-plane snapshot")
	case h.Format != snapshotVersion:
		return nil, bad("format version %d, this costgate reads %d", h.Format, snapshotVersion)
	case len(body) != h.Bytes:
		return nil, bad("%d bytes of body, the header says %d (truncated?)", len(body), h.Bytes)
	}
	sum := sha256.Sum256(body)
	if hex.EncodeToString(sum[:]) != h.SHA256 {
		return nil, bad("checksum mismatch: the file is corrupt")
	}
	var sb snapshotBody
	if err := json.Unmarshal(body, &sb); err != nil {
		return nil, bad("body: %v", err)
	}
	s := &Snapshot{Version: h.Version, WrittenAt: h.WrittenAt, Promotions: sb.Promotions}
	for _, se := range sb.Entities {
		if se.Entity == nil || se.ID == "" {
			return nil, bad("an entity without an id")
		}
		e := se.Entity
		e.hash, e.oldHash, e.oldUntil, e.seq = se.Hash, se.OldHash, fromMicros(se.OldUntil), se.Seq
		s.Entities = append(s.Entities, e)
	}
	return s, nil
}

// writeSnapshot writes s to path atomically, mode 0600.
func writeSnapshot(path string, s *Snapshot) error {
	sb := snapshotBody{Entities: make([]snapEntity, len(s.Entities)), Promotions: s.Promotions}
	for i, e := range s.Entities {
		sb.Entities[i] = snapEntity{Entity: e, Hash: e.hash, OldHash: e.oldHash, OldUntil: micros(e.oldUntil), Seq: e.seq}
	}
	body, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	head, err := json.Marshal(snapshotHeader{Format: snapshotVersion, Version: s.Version, WrittenAt: s.WrittenAt,
		Bytes: len(body), SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		return err
	}
	data := append(append(head, '\n'), body...)
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("control: snapshot: %w", err)
	}
	return nil
}

// snapshotAll reads every entity and promotion at one version.
func (s *Store) snapshotAll(ctx context.Context) (*Snapshot, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, storeErr(err)
	}
	defer tx.Rollback()
	snap := &Snapshot{WrittenAt: time.Now().UTC()}
	if err := tx.QueryRowContext(ctx, "SELECT seq FROM control_version WHERE id = 1").Scan(&snap.Version); err != nil {
		return nil, storeErr(err)
	}
	// Rows written after the version was read come too: applied again
	// by the poll that goes on from the version, they change nothing.
	rows, err := tx.QueryContext(ctx, "SELECT "+entityCols+" FROM control_entities ORDER BY seq")
	if err != nil {
		return nil, storeErr(err)
	}
	defer rows.Close()
	for rows.Next() {
		e, err := scanEntity(rows)
		if err != nil {
			return nil, storeErr(err)
		}
		snap.Entities = append(snap.Entities, e)
	}
	if err := rows.Err(); err != nil {
		return nil, storeErr(err)
	}
	if snap.Promotions, err = s.promotions(ctx, tx, ""); err != nil {
		return nil, err
	}
	return snap, nil
}

// snapshotPath is the replica's snapshot file.
func (p *Plane) snapshotPath() string {
	return filepath.Join(p.gate.Config().DataDirPath(), SnapshotFile)
}

// saveSnapshot writes a snapshot when the directory has advanced past the
// last one written, and, unless force, snapshotEvery has passed since or
// the directory changed an entity it held; or at once when the directory
// was replaced by the database's. Only creations wait for snapshotEvery
// (a burst of them is one write): a change is on disk by the next poll,
// so that a replica killed after a key's revocation, a team turned off or
// a budget lowered, and started again while the database is down, does
// not serve the entity as it was. It runs on the poll's goroutine, or at
// Close after the poll stopped.
func (p *Plane) saveSnapshot(ctx context.Context, force bool) {
	redo := p.resnap.Swap(false) // the directory was replaced (see reload)
	changed := p.dir.altered.Swap(false)
	if !redo && (p.dir.Version() <= p.snapVersion || (!force && !changed && time.Since(p.snapAt) < snapshotEvery)) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	snap, err := p.store.snapshotAll(ctx)
	if err == nil {
		err = writeSnapshot(p.snapshotPath(), snap)
	}
	p.snapAt = time.Now()
	if err != nil {
		p.log.Warn("control plane: the snapshot is not written", "path", p.snapshotPath(), "err", err)
		if redo {
			p.resnap.Store(true)
		}
		if changed {
			p.dir.altered.Store(true)
		}
		return
	}
	p.snapVersion = snap.Version
}

// loadSnapshot fills the directory from the snapshot file, when the
// database does not answer at start.
func (p *Plane) loadSnapshot() {
	path := p.snapshotPath()
	snap, err := ReadSnapshot(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		p.log.Warn("control plane: no snapshot to serve from; only the config file's keys work until the database answers", "path", path)
		return
	case err != nil:
		p.log.Error("control plane: the snapshot is ignored; only the config file's keys work until the database answers", "path", path, "err", err)
		return
	}
	p.applyPromotions(snap.Promotions)
	p.dir.Apply(snap.Entities, snap.Version)
	p.snapVersion = snap.Version
	p.fromSnapshot.Store(snap.WrittenAt.UnixNano())
	p.log.Warn("control plane: database unavailable at start; serving the snapshot until it answers",
		"path", path, "version", snap.Version, "written_at", snap.WrittenAt, "entities", len(snap.Entities))
}

// ServingSnapshot is when the snapshot this replica serves from was
// written; zero once the database has answered (or when it serves none).
func (p *Plane) ServingSnapshot() time.Time {
	if n := p.fromSnapshot.Load(); n > 0 {
		return time.Unix(0, n).UTC()
	}
	return time.Time{}
}
