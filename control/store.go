package control

// The store: the control plane's tables in the ledger's database
// (PostgreSQL, or a SQLite file beside the embedded ledger), through
// database/sql. Every write is one transaction that first advances the one
// row of control_version: the row's lock orders writers, so that the
// sequence numbers rows carry commit in order, and a replica that has read
// everything up to a version has missed nothing below it.

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver
	_ "modernc.org/sqlite"             // the embedded store
)

//go:embed migrations
var migrationFS embed.FS

// Store holds the control plane's entities, audit log and alert
// deliveries. It is safe for concurrent use.
type Store struct {
	db       *sql.DB
	postgres bool
	migrated atomic.Bool
}

// OpenStore opens the control plane's tables in the PostgreSQL database
// dsn names, or, when dsn is empty, in dir/control.db, and applies the
// migrations. A PostgreSQL that cannot be reached is no error: the
// migrations are applied by the first call that reaches it, and calls
// until then fail with ErrStoreDown.
func OpenStore(ctx context.Context, dsn, dir string) (*Store, error) {
	s := &Store{}
	var err error
	if dsn != "" {
		s.postgres = true
		if s.db, err = sql.Open("pgx", dsn); err != nil {
			return nil, fmt.Errorf("control: database: %w", err)
		}
		s.db.SetMaxOpenConns(8)
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("control: data dir: %w", err)
		}
		q := url.Values{}
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(FULL)")
		q.Add("_pragma", "busy_timeout(10000)")
		q.Add("_txlock", "immediate")
		if s.db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "control.db")+"?"+q.Encode()); err != nil {
			return nil, fmt.Errorf("control: sqlite: %w", err)
		}
		s.db.SetMaxOpenConns(4)
	}
	if err := s.ensure(ctx); err != nil && !errors.Is(err, ErrStoreDown) {
		s.db.Close()
		return nil, err
	}
	return s, nil
}

// ensure applies the migrations once.
func (s *Store) ensure(ctx context.Context) error {
	if s.migrated.Load() {
		return nil
	}
	if err := s.migrate(ctx); err != nil {
		return err
	}
	s.migrated.Store(true)
	return nil
}

// Close closes the database handle.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) migrate(ctx context.Context) error {
	dialect := "sqlite"
	if s.postgres {
		dialect = "postgres"
	}
	names, err := fs.Glob(migrationFS, "migrations/"+dialect+"/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("control: migrate: %w", storeErr(err))
	}
	defer tx.Rollback()
	if s.postgres {
		// One replica migrates at a time.
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(7316001)"); err != nil {
			return fmt.Errorf("control: migrate: %w", storeErr(err))
		}
	}
	if _, err := tx.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS control_schema (version INTEGER NOT NULL)"); err != nil {
		return fmt.Errorf("control: migrate: %w", storeErr(err))
	}
	var have int
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM control_schema").Scan(&have); err != nil {
		return fmt.Errorf("control: migrate: %w", storeErr(err))
	}
	if have > len(names) {
		return fmt.Errorf("control: schema version %d is newer than this binary's %d", have, len(names))
	}
	for i, n := range names[have:] {
		b, err := migrationFS.ReadFile(n)
		if err != nil {
			return err
		}
		for _, stmt := range strings.Split(string(b), ";\n") {
			if strings.TrimSpace(stmt) == "" {
				continue
			}
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("control: migration %s: %w", n, err)
			}
		}
		if _, err := tx.ExecContext(ctx, s.q("INSERT INTO control_schema (version) VALUES (?)"), have+i+1); err != nil {
			return fmt.Errorf("control: migrate: %w", err)
		}
	}
	return tx.Commit()
}

// q writes a query's ? placeholders as PostgreSQL's $1, $2...
func (s *Store) q(query string) string {
	if !s.postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// storeErr marks a database failure as ErrStoreDown, so that the admin API
// answers 503.
func storeErr(err error) error {
	if err == nil || errors.Is(err, ErrInvalid) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStoreDown, err)
}

func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromMicros(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.UnixMicro(n).UTC()
}

// Change is one write: the audit's record of it.
type Change struct {
	Actor  string
	Action string // create, update, rotate, revoke, reset, raise
	Detail any
}

// write runs f in a write transaction that has advanced the version; f
// returns the entities to store, which get the new sequence number, and
// the audit records the change.
func (s *Store) write(ctx context.Context, c Change, f func(tx *sql.Tx) ([]*Entity, error)) error {
	return s.versioned(ctx, func(tx *sql.Tx, seq int64) error {
		ents, err := f(tx)
		if err != nil {
			return storeErr(err)
		}
		return s.put(ctx, tx, c, seq, ents)
	})
}

// versioned runs f in a write transaction that has advanced the version
// (seq), so that every replica's poll reads the change, and commits it.
func (s *Store) versioned(ctx context.Context, f func(tx *sql.Tx, seq int64) error) error {
	if err := s.ensure(ctx); err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr(err)
	}
	defer tx.Rollback()
	var seq int64
	if err := tx.QueryRowContext(ctx, "UPDATE control_version SET seq = seq + 1 WHERE id = 1 RETURNING seq").Scan(&seq); err != nil {
		return storeErr(err)
	}
	if err := f(tx, seq); err != nil {
		return err
	}
	return storeErr(tx.Commit())
}

// put stores ents at version seq and records c in the audit log for each.
func (s *Store) put(ctx context.Context, tx *sql.Tx, c Change, seq int64, ents []*Entity) error {
	now := time.Now().UTC()
	for _, e := range ents {
		e.seq = seq
		if e.CreatedAt.IsZero() {
			e.CreatedAt = now
		}
		e.UpdatedAt = now
		spec, err := json.Marshal(e)
		if err != nil {
			return err
		}
		var hash, old any
		if e.hash != "" {
			hash = e.hash
		}
		if e.oldHash != "" {
			old = e.oldHash
		}
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO control_entities (id, kind, tenant, name, key_hash, old_hash, old_until, spec, seq, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET key_hash = excluded.key_hash, old_hash = excluded.old_hash, old_until = excluded.old_until,
				spec = excluded.spec, seq = excluded.seq, updated_at = excluded.updated_at`),
			e.ID, string(e.Kind), e.Tenant, e.uniqueName(), hash, old, micros(e.oldUntil), string(spec), seq, micros(e.CreatedAt), micros(e.UpdatedAt))
		if err != nil {
			if isUnique(err) {
				return fmt.Errorf("%w: a %s named %q already exists in tenant %q", ErrConflict, e.Kind, e.Name, e.Tenant)
			}
			return storeErr(err)
		}
		detail, _ := json.Marshal(c.Detail)
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO control_audit (at, actor, action, kind, entity, tenant, detail) VALUES (?, ?, ?, ?, ?, ?, ?)`),
			micros(now), c.Actor, c.Action, string(e.Kind), e.ID, e.Tenant, string(detail)); err != nil {
			return storeErr(err)
		}
	}
	return nil
}

// uniqueName is the name that is unique per kind and tenant.
func (e *Entity) uniqueName() string {
	if e.Kind == KindKey || e.Kind == KindTenant {
		return e.ID
	}
	return e.Name
}

func isUnique(err error) bool {
	s := err.Error()
	return strings.Contains(s, "UNIQUE constraint") || strings.Contains(s, "SQLSTATE 23505")
}

const entityCols = "spec, key_hash, old_hash, old_until, seq"

func scanEntity(sc interface{ Scan(...any) error }) (*Entity, error) {
	var (
		spec          string
		hash, oldHash sql.NullString
		oldUntil, seq int64
	)
	if err := sc.Scan(&spec, &hash, &oldHash, &oldUntil, &seq); err != nil {
		return nil, err
	}
	e := &Entity{}
	if err := json.Unmarshal([]byte(spec), e); err != nil {
		return nil, fmt.Errorf("control: stored entity: %w", err)
	}
	e.hash, e.oldHash, e.oldUntil, e.seq = hash.String, oldHash.String, fromMicros(oldUntil), seq
	return e, nil
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// plainText tells whether every s can be a stored name or id: UTF-8
// without NUL. PostgreSQL refuses other text with an error that is the
// caller's, not the database's failure (a 503 that a client would retry
// for ever), so such text is answered before it reaches a query.
func plainText(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return false
		}
	}
	return true
}

// get reads one entity by id.
func (s *Store) get(ctx context.Context, q querier, kind Kind, id string) (*Entity, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	if !plainText(id) {
		return nil, fmt.Errorf("%w: no %s %q", ErrNotFound, kind, id)
	}
	e, err := scanEntity(q.QueryRowContext(ctx, s.q("SELECT "+entityCols+" FROM control_entities WHERE id = ? AND kind = ?"), id, string(kind)))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: no %s %q", ErrNotFound, kind, id)
	}
	return e, storeErr(err)
}

// byName reads a tenant, team or user by its name within tenant.
func (s *Store) byName(ctx context.Context, q querier, kind Kind, tenant, name string) (*Entity, error) {
	if !plainText(tenant, name) {
		return nil, fmt.Errorf("%w: no %s %q in tenant %q", ErrNotFound, kind, name, tenant)
	}
	e, err := scanEntity(q.QueryRowContext(ctx, s.q("SELECT "+entityCols+" FROM control_entities WHERE kind = ? AND tenant = ? AND name = ?"), string(kind), tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: no %s %q in tenant %q", ErrNotFound, kind, name, tenant)
	}
	return e, storeErr(err)
}

// Query selects a page of entities of one kind.
type Query struct {
	Kind   Kind
	Tenant string
	Team   string // keys of this team
	User   string // keys of this user
	// After is the last id of the previous page; Limit the page's size.
	After string
	Limit int
}

// List returns a page of entities in id order.
func (s *Store) List(ctx context.Context, q Query) ([]*Entity, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	if !plainText(q.Tenant, q.Team, q.User, q.After) {
		return nil, invalid("tenant, team, user and after must be UTF-8 text without NUL")
	}
	// Team and user live in the spec: they are filtered after the read,
	// batch after batch, until the page is full or the rows end; a page
	// cut at the first batch would end the listing with no next page, and
	// the keys past it would be hidden from whoever lists a team's keys
	// (to revoke them, say).
	filtered := q.Team != "" || q.User != ""
	batch := q.Limit
	if filtered {
		batch = listBatchRows
	}
	out := []*Entity{}
	after := q.After
	for {
		where := []string{"kind = ?"}
		args := []any{string(q.Kind)}
		if q.Tenant != "" {
			where, args = append(where, "tenant = ?"), append(args, q.Tenant)
		}
		if after != "" {
			where, args = append(where, "id > ?"), append(args, after)
		}
		es, err := s.scanList(ctx, "SELECT "+entityCols+" FROM control_entities WHERE "+strings.Join(where, " AND ")+" ORDER BY id LIMIT "+strconv.Itoa(batch), args)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			if (q.Team != "" && e.Team != q.Team) || (q.User != "" && e.User != q.User) {
				continue
			}
			if out = append(out, e); len(out) == q.Limit {
				return out, nil
			}
		}
		if !filtered || len(es) < batch {
			return out, nil
		}
		after = es[len(es)-1].ID
	}
}

// listBatchRows is how many rows a filtered List reads at a time.
const listBatchRows = 1000

// scanList reads the entities of one query.
func (s *Store) scanList(ctx context.Context, query string, args []any) ([]*Entity, error) {
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, storeErr(err)
	}
	defer rows.Close()
	var out []*Entity
	for rows.Next() {
		e, err := scanEntity(rows)
		if err != nil {
			return nil, storeErr(err)
		}
		out = append(out, e)
	}
	return out, storeErr(rows.Err())
}

// Version is the sequence number of the last write.
func (s *Store) Version(ctx context.Context) (int64, error) {
	var v int64
	err := s.db.QueryRowContext(ctx, "SELECT seq FROM control_version WHERE id = 1").Scan(&v)
	return v, storeErr(err)
}

// Changes returns the entities written after sequence number since, and
// the version they bring the reader to. When the database is at since or
// behind it, there are none, and the version is the database's.
func (s *Store) Changes(ctx context.Context, since int64) ([]*Entity, int64, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, since, err
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, since, storeErr(err)
	}
	defer tx.Rollback()
	var v int64
	if err := tx.QueryRowContext(ctx, "SELECT seq FROM control_version WHERE id = 1").Scan(&v); err != nil {
		return nil, since, storeErr(err)
	}
	if v <= since {
		return nil, v, nil // v < since: the database is behind the caller's copy
	}
	rows, err := tx.QueryContext(ctx, s.q("SELECT "+entityCols+" FROM control_entities WHERE seq > ? AND seq <= ? ORDER BY seq"), since, v)
	if err != nil {
		return nil, since, storeErr(err)
	}
	defer rows.Close()
	var out []*Entity
	for rows.Next() {
		e, err := scanEntity(rows)
		if err != nil {
			return nil, since, storeErr(err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, since, storeErr(err)
	}
	return out, v, nil
}

// EntityAt returns the id of the entity whose last write has sequence
// number seq; ok is false when none has (it was written again since, or
// the database never had that version).
func (s *Store) EntityAt(ctx context.Context, seq int64) (id string, ok bool, err error) {
	if err := s.ensure(ctx); err != nil {
		return "", false, err
	}
	err = s.db.QueryRowContext(ctx, s.q("SELECT id FROM control_entities WHERE seq = ?"), seq).Scan(&id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, storeErr(err)
	}
	return id, true, nil
}

// AuditEntry is one change in the audit log.
type AuditEntry struct {
	ID     int64           `json:"id"`
	At     time.Time       `json:"at"`
	Actor  string          `json:"actor"`
	Action string          `json:"action"`
	Kind   string          `json:"kind"`
	Entity string          `json:"entity"`
	Tenant string          `json:"tenant"`
	Detail json.RawMessage `json:"detail"`
}

// AuditQuery selects a page of the audit log, newest first.
type AuditQuery struct {
	Entity, Tenant string
	// Before is the last id of the previous page (0 for the first).
	Before int64
	Limit  int
}

// Audit returns a page of the audit log, newest first.
func (s *Store) Audit(ctx context.Context, q AuditQuery) ([]AuditEntry, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	if !plainText(q.Entity, q.Tenant) {
		return nil, invalid("entity and tenant must be UTF-8 text without NUL")
	}
	where := []string{"1 = 1"}
	var args []any
	if q.Entity != "" {
		where, args = append(where, "entity = ?"), append(args, q.Entity)
	}
	if q.Tenant != "" {
		where, args = append(where, "tenant = ?"), append(args, q.Tenant)
	}
	if q.Before > 0 {
		where, args = append(where, "id < ?"), append(args, q.Before)
	}
	rows, err := s.db.QueryContext(ctx, s.q("SELECT id, at, actor, action, kind, entity, tenant, detail FROM control_audit WHERE "+
		strings.Join(where, " AND ")+" ORDER BY id DESC LIMIT "+strconv.Itoa(q.Limit)), args...)
	if err != nil {
		return nil, storeErr(err)
	}
	defer rows.Close()
	out := []AuditEntry{}
	for rows.Next() {
		var (
			a      AuditEntry
			at     int64
			detail string
		)
		if err := rows.Scan(&a.ID, &at, &a.Actor, &a.Action, &a.Kind, &a.Entity, &a.Tenant, &detail); err != nil {
			return nil, storeErr(err)
		}
		a.At, a.Detail = fromMicros(at), json.RawMessage(detail)
		out = append(out, a)
	}
	return out, storeErr(rows.Err())
}
