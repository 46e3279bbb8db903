package ledger

// The PostgreSQL store, through pgx. A batch is one transaction: the rows it
// touches are read with SELECT ... FOR UPDATE, merged in Go, and written back
// with one INSERT ... SELECT FROM unnest(...) ON CONFLICT upsert, and the
// spend roll-up with another.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/costgate/costgate/costmodel"
)

type pgStore struct {
	pool *pgxpool.Pool

	mu       sync.Mutex
	migrated bool
}

// openPostgres connects and migrates. When the server cannot be reached the
// store still opens: the flusher migrates before its first batch, and until
// then entries wait in the spool.
func openPostgres(ctx context.Context, dsn string, logf func(string, ...any)) (*pgStore, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres dsn: %w", err)
	}
	if cfg.MaxConns < 4 {
		cfg.MaxConns = 4
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres: %w", err)
	}
	s := &pgStore{pool: pool}
	if err := s.migrate(ctx); err != nil {
		logf("ledger: %v (entries wait in the spool until it succeeds)", err)
	}
	return s, nil
}

// openPostgresReader connects for queries only, without migrating.
func openPostgresReader(ctx context.Context, dsn string) (*pgStore, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres: %w", err)
	}
	return &pgStore{pool: pool, migrated: true}, nil
}

// migrationLock is the advisory lock key that serializes migrations of
// concurrent nodes.
const migrationLock = 0x636f737467617465 // "costgate"

// applyLock is the advisory lock key that serializes the batches of
// concurrent nodes.
const applyLock = migrationLock + 1

func (s *pgStore) migrate(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.migrated {
		return nil
	}
	ms, err := migrations("postgres")
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("ledger: postgres migrate: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLock)); err != nil {
		return fmt.Errorf("ledger: postgres migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger_schema_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("ledger: postgres migrate: %w", err)
	}
	var have int
	if err := tx.QueryRow(ctx, "SELECT COALESCE(max(version), 0) FROM ledger_schema_migrations").Scan(&have); err != nil {
		return fmt.Errorf("ledger: postgres migrate: %w", err)
	}
	if have > len(ms) {
		return fmt.Errorf("ledger: postgres schema version %d is newer than this binary's %d", have, len(ms))
	}
	for _, m := range ms[have:] {
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("ledger: postgres migration %s: %w", m.name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO ledger_schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
			return fmt.Errorf("ledger: postgres migration %s: %w", m.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("ledger: postgres migrate: %w", err)
	}
	s.migrated = true
	return nil
}

func (s *pgStore) close() error {
	s.pool.Close()
	return nil
}

type pgTx struct{ tx pgx.Tx }

func (s *pgStore) begin(ctx context.Context) (storeTx, error) {
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres: %w", err)
	}
	// Batches of all nodes are serialized, so that the rows a batch loads
	// stay as loaded until it commits, even when two nodes were given the
	// same request id.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(applyLock)); err != nil {
		tx.Rollback(ctx)
		return nil, fmt.Errorf("ledger: postgres: %w", err)
	}
	return &pgTx{tx: tx}, nil
}

func pgTime(t time.Time) any {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

func pgEntries(rows pgx.Rows) ([]Entry, error) {
	defer rows.Close()
	var es []Entry
	for rows.Next() {
		var e Entry
		var created, settled pgtype.Timestamptz
		if err := scanEntry(rows, &e, &created, &settled); err != nil {
			return nil, fmt.Errorf("ledger: postgres scan: %w", err)
		}
		e.CreatedAt = micro(created.Time)
		if settled.Valid {
			e.SettledAt = micro(settled.Time)
		}
		es = append(es, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: postgres: %w", err)
	}
	return es, nil
}

func (t *pgTx) load(ctx context.Context, ids []string) (map[string]*Entry, error) {
	rows, err := t.tx.Query(ctx, "SELECT "+readColumns+" FROM ledger_entries WHERE request_id = ANY($1)", ids)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres load: %w", err)
	}
	es, err := pgEntries(rows)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*Entry, len(es))
	for i := range es {
		out[es[i].RequestID] = &es[i]
	}
	return out, nil
}

// pgUpsert writes a batch of rows from one array per column.
var pgUpsert = func() string {
	var params, set []string
	for i, c := range entryColumns {
		typ := "text[]"
		switch {
		case c == "created_at" || c == "settled_at":
			typ = "timestamptz[]"
		case i >= 13:
			typ = "int8[]"
		}
		params = append(params, fmt.Sprintf("$%d::%s", i+1, typ))
		if i > 0 {
			set = append(set, c+" = excluded."+c)
		}
	}
	return "INSERT INTO ledger_entries (" + strings.Join(entryColumns, ", ") + ") SELECT * FROM unnest(" +
		strings.Join(params, ", ") + ") ON CONFLICT (request_id) DO UPDATE SET " + strings.Join(set, ", ")
}()

func (t *pgTx) write(ctx context.Context, node string, rows []*Entry, deltas map[spendKey]int64) error {
	// One array per column; entryArgs gives each row's values in column
	// order, with times as pgtype.Timestamptz.
	texts := make([][]string, 13)
	ints := make([][]int64, len(entryColumns)-13-2)
	times := make([][]pgtype.Timestamptz, 2)
	for _, e := range rows {
		for i, v := range entryArgs(node, e, pgTime) {
			switch {
			case i < 13:
				texts[i] = append(texts[i], v.(string))
			case i < len(entryColumns)-2:
				ints[i-13] = append(ints[i-13], v.(int64))
			default:
				j := i - (len(entryColumns) - 2)
				times[j] = append(times[j], v.(pgtype.Timestamptz))
			}
		}
	}
	args := make([]any, 0, len(entryColumns))
	for _, c := range texts {
		args = append(args, c)
	}
	for _, c := range ints {
		args = append(args, c)
	}
	for _, c := range times {
		args = append(args, c)
	}
	if _, err := t.tx.Exec(ctx, pgUpsert, args...); err != nil {
		return fmt.Errorf("ledger: postgres upsert: %w", err)
	}
	if len(deltas) == 0 {
		return nil
	}
	keys := make([]spendKey, 0, len(deltas))
	for k := range deltas {
		keys = append(keys, k)
	}
	// A fixed order keeps concurrent nodes from deadlocking on the roll-up.
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.tenant != b.tenant {
			return a.tenant < b.tenant
		}
		if a.bucket != b.bucket {
			return a.bucket < b.bucket
		}
		if a.user != b.user {
			return a.user < b.user
		}
		return a.key < b.key
	})
	var tenants, users, keyIDs []string
	var buckets []time.Time
	var costs []int64
	for _, k := range keys {
		tenants, users, keyIDs = append(tenants, k.tenant), append(users, k.user), append(keyIDs, k.key)
		buckets = append(buckets, time.UnixMicro(k.bucket).UTC())
		costs = append(costs, deltas[k])
	}
	if _, err := t.tx.Exec(ctx, `INSERT INTO ledger_spend (tenant, bucket, user_id, key_id, cost)
		SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::int8[])
		ON CONFLICT (tenant, bucket, user_id, key_id) DO UPDATE SET cost = ledger_spend.cost + excluded.cost`,
		tenants, buckets, users, keyIDs, costs); err != nil {
		return fmt.Errorf("ledger: postgres spend: %w", err)
	}
	return nil
}

func (t *pgTx) recover(ctx context.Context, node string, at time.Time) (int64, error) {
	tag, err := t.tx.Exec(ctx, `UPDATE ledger_entries SET status = 'recovered',
		act_input = est_input, act_cached_input = est_cached_input, act_cache_write = est_cache_write,
		act_output = est_output, act_reasoning = est_reasoning, act_units = est_units,
		actual_cost = estimated_cost, cost = estimated_cost, settled_at = $1
		WHERE node = $2 AND status = 'reserved'
		AND created_at >= (SELECT open_since FROM ledger_nodes WHERE node = $2)`, at, node)
	if err != nil {
		return 0, fmt.Errorf("ledger: postgres recover: %w", err)
	}
	return tag.RowsAffected(), nil
}

func (t *pgTx) mark(ctx context.Context, node string, since time.Time, lower bool) error {
	set := "$2"
	if lower {
		set = "LEAST(ledger_nodes.open_since, $2)"
	}
	if _, err := t.tx.Exec(ctx, `INSERT INTO ledger_nodes (node, open_since) VALUES ($1, $2)
		ON CONFLICT (node) DO UPDATE SET open_since = `+set, node, pgTime(since)); err != nil {
		return fmt.Errorf("ledger: postgres mark: %w", err)
	}
	return nil
}

func (t *pgTx) commit(ctx context.Context) error {
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("ledger: postgres commit: %w", err)
	}
	return nil
}

func (t *pgTx) rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

func (s *pgStore) entries(ctx context.Context, q Query, after *cursor, limit int) ([]Entry, error) {
	var where []string
	var args []any
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	if q.Tenant != "" {
		where = append(where, "tenant = "+arg(q.Tenant))
	}
	if !q.From.IsZero() {
		where = append(where, "created_at >= "+arg(q.From))
	}
	if !q.To.IsZero() {
		where = append(where, "created_at < "+arg(q.To))
	}
	if after != nil {
		where = append(where, "(created_at, request_id) > ("+arg(after.created)+"::timestamptz, "+arg(after.id)+"::text)")
	}
	sqlText := "SELECT " + readColumns + " FROM ledger_entries"
	if len(where) > 0 {
		sqlText += " WHERE " + strings.Join(where, " AND ")
	}
	sqlText += " ORDER BY created_at, request_id LIMIT " + arg(limit)
	rows, err := s.pool.Query(ctx, sqlText, args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres entries: %w", err)
	}
	return pgEntries(rows)
}

func (s *pgStore) spend(ctx context.Context, tenant, user, key string, from, to time.Time) (costmodel.NanoUSD, error) {
	sqlText := "SELECT COALESCE(SUM(cost), 0)::bigint FROM ledger_spend WHERE tenant = $1 AND bucket >= $2 AND bucket < $3"
	args := []any{tenant, from, to}
	if user != "" {
		args = append(args, user)
		sqlText += fmt.Sprintf(" AND user_id = $%d", len(args))
	}
	if key != "" {
		args = append(args, key)
		sqlText += fmt.Sprintf(" AND key_id = $%d", len(args))
	}
	var v int64
	if err := s.pool.QueryRow(ctx, sqlText, args...).Scan(&v); err != nil {
		return 0, fmt.Errorf("ledger: postgres spend: %w", err)
	}
	return costmodel.NanoUSD(v), nil
}
