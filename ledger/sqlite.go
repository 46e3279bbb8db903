package ledger

// The embedded store: a SQLite file through modernc.org/sqlite (pure Go), in
// WAL mode with synchronous=FULL, written by the flusher alone.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/costgate/costgate/costmodel"

	_ "modernc.org/sqlite"
)

type sqliteStore struct {
	db *sql.DB
}

func openSQLite(ctx context.Context, path string) (*sqliteStore, error) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite: %w", err)
	}
	db.SetMaxOpenConns(4)
	s := &sqliteStore{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// openSQLiteReader opens an existing embedded store for queries only.
func openSQLiteReader(ctx context.Context, path string) (*sqliteStore, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("ledger: no embedded ledger: %w", err)
	}
	q := url.Values{}
	q.Add("_pragma", "query_only(1)")
	q.Add("_pragma", "busy_timeout(10000)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite: %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: sqlite: %w", err)
	}
	return &sqliteStore{db: db}, nil
}

func (s *sqliteStore) migrate(ctx context.Context) error {
	ms, err := migrations("sqlite")
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: sqlite migrate: %w", err)
	}
	defer tx.Rollback()
	var have int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&have); err != nil {
		return fmt.Errorf("ledger: sqlite migrate: %w", err)
	}
	if have > len(ms) {
		return fmt.Errorf("ledger: sqlite schema version %d is newer than this binary's %d", have, len(ms))
	}
	for _, m := range ms[have:] {
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return fmt.Errorf("ledger: sqlite migration %s: %w", m.name, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", m.version)); err != nil {
			return fmt.Errorf("ledger: sqlite migration %s: %w", m.name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("ledger: sqlite migrate: %w", err)
	}
	return nil
}

func (s *sqliteStore) close() error { return s.db.Close() }

func sqliteTime(t time.Time) any { return unixMicro(t) }

// sqliteChunk is how many entries one upsert statement writes: one
// statement per row cost most of the apply's CPU (database/sql and the
// driver per call); 64 rows of 31 columns stay far below SQLite's limit on
// parameters.
const sqliteChunk = 64

// sqliteUpsertN is the upsert of n entries. SQLite applies the ON CONFLICT
// clause row by row, in order, so a multi-row statement behaves as n
// single-row ones.
func sqliteUpsertN(n int) string {
	var set []string
	for _, c := range entryColumns[1:] {
		set = append(set, c+" = excluded."+c)
	}
	row := "(?" + strings.Repeat(", ?", len(entryColumns)-1) + ")"
	return "INSERT INTO ledger_entries (" + strings.Join(entryColumns, ", ") + ") VALUES " + row +
		strings.Repeat(", "+row, n-1) + " ON CONFLICT (request_id) DO UPDATE SET " + strings.Join(set, ", ")
}

var sqliteUpsertFull = sqliteUpsertN(sqliteChunk)

// sqliteUpdateN updates n entries from a VALUES list of request_id and
// updateColumns. Only the columns a settlement may change are set, none of
// them indexed, so that SQLite rewrites the row and leaves the indexes
// alone (an upsert that sets every column rewrites every index entry).
func sqliteUpdateN(n int) string {
	var set []string
	for i, c := range updateColumns {
		set = append(set, fmt.Sprintf("%s = u.column%d", c, i+2))
	}
	row := "(?" + strings.Repeat(", ?", len(updateColumns)) + ")"
	return "UPDATE ledger_entries AS e SET " + strings.Join(set, ", ") + " FROM (VALUES " + row +
		strings.Repeat(", "+row, n-1) + ") AS u WHERE e.request_id = u.column1"
}

var sqliteUpdateFull = sqliteUpdateN(sqliteChunk)

// updateArgs returns the values of e's request_id and updateColumns.
func updateArgs(node string, e *Entry) []any {
	args := make([]any, 0, 1+len(updateColumns))
	args = append(args, e.RequestID)
	for _, c := range updateColumns {
		col := columns[c]
		switch {
		case col.text != nil:
			args = append(args, col.text(node, e))
		case col.num != nil:
			args = append(args, col.num(e))
		default:
			args = append(args, unixMicro(col.time(e)))
		}
	}
	return args
}

type sqliteTx struct{ tx *sql.Tx }

func (s *sqliteStore) begin(ctx context.Context) (storeTx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite: %w", err)
	}
	return &sqliteTx{tx: tx}, nil
}

func (t *sqliteTx) load(ctx context.Context, ids []string) (map[string]*Entry, error) {
	out := make(map[string]*Entry)
	for len(ids) > 0 {
		n := min(len(ids), 500)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = id
		}
		rows, err := t.tx.QueryContext(ctx, "SELECT "+readColumns+" FROM ledger_entries WHERE request_id IN (?"+
			strings.Repeat(", ?", n-1)+")", args...)
		if err != nil {
			return nil, fmt.Errorf("ledger: sqlite load: %w", err)
		}
		es, err := sqliteEntries(rows)
		if err != nil {
			return nil, err
		}
		for i := range es {
			out[es[i].RequestID] = &es[i]
		}
		ids = ids[n:]
	}
	return out, nil
}

func sqliteEntries(rows *sql.Rows) ([]Entry, error) {
	defer rows.Close()
	var es []Entry
	for rows.Next() {
		var e Entry
		var created, settled int64
		if err := scanEntry(rows, &e, &created, &settled); err != nil {
			return nil, fmt.Errorf("ledger: sqlite scan: %w", err)
		}
		e.CreatedAt, e.SettledAt = fromMicro(created), fromMicro(settled)
		es = append(es, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: sqlite: %w", err)
	}
	return es, nil
}

func (t *sqliteTx) write(ctx context.Context, node string, inserts, updates []*Entry, deltas map[spendKey]spendDelta) error {
	rows := inserts
	args := make([]any, 0, min(len(rows), sqliteChunk)*len(entryColumns))
	for len(rows) > 0 {
		n := min(len(rows), sqliteChunk)
		args = args[:0]
		for _, e := range rows[:n] {
			args = append(args, entryArgs(node, e, sqliteTime)...)
		}
		q := sqliteUpsertFull
		if n != sqliteChunk {
			q = sqliteUpsertN(n)
		}
		if _, err := t.tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("ledger: sqlite upsert: %w", err)
		}
		rows = rows[n:]
	}
	for rows = updates; len(rows) > 0; rows = rows[min(len(rows), sqliteChunk):] {
		n := min(len(rows), sqliteChunk)
		args = args[:0]
		for _, e := range rows[:n] {
			args = append(args, updateArgs(node, e)...)
		}
		q := sqliteUpdateFull
		if n != sqliteChunk {
			q = sqliteUpdateN(n)
		}
		if _, err := t.tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("ledger: sqlite update: %w", err)
		}
	}
	sp, err := t.tx.PrepareContext(ctx, `INSERT INTO ledger_spend (tenant, scope, grain, bucket, cost, entries) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (tenant, scope, grain, bucket) DO UPDATE SET cost = cost + excluded.cost, entries = entries + excluded.entries`)
	if err != nil {
		return fmt.Errorf("ledger: sqlite: %w", err)
	}
	defer sp.Close()
	for k, v := range deltas {
		if _, err := sp.ExecContext(ctx, k.tenant, k.scope, k.grain, k.bucket, v.cost, v.entries); err != nil {
			return fmt.Errorf("ledger: sqlite spend: %w", err)
		}
	}
	return nil
}

func (t *sqliteTx) recover(ctx context.Context, node, marker string, at time.Time) (int64, error) {
	res, err := t.tx.ExecContext(ctx, `INSERT INTO ledger_nodes (node, open_since, marker) VALUES (?, 0, ?)
		ON CONFLICT (node) DO UPDATE SET marker = excluded.marker WHERE marker IS NOT excluded.marker`, node, marker)
	if err != nil {
		return 0, fmt.Errorf("ledger: sqlite recover: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return 0, err // n == 0: this marker is applied already
	}
	res, err = t.tx.ExecContext(ctx, `UPDATE ledger_entries SET status = 'recovered',
		act_input = est_input, act_cached_input = est_cached_input, act_cache_write = est_cache_write,
		act_output = est_output, act_reasoning = est_reasoning, act_units = est_units,
		actual_cost = estimated_cost, cost = estimated_cost, settled_at = ?
		WHERE node = ? AND status = 'reserved'
		AND created_at >= (SELECT open_since FROM ledger_nodes WHERE node = ? AND open_since > 0)`, unixMicro(at), node, node)
	if err != nil {
		return 0, fmt.Errorf("ledger: sqlite recover: %w", err)
	}
	return res.RowsAffected()
}

func (t *sqliteTx) mark(ctx context.Context, node string, since time.Time, lower bool) error {
	set := "excluded.open_since"
	if lower {
		set = "CASE WHEN open_since = 0 THEN excluded.open_since ELSE min(open_since, excluded.open_since) END"
	}
	if _, err := t.tx.ExecContext(ctx, `INSERT INTO ledger_nodes (node, open_since) VALUES (?, ?)
		ON CONFLICT (node) DO UPDATE SET open_since = `+set, node, unixMicro(since)); err != nil {
		return fmt.Errorf("ledger: sqlite mark: %w", err)
	}
	return nil
}

func (t *sqliteTx) commit(ctx context.Context) error {
	if err := t.tx.Commit(); err != nil {
		return fmt.Errorf("ledger: sqlite commit: %w", err)
	}
	return nil
}

func (t *sqliteTx) rollback(ctx context.Context) error {
	if err := t.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

func (s *sqliteStore) entries(ctx context.Context, q Query, after *cursor, limit int) ([]Entry, error) {
	var where []string
	var args []any
	if q.Tenant != "" {
		where, args = append(where, "tenant = ?"), append(args, q.Tenant)
	}
	if !q.From.IsZero() {
		where, args = append(where, "created_at >= ?"), append(args, q.From.UnixMicro())
	}
	if !q.To.IsZero() {
		where, args = append(where, "created_at < ?"), append(args, q.To.UnixMicro())
	}
	if after != nil {
		where = append(where, "(created_at > ? OR (created_at = ? AND request_id > ?))")
		args = append(args, after.created.UnixMicro(), after.created.UnixMicro(), after.id)
	}
	sqlText := "SELECT " + readColumns + " FROM ledger_entries"
	if len(where) > 0 {
		sqlText += " WHERE " + strings.Join(where, " AND ")
	}
	sqlText += " ORDER BY created_at, request_id LIMIT ?"
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, sqlText, args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite entries: %w", err)
	}
	return sqliteEntries(rows)
}

// sqlitePeriod selects the roll-up rows of a period split by spendRanges
// (parameters d0, d1, from, d0, d1, to).
const sqlitePeriod = `((grain = 1 AND bucket >= ? AND bucket < ?) OR
	(grain = 0 AND ((bucket >= ? AND bucket < ?) OR (bucket >= ? AND bucket < ?))))`

func sqlitePeriodArgs(from, to time.Time) []any {
	d0, d1, _, _ := spendRanges(from, to)
	return []any{d0.UnixMicro(), d1.UnixMicro(), from.UnixMicro(), d0.UnixMicro(), d1.UnixMicro(), to.UnixMicro()}
}

func (s *sqliteStore) spend(ctx context.Context, tenant, user, key string, from, to time.Time) (costmodel.NanoUSD, error) {
	args := append([]any{tenant, scopeOf(user, key, user != "", key != "")}, sqlitePeriodArgs(from, to)...)
	var v int64
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(cost), 0) FROM ledger_spend
		WHERE tenant = ? AND scope = ? AND `+sqlitePeriod, args...).Scan(&v); err != nil {
		return 0, fmt.Errorf("ledger: sqlite spend: %w", err)
	}
	return costmodel.NanoUSD(v), nil
}

func (s *sqliteStore) summary(ctx context.Context, from, to time.Time) ([]TenantSpend, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tenant, SUM(cost), SUM(entries) FROM ledger_spend
		WHERE scope = '' AND `+sqlitePeriod+` GROUP BY tenant ORDER BY tenant`, sqlitePeriodArgs(from, to)...)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite summary: %w", err)
	}
	defer rows.Close()
	var out []TenantSpend
	for rows.Next() {
		var ts TenantSpend
		var cost int64
		if err := rows.Scan(&ts.Tenant, &cost, &ts.Entries); err != nil {
			return nil, fmt.Errorf("ledger: sqlite summary: %w", err)
		}
		ts.Spend = costmodel.NanoUSD(cost)
		out = append(out, ts)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: sqlite summary: %w", err)
	}
	return out, nil
}
