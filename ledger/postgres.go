package ledger

// The PostgreSQL store, through pgx. A batch is one transaction: the rows it
// touches are read with SELECT ... FOR UPDATE, merged in Go, and written back
// with one INSERT ... SELECT FROM unnest(...) ON CONFLICT upsert, and the
// spend roll-up with another.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/costgate/costgate/costmodel"
)

type pgStore struct {
	pool    *pgxpool.Pool
	applied int64 // the spool's applied position at open (see migrate)

	mu       sync.Mutex
	migrated bool
}

// openPostgres connects and migrates. When the server cannot be reached the
// store still opens: the flusher migrates before its first batch, and until
// then entries wait in the spool. applied is the spool's applied position:
// a database without the ledger's schema is refused when it is past 0
// (see migrate), at open when the server answers, else by every batch.
func openPostgres(ctx context.Context, dsn string, applied int64, logf func(string, ...any)) (*pgStore, error) {
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
	s := &pgStore{pool: pool, applied: applied}
	if err := s.migrate(ctx); errors.Is(err, errForgotten) {
		pool.Close()
		return nil, err
	} else if err != nil {
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
	if have == 0 && s.applied > 0 {
		return fmt.Errorf("%w: the PostgreSQL database has no ledger schema, but this node's spool was applied to one up to position %d: a new ledger would forget those entries (and the spend they count); restore the database, or move the spool (the data dir's spool folder) aside to start an empty ledger",
			errForgotten, s.applied)
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

// The timeouts of a batch's transaction (see begin).
var (
	pgLockTimeout = 30 * time.Second
	pgIdleTimeout = time.Minute
)

func pgMillis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

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
	// same request id. A transaction that holds the lock and goes silent
	// (its node cut off mid-batch) is ended by the server after
	// pgIdleTimeout, and a batch that waits for the lock longer than
	// pgLockTimeout fails, so that Stats reports it and the flusher
	// retries, instead of every node waiting unseen.
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $2, true), set_config('idle_in_transaction_session_timeout', $3, true), pg_advisory_xact_lock($1)",
		int64(applyLock), pgMillis(pgLockTimeout), pgMillis(pgIdleTimeout)); err != nil {
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

func (t *pgTx) remove(ctx context.Context, ids []string) ([]Entry, error) {
	rows, err := t.tx.Query(ctx, `DELETE FROM ledger_entries WHERE request_id = ANY($1)
		RETURNING tenant, user_id, key_id, created_at, cost`, ids)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres delete: %w", err)
	}
	defer rows.Close()
	gone := make([]Entry, 0, len(ids))
	for rows.Next() {
		e := Entry{Status: StatusSettled}
		var cost int64
		if err := rows.Scan(&e.Tenant, &e.User, &e.KeyID, &e.CreatedAt, &cost); err != nil {
			return nil, fmt.Errorf("ledger: postgres delete: %w", err)
		}
		e.CreatedAt, e.ActualCost = e.CreatedAt.UTC(), costmodel.NanoUSD(cost)
		gone = append(gone, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: postgres delete: %w", err)
	}
	return gone, nil
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

// updateColumns are the columns a settlement or an extension may change
// (none is indexed).
var updateColumns = []string{
	"route", "upstream", "model", "region", "decision", "policy", "friction", "status", "http_status",
	"act_input", "act_cached_input", "act_cache_write", "act_output", "act_reasoning", "act_units",
	"actual_cost", "cost", "settled_at", "act_extra",
	"est_input", "est_cached_input", "est_cache_write", "est_output", "est_reasoning", "est_units",
	"estimated_cost", "est_extra", "key_model", "key_route",
}

// pgUpdate updates a batch of rows from one array per column of
// request_id and updateColumns. As no indexed column changes, PostgreSQL
// can make it a heap-only update.
var pgUpdate = func() string {
	params := []string{"$1::text[]"}
	var set []string
	for i, c := range updateColumns {
		params = append(params, fmt.Sprintf("$%d::%s[]", i+2, pgType(c)))
		set = append(set, c+" = u."+c)
	}
	return "UPDATE ledger_entries AS e SET " + strings.Join(set, ", ") + " FROM unnest(" + strings.Join(params, ", ") +
		") AS u(request_id, " + strings.Join(updateColumns, ", ") + ") WHERE e.request_id = u.request_id"
}()

var pgCopy = "COPY ledger_entries (" + strings.Join(entryColumns, ", ") + ") FROM STDIN (FORMAT binary)"

// pgEpoch is the zero of PostgreSQL's binary timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()

// copyRows encodes rows in PostgreSQL's binary COPY format, column by
// column as entryColumns lists them and typed as the table declares them
// (text, integer for http_status, bigint, timestamptz). Encoding it here
// rather than through pgx's generic encoder halves the flusher's cost of a
// new row.
func copyRows(node string, rows []*Entry) []byte {
	b := make([]byte, 0, 19+len(rows)*400)
	b = append(b, "PGCOPY\n\xff\r\n\x00"...)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, 0) // header extension
	text := func(s string) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	num := func(v int64) {
		b = binary.BigEndian.AppendUint32(b, 8)
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	ts := func(t time.Time) {
		if t.IsZero() {
			b = binary.BigEndian.AppendUint32(b, 0xffffffff) // NULL
			return
		}
		num(t.UnixMicro() - pgEpoch)
	}
	for _, e := range rows {
		b = binary.BigEndian.AppendUint16(b, uint16(len(entryColumns)))
		for _, s := range [...]string{e.RequestID, node, e.Tenant, e.User, e.KeyID, e.Route, e.Upstream,
			e.Model, e.Region, e.Decision, e.Policy, e.Friction, string(e.Status)} {
			text(s)
		}
		b = binary.BigEndian.AppendUint32(b, 4)
		b = binary.BigEndian.AppendUint32(b, uint32(int32(e.HTTPStatus)))
		for _, v := range [...]int64{
			e.Estimated.InputTokens, e.Estimated.CachedInputTokens, e.Estimated.CacheWriteTokens,
			e.Estimated.OutputTokens, e.Estimated.ReasoningTokens, e.Estimated.Units,
			e.Actual.InputTokens, e.Actual.CachedInputTokens, e.Actual.CacheWriteTokens,
			e.Actual.OutputTokens, e.Actual.ReasoningTokens, e.Actual.Units,
			int64(e.EstimatedCost), int64(e.ActualCost), int64(e.Charge()),
		} {
			num(v)
		}
		ts(e.CreatedAt)
		ts(e.SettledAt)
		text(extraOf(&e.Estimated))
		text(extraOf(&e.Actual))
		num(e.Requests)
		text(e.KeyModel)
		text(e.KeyRoute)
		text(e.Plan)
		text(e.KeyIP)
		text(e.KeyAttrs)
		text(e.KeyDesc)
	}
	return binary.BigEndian.AppendUint16(b, 0xffff) // end of data
}

// pgType is the SQL type of an entries column.
func pgType(column string) string {
	i := slices.Index(entryColumns, column)
	switch {
	case column == "created_at" || column == "settled_at":
		return "timestamptz"
	case column == "est_extra" || column == "act_extra" || column == "key_model" || column == "key_route" || column == "plan" ||
		column == "key_ip" || column == "key_attrs" || column == "key_desc":
		return "text"
	case i >= slices.Index(entryColumns, "http_status"):
		return "int8"
	}
	return "text"
}

// column reads one column of an entry without boxing it: exactly one of
// its functions is set.
type column struct {
	text func(node string, e *Entry) string
	num  func(e *Entry) int64
	time func(e *Entry) time.Time
}

var columns = map[string]column{
	"request_id": {text: func(_ string, e *Entry) string { return e.RequestID }},
	"node":       {text: func(node string, _ *Entry) string { return node }},
	"tenant":     {text: func(_ string, e *Entry) string { return e.Tenant }},
	"user_id":    {text: func(_ string, e *Entry) string { return e.User }},
	"key_id":     {text: func(_ string, e *Entry) string { return e.KeyID }},
	"route":      {text: func(_ string, e *Entry) string { return e.Route }},
	"upstream":   {text: func(_ string, e *Entry) string { return e.Upstream }},
	"model":      {text: func(_ string, e *Entry) string { return e.Model }},
	"region":     {text: func(_ string, e *Entry) string { return e.Region }},
	"decision":   {text: func(_ string, e *Entry) string { return e.Decision }},
	"policy":     {text: func(_ string, e *Entry) string { return e.Policy }},
	"friction":   {text: func(_ string, e *Entry) string { return e.Friction }},
	"status":     {text: func(_ string, e *Entry) string { return string(e.Status) }},

	"http_status":      {num: func(e *Entry) int64 { return int64(e.HTTPStatus) }},
	"est_input":        {num: func(e *Entry) int64 { return e.Estimated.InputTokens }},
	"est_cached_input": {num: func(e *Entry) int64 { return e.Estimated.CachedInputTokens }},
	"est_cache_write":  {num: func(e *Entry) int64 { return e.Estimated.CacheWriteTokens }},
	"est_output":       {num: func(e *Entry) int64 { return e.Estimated.OutputTokens }},
	"est_reasoning":    {num: func(e *Entry) int64 { return e.Estimated.ReasoningTokens }},
	"est_units":        {num: func(e *Entry) int64 { return e.Estimated.Units }},
	"act_input":        {num: func(e *Entry) int64 { return e.Actual.InputTokens }},
	"act_cached_input": {num: func(e *Entry) int64 { return e.Actual.CachedInputTokens }},
	"act_cache_write":  {num: func(e *Entry) int64 { return e.Actual.CacheWriteTokens }},
	"act_output":       {num: func(e *Entry) int64 { return e.Actual.OutputTokens }},
	"act_reasoning":    {num: func(e *Entry) int64 { return e.Actual.ReasoningTokens }},
	"act_units":        {num: func(e *Entry) int64 { return e.Actual.Units }},
	"estimated_cost":   {num: func(e *Entry) int64 { return int64(e.EstimatedCost) }},
	"actual_cost":      {num: func(e *Entry) int64 { return int64(e.ActualCost) }},
	"cost":             {num: func(e *Entry) int64 { return int64(e.Charge()) }},

	"est_extra":  {text: func(_ string, e *Entry) string { return extraOf(&e.Estimated) }},
	"act_extra":  {text: func(_ string, e *Entry) string { return extraOf(&e.Actual) }},
	"requests":   {num: func(e *Entry) int64 { return e.Requests }},
	"key_model":  {text: func(_ string, e *Entry) string { return e.KeyModel }},
	"key_route":  {text: func(_ string, e *Entry) string { return e.KeyRoute }},
	"plan":       {text: func(_ string, e *Entry) string { return e.Plan }},
	"key_ip":     {text: func(_ string, e *Entry) string { return e.KeyIP }},
	"key_attrs":  {text: func(_ string, e *Entry) string { return e.KeyAttrs }},
	"key_desc":   {text: func(_ string, e *Entry) string { return e.KeyDesc }},
	"created_at": {time: func(e *Entry) time.Time { return e.CreatedAt }},
	"settled_at": {time: func(e *Entry) time.Time { return e.SettledAt }},
}

// columnArrays returns, for each of names, the array of its values over
// rows, typed for pgx to send in binary.
func columnArrays(node string, rows []*Entry, names []string) []any {
	arrays := make([]any, len(names))
	for j, name := range names {
		c := columns[name]
		switch {
		case c.text != nil:
			a := make([]string, len(rows))
			for i, e := range rows {
				a[i] = c.text(node, e)
			}
			arrays[j] = a
		case c.num != nil:
			a := make([]int64, len(rows))
			for i, e := range rows {
				a[i] = c.num(e)
			}
			arrays[j] = a
		default:
			a := make([]pgtype.Timestamptz, len(rows))
			for i, e := range rows {
				t := c.time(e)
				a[i] = pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
			}
			arrays[j] = a
		}
	}
	return arrays
}

func (t *pgTx) write(ctx context.Context, node string, inserts, updates []*Entry, deltas map[spendKey]spendDelta) error {
	// New rows go in with COPY: they were not there when loaded, and the
	// advisory lock keeps any other batch from adding them since.
	if len(inserts) > 0 {
		if _, err := t.tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(copyRows(node, inserts)), pgCopy); err != nil {
			return fmt.Errorf("ledger: postgres copy: %w", err)
		}
	}
	if len(updates) > 0 {
		args := columnArrays(node, updates, append([]string{"request_id"}, updateColumns...))
		tag, err := t.tx.Exec(ctx, pgUpdate, args...)
		if err != nil {
			return fmt.Errorf("ledger: postgres update: %w", err)
		}
		if tag.RowsAffected() != int64(len(updates)) {
			return fmt.Errorf("ledger: postgres update: %d of %d rows found", tag.RowsAffected(), len(updates))
		}
	}
	if len(deltas) == 0 {
		return nil
	}
	keys := make([]spendKey, 0, len(deltas))
	for k := range deltas {
		keys = append(keys, k)
	}
	// A fixed order keeps concurrent nodes from deadlocking on the roll-up.
	sort.Slice(keys, func(i, j int) bool { return spendLess(keys[i], keys[j]) })
	var tenants, scopes []string
	var grains []int16
	var buckets []time.Time
	var costs, counts []int64
	for _, k := range keys {
		tenants, scopes, grains = append(tenants, k.tenant), append(scopes, k.scope), append(grains, k.grain)
		buckets = append(buckets, time.UnixMicro(k.bucket).UTC())
		costs, counts = append(costs, deltas[k].cost), append(counts, deltas[k].entries)
	}
	if _, err := t.tx.Exec(ctx, `INSERT INTO ledger_spend (tenant, scope, grain, bucket, cost, entries)
		SELECT * FROM unnest($1::text[], $2::text[], $3::int2[], $4::timestamptz[], $5::int8[], $6::int8[])
		ON CONFLICT (tenant, scope, grain, bucket) DO UPDATE
		SET cost = LEAST(GREATEST(ledger_spend.cost::numeric + excluded.cost, -9223372036854775808), 9223372036854775807)::bigint,
			entries = ledger_spend.entries + excluded.entries`,
		tenants, scopes, grains, buckets, costs, counts); err != nil {
		return fmt.Errorf("ledger: postgres spend: %w", err)
	}
	return nil
}

func (t *pgTx) recover(ctx context.Context, node, marker string, at time.Time) (int64, error) {
	tag, err := t.tx.Exec(ctx, `INSERT INTO ledger_nodes (node, marker) VALUES ($1, $2)
		ON CONFLICT (node) DO UPDATE SET marker = $2 WHERE ledger_nodes.marker IS DISTINCT FROM $2`, node, marker)
	if err != nil {
		return 0, fmt.Errorf("ledger: postgres recover: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return 0, nil // this marker is applied already
	}
	tag, err = t.tx.Exec(ctx, `UPDATE ledger_entries SET status = 'recovered',
		act_input = est_input, act_cached_input = est_cached_input, act_cache_write = est_cache_write,
		act_output = est_output, act_reasoning = est_reasoning, act_units = est_units, act_extra = est_extra,
		actual_cost = estimated_cost, cost = estimated_cost, settled_at = $1
		WHERE node = $2 AND status = 'reserved'
		AND created_at >= (SELECT open_since FROM ledger_nodes WHERE node = $2)`, at, node)
	if err != nil {
		return 0, fmt.Errorf("ledger: postgres recover: %w", err)
	}
	return tag.RowsAffected(), nil
}

func (t *pgTx) recoverNode(ctx context.Context, node string, before, at time.Time) (int64, error) {
	tag, err := t.tx.Exec(ctx, `UPDATE ledger_entries SET status = 'recovered',
		act_input = est_input, act_cached_input = est_cached_input, act_cache_write = est_cache_write,
		act_output = est_output, act_reasoning = est_reasoning, act_units = est_units, act_extra = est_extra,
		actual_cost = estimated_cost, cost = estimated_cost, settled_at = $1
		WHERE node = $2 AND status = 'reserved' AND created_at < $3
		AND created_at >= (SELECT open_since FROM ledger_nodes WHERE node = $2)`, at, node, before)
	if err != nil {
		return 0, fmt.Errorf("ledger: postgres recover node: %w", err)
	}
	if _, err := t.tx.Exec(ctx, `UPDATE ledger_nodes SET open_since = (SELECT min(created_at)
		FROM ledger_entries WHERE node = ledger_nodes.node AND status = 'reserved' AND created_at >= ledger_nodes.open_since)
		WHERE node = $1 AND open_since IS NOT NULL`, node); err != nil {
		return 0, fmt.Errorf("ledger: postgres recover node: %w", err)
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

func (s *pgStore) tickEntries(ctx context.Context, node string, from, to time.Time, after *cursor, limit int) ([]Entry, error) {
	sqlText := "SELECT " + readColumns + ` FROM ledger_entries WHERE created_at >= $1 AND created_at < $2
		AND starts_with(request_id, $3) AND node = $4 AND status = 'settled'`
	args := []any{from, to, tickEntryPrefix, node}
	if after != nil {
		sqlText += " AND (created_at, request_id) > ($5::timestamptz, $6::text)"
		args = append(args, after.created, after.id)
	}
	args = append(args, limit)
	rows, err := s.pool.Query(ctx, sqlText+fmt.Sprintf(" ORDER BY created_at, request_id LIMIT $%d", len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres tick entries: %w", err)
	}
	return pgEntries(rows)
}

func (s *pgStore) entry(ctx context.Context, id string) (Entry, bool, error) {
	rows, err := s.pool.Query(ctx, "SELECT "+readColumns+" FROM ledger_entries WHERE request_id = $1", id)
	if err != nil {
		return Entry{}, false, fmt.Errorf("ledger: postgres entry: %w", err)
	}
	es, err := pgEntries(rows)
	if err != nil || len(es) == 0 {
		return Entry{}, false, err
	}
	return es[0], true, nil
}

// pgPeriod selects the roll-up rows of a period [from, to) split by
// spendRanges into whole UTC days [d0, d1) and 15-minute buckets; the
// parameters $n to $n+3 are d0, d1, from and to.
func pgPeriod(n int) string {
	d0, d1, from, to := fmt.Sprintf("$%d", n), fmt.Sprintf("$%d", n+1), fmt.Sprintf("$%d", n+2), fmt.Sprintf("$%d", n+3)
	return "((grain = 1 AND bucket >= " + d0 + " AND bucket < " + d1 + ") OR (grain = 0 AND ((bucket >= " + from +
		" AND bucket < " + d0 + ") OR (bucket >= " + d1 + " AND bucket < " + to + "))))"
}

// spendLess orders roll-up keys.
func spendLess(a, b spendKey) bool {
	if a.tenant != b.tenant {
		return a.tenant < b.tenant
	}
	if a.scope != b.scope {
		return a.scope < b.scope
	}
	if a.grain != b.grain {
		return a.grain < b.grain
	}
	return a.bucket < b.bucket
}

// pgSumCost is the sum of the cost column as a bigint, saturating at its
// bounds: SUM of bigint is numeric, which the cast would refuse past them.
const pgSumCost = `GREATEST(LEAST(COALESCE(SUM(cost), 0), 9223372036854775807), -9223372036854775808)::bigint`

func (s *pgStore) spend(ctx context.Context, tenant, user, key string, from, to time.Time) (costmodel.NanoUSD, error) {
	d0, d1, _, _ := spendRanges(from, to)
	var v int64
	if err := s.pool.QueryRow(ctx, `SELECT `+pgSumCost+` FROM ledger_spend
		WHERE tenant = $1 AND scope = $2 AND `+pgPeriod(3),
		tenant, scopeOf(user, key, user != "", key != ""), d0, d1, from, to).Scan(&v); err != nil {
		return 0, fmt.Errorf("ledger: postgres spend: %w", err)
	}
	return costmodel.NanoUSD(v), nil
}

func (s *pgStore) scopeSpend(ctx context.Context, tenant, prefix string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	d0, d1, _, _ := spendRanges(from, to)
	rows, err := s.pool.Query(ctx, `SELECT scope, `+pgSumCost+` FROM ledger_spend
		WHERE tenant = $1 AND starts_with(scope, $2) AND `+pgPeriod(3)+` GROUP BY scope`,
		tenant, prefix, d0, d1, from, to)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres %s: %w", scopeQuery[prefix], err)
	}
	defer rows.Close()
	out, err := scanScopeSpend(rows, prefix, false)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres %s: %w", scopeQuery[prefix], err)
	}
	return out, nil
}

func (s *pgStore) headSpend(ctx context.Context, tenant string, from, to time.Time) ([]headCharge, error) {
	rows, err := s.pool.Query(ctx, `SELECT user_id, key_id, region, `+pgSumCost+` FROM ledger_entries
		WHERE tenant = $1 AND created_at >= $2 AND created_at < $3 GROUP BY user_id, key_id, region`, tenant, from, to)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres head spend: %w", err)
	}
	defer rows.Close()
	out, err := scanHeadCharges(rows, false)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres head spend: %w", err)
	}
	return out, nil
}

// pgSat is the sum of expr over the selected rows, saturated to the
// bounds of int64 (PostgreSQL sums a bigint as numeric).
func pgSat(expr string) string {
	return `GREATEST(LEAST(COALESCE(SUM(` + expr + `), 0), 9223372036854775807), -9223372036854775808)::bigint`
}

// pgCountsBy is the query of pgStore.countsBy for by: of a tenant's
// entries (every tenant's with every), a range scan of the index
// ledger_entries_tenant_time (ledger_entries_time). Its parameters are
// the tenant (not with every), then the range, the user, the key, the
// region and, when limited, the most groups.
func pgCountsBy(by GroupBy, every, limited bool) string {
	selected, grouped := by.columns("''::text")
	where, n := `tenant = $1 AND `, 1
	if every {
		where, n = "", 0
	}
	p := func(i int) string { return "$" + strconv.Itoa(n+i) }
	q := `SELECT ` + strings.Join(selected, ", ") + `, ` + pgSat(counted(countsRequest)) + `, ` +
		pgSat(counted(countsInput)) + `, ` + pgSat(counted(countsOutput)) + `, ` + pgSumCost + `, ` + pgSat(counted(countsEntry)) + `
		FROM ledger_entries WHERE ` + where + by.descOnly() + `created_at >= ` + p(1) + ` AND created_at < ` + p(2) + `
		AND (` + p(3) + ` = '' OR user_id = ` + p(3) + `) AND (` + p(4) + ` = '' OR key_id = ` + p(4) + `) AND (` + p(5) + ` = '' OR region = ` + p(5) + `)` +
		groupClause(grouped) + ` HAVING COUNT(*) > 0`
	if !limited {
		return q
	}
	// The groups of the most requests first: the requests are the column
	// after the selected ones.
	return q + ` ORDER BY ` + strconv.Itoa(len(selected)+1) + ` DESC LIMIT ` + p(6)
}

func (s *pgStore) countsBy(ctx context.Context, k spendQueryKey, from, to time.Time, limit int, each func(*Group)) error {
	args := []any{from, to, k.user, k.key, k.region}
	if limit > 0 {
		args = append(args, limit)
	}
	if k.tenant != "" {
		args = append([]any{k.tenant}, args...)
	}
	rows, err := s.pool.Query(ctx, pgCountsBy(k.by, k.tenant == "", limit > 0), args...)
	if err != nil {
		return fmt.Errorf("ledger: postgres counts by: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var g Group
		var charge int64
		if err := rows.Scan(&g.User, &g.KeyID, &g.Route, &g.Upstream, &g.Model, &g.Region, &g.Plan, &g.KeyIP, &g.KeyAttrs, &g.KeyDesc,
			&g.Counts.Requests, &g.Counts.InputTokens, &g.Counts.OutputTokens, &charge, &g.Entries); err != nil {
			return fmt.Errorf("ledger: postgres counts by: %w", err)
		}
		g.Charge = costmodel.NanoUSD(charge)
		each(&g)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ledger: postgres counts by: %w", err)
	}
	return nil
}

func (s *pgStore) summary(ctx context.Context, from, to time.Time) ([]TenantSpend, error) {
	d0, d1, _, _ := spendRanges(from, to)
	rows, err := s.pool.Query(ctx, `SELECT tenant, `+pgSumCost+`, SUM(entries)::bigint FROM ledger_spend
		WHERE scope = '' AND `+pgPeriod(1)+` GROUP BY tenant ORDER BY tenant`, d0, d1, from, to)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres summary: %w", err)
	}
	defer rows.Close()
	var out []TenantSpend
	for rows.Next() {
		var ts TenantSpend
		var cost int64
		if err := rows.Scan(&ts.Tenant, &cost, &ts.Entries); err != nil {
			return nil, fmt.Errorf("ledger: postgres summary: %w", err)
		}
		ts.Spend = costmodel.NanoUSD(cost)
		out = append(out, ts)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: postgres summary: %w", err)
	}
	return out, nil
}

func (s *pgStore) nodes(ctx context.Context) ([]NodeState, error) {
	// One read of the entries since each node's mark, through the
	// created_at index (LATERAL: per node, with its own bound).
	rows, err := s.pool.Query(ctx, `SELECT n.node, o.open, o.oldest FROM ledger_nodes n
		LEFT JOIN LATERAL (SELECT count(*) AS open, min(e.created_at) AS oldest FROM ledger_entries e
			WHERE e.node = n.node AND e.status = 'reserved' AND e.created_at >= n.open_since) o ON true
		ORDER BY n.node`)
	if err != nil {
		return nil, fmt.Errorf("ledger: postgres nodes: %w", err)
	}
	defer rows.Close()
	var out []NodeState
	for rows.Next() {
		var ns NodeState
		var oldest pgtype.Timestamptz
		if err := rows.Scan(&ns.Node, &ns.Open, &oldest); err != nil {
			return nil, fmt.Errorf("ledger: postgres nodes: %w", err)
		}
		if oldest.Valid {
			ns.Oldest = micro(oldest.Time)
		}
		out = append(out, ns)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: postgres nodes: %w", err)
	}
	return out, nil
}
