package ledger

// The embedded store: a SQLite file through modernc.org/sqlite (pure Go), in
// WAL mode with synchronous=FULL, written by the flusher alone.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/costgate/costgate/costmodel"

	_ "modernc.org/sqlite"
)

type sqliteStore struct {
	db   *sql.DB
	path string

	mu    sync.Mutex
	stmts map[string]*sql.Stmt // the flusher's statements, prepared once
}

// stmt returns q prepared. Compiling a statement of many rows costs more
// than running it; database/sql keeps it prepared on each connection.
func (s *sqliteStore) stmt(ctx context.Context, q string) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.stmts[q]; ok {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite prepare: %w", err)
	}
	if s.stmts == nil {
		s.stmts = make(map[string]*sql.Stmt)
	}
	s.stmts[q] = st
	return st, nil
}

// query runs q as a statement prepared once (see stmt), for the reads
// that run with a given text again and again: a restore after a loss
// reads each tenant's spend and counts, and parsing their SQL each time
// cost most of a restore's CPU.
func (s *sqliteStore) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	st, err := s.stmt(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// openSQLite opens the embedded ledger at path for a spool applied up to
// position applied: past 0, a database without the ledger's schema (a
// file missing, empty, or without the WAL that held all it had; SQLite
// opens each as a new database) is refused rather than made afresh, which
// would forget the entries the spool no longer replays, and with them the
// tenants' spend.
func openSQLite(ctx context.Context, path string, applied int64) (*sqliteStore, error) {
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
	s := &sqliteStore{db: db, path: path}
	if err := s.migrate(ctx, applied); err != nil {
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

func (s *sqliteStore) migrate(ctx context.Context, applied int64) error {
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
	if have == 0 && applied > 0 {
		return fmt.Errorf("%w: the embedded ledger %s is missing, empty or without its schema, but the spool beside it was applied to one up to position %d: a new ledger would forget those entries; restore the file (with its -wal), or move the spool aside to start an empty ledger",
			errForgotten, s.path, applied)
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

func (s *sqliteStore) close() error {
	s.mu.Lock()
	for _, st := range s.stmts {
		st.Close()
	}
	s.stmts = nil
	s.mu.Unlock()
	return s.db.Close()
}

func sqliteTime(t time.Time) any { return unixMicro(t) }

// sqliteChunk is the most entries one insert statement writes: one
// statement per row cost most of the apply's CPU (database/sql and the
// driver per call); 64 rows of 31 columns stay far below SQLite's limit on
// parameters. Fewer rows go in statements of a power of two rows, so that
// seven statements of each kind, prepared once, write any number.
const sqliteChunk = 64

// chunk is the rows of the next statement for n rows to write.
func chunk(n int) int {
	c := sqliteChunk
	for c > n {
		c /= 2
	}
	return c
}

var (
	sqliteInserts = statementsBySize(sqliteInsertN)
	sqliteUpdates = statementsBySize(sqliteUpdateN)
	sqliteSpends  = statementsBySize(sqliteSpendN)
)

// statementsBySize makes the statement of each chunk size.
func statementsBySize(f func(int) string) map[int]string {
	m := make(map[int]string)
	for c := sqliteChunk; c >= 1; c /= 2 {
		m[c] = f(c)
	}
	return m
}

// sqliteInsertN inserts n entries, rows that load did not find in this
// transaction. OR FAIL, here and in sqliteUpdateN: a statement of many
// rows that may abort makes SQLite keep a statement journal (on a batch of
// hundreds of entries, a temporary file written a page at a time) to undo
// its own rows; a failing statement fails the whole transaction anyway.
func sqliteInsertN(n int) string {
	row := "(?" + strings.Repeat(", ?", len(entryColumns)-1) + ")"
	return "INSERT OR FAIL INTO ledger_entries (" + strings.Join(entryColumns, ", ") + ") VALUES " + row +
		strings.Repeat(", "+row, n-1)
}

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
	return "UPDATE OR FAIL ledger_entries AS e SET " + strings.Join(set, ", ") + " FROM (VALUES " + row +
		strings.Repeat(", "+row, n-1) + ") AS u WHERE e.request_id = u.column1"
}

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

type sqliteTx struct {
	s  *sqliteStore
	tx *sql.Tx
}

// exec runs q, prepared once, in the transaction.
func (t *sqliteTx) exec(ctx context.Context, q string, args ...any) error {
	st, err := t.s.stmt(ctx, q)
	if err != nil {
		return err
	}
	_, err = t.tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	return err
}

func (s *sqliteStore) begin(ctx context.Context) (storeTx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite: %w", err)
	}
	return &sqliteTx{s: s, tx: tx}, nil
}

// sqliteLoad reads the entries whose ids are in a JSON array: one
// statement, prepared once, for any number of ids.
var sqliteLoad = "SELECT " + readColumns + " FROM ledger_entries WHERE request_id IN (SELECT value FROM json_each(?))"

func (t *sqliteTx) load(ctx context.Context, ids []string) (map[string]*Entry, error) {
	out := make(map[string]*Entry)
	if len(ids) == 0 {
		return out, nil
	}
	list, err := json.Marshal(ids)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite load: %w", err)
	}
	st, err := t.s.stmt(ctx, sqliteLoad)
	if err != nil {
		return nil, err
	}
	rows, err := t.tx.StmtContext(ctx, st).QueryContext(ctx, string(list))
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

// sqliteSpendN adds to n rows of the spend roll-up, of distinct keys: a
// statement a row cost as much as the entries' inserts on a batch of
// many tenants (one call through database/sql and the driver a row).
func sqliteSpendN(n int) string {
	const row = "(?, ?, ?, ?, ?, ?)"
	return "INSERT INTO ledger_spend (tenant, scope, grain, bucket, cost, entries) VALUES " + row + strings.Repeat(", "+row, n-1) + `
	ON CONFLICT (tenant, scope, grain, bucket) DO UPDATE
	SET cost = MIN(MAX(cost + excluded.cost, -9223372036854775807 - 1), 9223372036854775807), entries = entries + excluded.entries`
}

func (t *sqliteTx) remove(ctx context.Context, ids []string) ([]Entry, error) {
	list, err := json.Marshal(ids)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite delete: %w", err)
	}
	rows, err := t.tx.QueryContext(ctx, `DELETE FROM ledger_entries WHERE request_id IN (SELECT value FROM json_each(?))
		RETURNING tenant, user_id, key_id, created_at, cost`, string(list))
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite delete: %w", err)
	}
	defer rows.Close()
	gone := make([]Entry, 0, len(ids))
	for rows.Next() {
		e := Entry{Status: StatusSettled}
		var created, cost int64
		if err := rows.Scan(&e.Tenant, &e.User, &e.KeyID, &created, &cost); err != nil {
			return nil, fmt.Errorf("ledger: sqlite delete: %w", err)
		}
		e.CreatedAt, e.ActualCost = fromMicro(created), costmodel.NanoUSD(cost)
		gone = append(gone, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: sqlite delete: %w", err)
	}
	return gone, nil
}

func (t *sqliteTx) write(ctx context.Context, node string, inserts, updates []*Entry, deltas map[spendKey]spendDelta) error {
	args := make([]any, 0, min(len(inserts), sqliteChunk)*len(entryColumns))
	for rows := inserts; len(rows) > 0; {
		n := chunk(len(rows))
		args = args[:0]
		for _, e := range rows[:n] {
			args = append(args, entryArgs(node, e, sqliteTime)...)
		}
		if err := t.exec(ctx, sqliteInserts[n], args...); err != nil {
			return fmt.Errorf("ledger: sqlite insert: %w", err)
		}
		rows = rows[n:]
	}
	for rows := updates; len(rows) > 0; {
		n := chunk(len(rows))
		args = args[:0]
		for _, e := range rows[:n] {
			args = append(args, updateArgs(node, e)...)
		}
		if err := t.exec(ctx, sqliteUpdates[n], args...); err != nil {
			return fmt.Errorf("ledger: sqlite update: %w", err)
		}
		rows = rows[n:]
	}
	if len(deltas) == 0 {
		return nil
	}
	const cols = 6
	args = make([]any, 0, cols*len(deltas))
	for k, v := range deltas {
		args = append(args, k.tenant, k.scope, k.grain, k.bucket, v.cost, v.entries)
	}
	for rows := args; len(rows) > 0; {
		n := chunk(len(rows) / cols)
		if err := t.exec(ctx, sqliteSpends[n], rows[:cols*n]...); err != nil {
			return fmt.Errorf("ledger: sqlite spend: %w", err)
		}
		rows = rows[cols*n:]
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
		act_output = est_output, act_reasoning = est_reasoning, act_units = est_units, act_extra = est_extra,
		actual_cost = estimated_cost, cost = estimated_cost, settled_at = ?
		WHERE node = ? AND status = 'reserved'
		AND created_at >= (SELECT open_since FROM ledger_nodes WHERE node = ? AND open_since > 0)`, unixMicro(at), node, node)
	if err != nil {
		return 0, fmt.Errorf("ledger: sqlite recover: %w", err)
	}
	return res.RowsAffected()
}

func (t *sqliteTx) recoverNode(ctx context.Context, node string, before, at time.Time) (int64, error) {
	res, err := t.tx.ExecContext(ctx, `UPDATE ledger_entries SET status = 'recovered',
		act_input = est_input, act_cached_input = est_cached_input, act_cache_write = est_cache_write,
		act_output = est_output, act_reasoning = est_reasoning, act_units = est_units, act_extra = est_extra,
		actual_cost = estimated_cost, cost = estimated_cost, settled_at = ?
		WHERE node = ? AND status = 'reserved' AND created_at < ?
		AND created_at >= (SELECT open_since FROM ledger_nodes WHERE node = ? AND open_since > 0)`,
		unixMicro(at), node, unixMicro(before), node)
	if err != nil {
		return 0, fmt.Errorf("ledger: sqlite recover node: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("ledger: sqlite recover node: %w", err)
	}
	if _, err := t.tx.ExecContext(ctx, `UPDATE ledger_nodes SET open_since = COALESCE((SELECT min(created_at)
		FROM ledger_entries WHERE node = ledger_nodes.node AND status = 'reserved' AND created_at >= ledger_nodes.open_since), 0)
		WHERE node = ? AND open_since > 0`, node); err != nil {
		return 0, fmt.Errorf("ledger: sqlite recover node: %w", err)
	}
	return n, nil
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

func (s *sqliteStore) tickEntries(ctx context.Context, node string, from, to time.Time, after *cursor, limit int) ([]Entry, error) {
	sqlText := "SELECT " + readColumns + ` FROM ledger_entries WHERE created_at >= ? AND created_at < ?
		AND substr(request_id, 1, ?) = ? AND node = ? AND status = 'settled'`
	args := []any{from.UnixMicro(), to.UnixMicro(), len(tickEntryPrefix), tickEntryPrefix, node}
	if after != nil {
		sqlText += " AND (created_at > ? OR (created_at = ? AND request_id > ?))"
		args = append(args, after.created.UnixMicro(), after.created.UnixMicro(), after.id)
	}
	rows, err := s.db.QueryContext(ctx, sqlText+" ORDER BY created_at, request_id LIMIT ?", append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite tick entries: %w", err)
	}
	return sqliteEntries(rows)
}

func (s *sqliteStore) entry(ctx context.Context, id string) (Entry, bool, error) {
	rows, err := s.query(ctx, "SELECT "+readColumns+" FROM ledger_entries WHERE request_id = ?", id)
	if err != nil {
		return Entry{}, false, fmt.Errorf("ledger: sqlite entry: %w", err)
	}
	es, err := sqliteEntries(rows)
	if err != nil || len(es) == 0 {
		return Entry{}, false, err
	}
	return es[0], true, nil
}

// sqlitePeriod selects the roll-up rows of a period split by spendRanges
// (parameters d0, d1, from, d0, d1, to).
const sqlitePeriod = `((grain = 1 AND bucket >= ? AND bucket < ?) OR
	(grain = 0 AND ((bucket >= ? AND bucket < ?) OR (bucket >= ? AND bucket < ?))))`

func sqlitePeriodArgs(from, to time.Time) []any {
	d0, d1, _, _ := spendRanges(from, to)
	return []any{d0.UnixMicro(), d1.UnixMicro(), from.UnixMicro(), d0.UnixMicro(), d1.UnixMicro(), to.UnixMicro()}
}

// sqliteSumCost is the sum of the cost column as two columns, the sums of
// its high and low 32-bit halves, which joinHalves joins: neither can
// overflow before 2^31 rows, where SQLite's SUM of the column itself fails
// with "integer overflow" past the bounds of int64.
const sqliteSumCost = `COALESCE(SUM(cost >> 32), 0), COALESCE(SUM(cost & 4294967295), 0)`

func (s *sqliteStore) spend(ctx context.Context, tenant, user, key string, from, to time.Time) (costmodel.NanoUSD, error) {
	args := append([]any{tenant, scopeOf(user, key, user != "", key != "")}, sqlitePeriodArgs(from, to)...)
	var hi, lo int64
	st, err := s.stmt(ctx, `SELECT `+sqliteSumCost+` FROM ledger_spend
		WHERE tenant = ? AND scope = ? AND `+sqlitePeriod)
	if err != nil {
		return 0, err
	}
	if err := st.QueryRowContext(ctx, args...).Scan(&hi, &lo); err != nil {
		return 0, fmt.Errorf("ledger: sqlite spend: %w", err)
	}
	return costmodel.NanoUSD(joinHalves(hi, lo)), nil
}

func (s *sqliteStore) scopeSpend(ctx context.Context, tenant, prefix string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	args := append([]any{tenant, prefix}, sqlitePeriodArgs(from, to)...)
	rows, err := s.query(ctx, `SELECT scope, `+sqliteSumCost+` FROM ledger_spend
		WHERE tenant = ? AND substr(scope, 1, 2) = ? AND `+sqlitePeriod+` GROUP BY scope`, args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite %s: %w", scopeQuery[prefix], err)
	}
	defer rows.Close()
	out, err := scanScopeSpend(rows, prefix, true)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite %s: %w", scopeQuery[prefix], err)
	}
	return out, nil
}

func (s *sqliteStore) headSpend(ctx context.Context, tenant string, from, to time.Time) ([]headCharge, error) {
	rows, err := s.query(ctx, `SELECT user_id, key_id, region, `+sqliteSumCost+` FROM ledger_entries
		WHERE tenant = ? AND created_at >= ? AND created_at < ? GROUP BY user_id, key_id, region`, tenant, from.UnixMicro(), to.UnixMicro())
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite head spend: %w", err)
	}
	defer rows.Close()
	out, err := scanHeadCharges(rows, true)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite head spend: %w", err)
	}
	return out, nil
}

// sqliteCountsBy is the query of sqliteStore.countsBy for by: of a
// tenant's entries (every tenant's with every), a range scan of the index
// ledger_entries_tenant_time (ledger_entries_time). Its parameters are
// the tenant (not with every), then the range, the user, the key and the
// region (each twice) and, when limited, the most groups. It sums the
// counted requests and tokens, then the charge, each in 32-bit halves, as
// sqliteSumCost sums a cost: SQLite's SUM fails past the bounds of int64.
func sqliteCountsBy(by GroupBy, every, limited bool) string {
	selected, grouped := by.columns("''")
	halves := func(expr string) string {
		return `COALESCE(SUM(` + expr + ` >> 32), 0), COALESCE(SUM(` + expr + ` & 4294967295), 0)`
	}
	where := `tenant = ? AND `
	if every {
		where = ""
	}
	q := `SELECT ` + strings.Join(selected, ", ") + `, ` + halves(counted(countsRequest)) + `, ` +
		halves(counted(countsInput)) + `, ` + halves(counted(countsOutput)) + `, ` + sqliteSumCost + `, COALESCE(SUM(` + counted(countsEntry) + `), 0)
		FROM ledger_entries WHERE ` + where + by.descOnly() + `created_at >= ? AND created_at < ?
		AND (? = '' OR user_id = ?) AND (? = '' OR key_id = ?) AND (? = '' OR region = ?)` +
		groupClause(grouped) + ` HAVING COUNT(*) > 0`
	if !limited {
		return q
	}
	// The groups of the most requests first: the requests' high and low
	// halves are the columns after the selected ones.
	requests := len(selected) + 1
	return q + ` ORDER BY ` + strconv.Itoa(requests) + ` DESC, ` + strconv.Itoa(requests+1) + ` DESC LIMIT ?`
}

func (s *sqliteStore) countsBy(ctx context.Context, k spendQueryKey, from, to time.Time, limit int, each func(*Group)) error {
	args := []any{from.UnixMicro(), to.UnixMicro(), k.user, k.user, k.key, k.key, k.region, k.region}
	if limit > 0 {
		args = append(args, limit)
	}
	if k.tenant != "" {
		args = append([]any{k.tenant}, args...)
	}
	rows, err := s.query(ctx, sqliteCountsBy(k.by, k.tenant == "", limit > 0), args...)
	if err != nil {
		return fmt.Errorf("ledger: sqlite counts by: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var g Group
		var h [8]int64
		if err := rows.Scan(&g.User, &g.KeyID, &g.Route, &g.Upstream, &g.Model, &g.Region, &g.Plan, &g.KeyIP, &g.KeyAttrs, &g.KeyDesc,
			&h[0], &h[1], &h[2], &h[3], &h[4], &h[5], &h[6], &h[7], &g.Entries); err != nil {
			return fmt.Errorf("ledger: sqlite counts by: %w", err)
		}
		g.Counts = Counts{Requests: joinHalves(h[0], h[1]), InputTokens: joinHalves(h[2], h[3]), OutputTokens: joinHalves(h[4], h[5])}
		g.Charge = costmodel.NanoUSD(joinHalves(h[6], h[7]))
		each(&g)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ledger: sqlite counts by: %w", err)
	}
	return nil
}

func (s *sqliteStore) summary(ctx context.Context, from, to time.Time) ([]TenantSpend, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tenant, `+sqliteSumCost+`, SUM(entries) FROM ledger_spend
		WHERE scope = '' AND `+sqlitePeriod+` GROUP BY tenant ORDER BY tenant`, sqlitePeriodArgs(from, to)...)
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite summary: %w", err)
	}
	defer rows.Close()
	var out []TenantSpend
	for rows.Next() {
		var ts TenantSpend
		var hi, lo int64
		if err := rows.Scan(&ts.Tenant, &hi, &lo, &ts.Entries); err != nil {
			return nil, fmt.Errorf("ledger: sqlite summary: %w", err)
		}
		ts.Spend = costmodel.NanoUSD(joinHalves(hi, lo))
		out = append(out, ts)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: sqlite summary: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) nodes(ctx context.Context) ([]NodeState, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT node, open_since FROM ledger_nodes ORDER BY node")
	if err != nil {
		return nil, fmt.Errorf("ledger: sqlite nodes: %w", err)
	}
	type mark struct {
		node  string
		since int64
	}
	var marks []mark
	for rows.Next() {
		var m mark
		if err := rows.Scan(&m.node, &m.since); err != nil {
			rows.Close()
			return nil, fmt.Errorf("ledger: sqlite nodes: %w", err)
		}
		marks = append(marks, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: sqlite nodes: %w", err)
	}
	// One read per node of the entries since its mark, through the
	// created_at index.
	out := make([]NodeState, 0, len(marks))
	for _, m := range marks {
		ns := NodeState{Node: m.node}
		if m.since > 0 {
			var oldest sql.NullInt64
			if err := s.db.QueryRowContext(ctx, `SELECT count(*), min(created_at) FROM ledger_entries
				WHERE node = ? AND status = 'reserved' AND created_at >= ?`, m.node, m.since).Scan(&ns.Open, &oldest); err != nil {
				return nil, fmt.Errorf("ledger: sqlite nodes: %w", err)
			}
			if oldest.Valid {
				ns.Oldest = fromMicro(oldest.Int64)
			}
		}
		out = append(out, ns)
	}
	return out, nil
}
