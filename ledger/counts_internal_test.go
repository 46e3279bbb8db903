package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/internal/pgtest"
)

// TestCountsScansTheTenantsRange: the embedded store's counts read is a
// range scan of the index on (tenant, created_at), not a scan of every
// entry, whatever the caller filters it names; every tenant's
// (TotalCountsBy) is a range scan of the index on created_at.
func TestCountsScansTheTenantsRange(t *testing.T) {
	ctx := context.Background()
	s, err := openSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	for _, c := range []struct {
		name  string
		query string
		args  []any
		want  string
	}{
		{"a tenant's", sqliteCountsBy(GroupBy{Model: true}, false, true), []any{"acme", 0, 1, "ann", "ann", "", "", "eu", "eu", MaxGroups},
			"USING INDEX ledger_entries_tenant_time (tenant=? AND created_at>? AND created_at<?)"},
		{"every tenant's", sqliteCountsBy(GroupBy{Model: true}, true, true), []any{0, 1, "", "", "", "", "eu", "eu", MaxGroups},
			"USING INDEX ledger_entries_time (created_at>? AND created_at<?)"},
		{"a tenant's by descriptor counters, every group", sqliteCountsBy(GroupBy{Desc: true}, false, false), []any{"acme", 0, 1, "", "", "", "", "", ""},
			"USING INDEX ledger_entries_tenant_time (tenant=? AND created_at>? AND created_at<?)"},
	} {
		rows, err := s.db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+c.query, c.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if joined := strings.Join(plan, "; "); !strings.Contains(joined, c.want) {
			t.Errorf("%s plan %q: want %q", c.name, joined, c.want)
		}
	}
}

// TestCountsOfEntriesStoredBeforeRequests: a store written before
// migration 004, embedded or PostgreSQL, keeps its entries' meaning once
// migrated: each admitted one counts one request.
func TestCountsOfEntriesStoredBeforeRequests(t *testing.T) {
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	e := &Entry{RequestID: "r1", Tenant: "acme", Decision: "allow", Status: StatusSettled, HTTPStatus: 200, CreatedAt: at, SettledAt: at}
	storedBefore(t, "requests", e, func(t *testing.T, s store) {
		gs, err := readGroups(context.Background(), s, spendQueryKey{tenant: "acme"}, at.Add(-time.Hour), at.Add(time.Hour))
		if err != nil || len(gs) != 1 || gs[0].Counts.Requests != 1 {
			t.Fatalf("Counts of an entry stored before its requests = %+v, %v; want 1 request", gs, err)
		}
	})
}

// storedBefore writes e, on each store, with the migrations before the
// first whose name holds column (whose column is the first it adds, in
// entryColumns' order) and the columns before it only, then opens the
// store, which applies the rest, and runs check on it.
func storedBefore(t *testing.T, column string, e *Entry, check func(t *testing.T, s store)) {
	t.Helper()
	old := slices.Index(entryColumns, column) // the columns before it
	insert := func(param func(int) string) string {
		ps := make([]string, old)
		for i := range ps {
			ps[i] = param(i + 1)
		}
		return "INSERT INTO ledger_entries (" + strings.Join(entryColumns[:old], ", ") + ") VALUES (" + strings.Join(ps, ", ") + ")"
	}
	// before applies the migrations before column's with exec, and
	// records each with mark.
	before := func(t *testing.T, dialect string, exec func(q string, args ...any) error, mark func(m migration) error) {
		t.Helper()
		ms, err := migrations(dialect)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if strings.Contains(m.name, column) {
				return
			}
			if err := exec(m.sql); err != nil {
				t.Fatal(err)
			}
			if err := mark(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	t.Run("embedded", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ledger.db")
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		exec := func(q string, args ...any) error { _, err := db.ExecContext(ctx, q, args...); return err }
		before(t, "sqlite", exec, func(m migration) error { return exec(fmt.Sprintf("PRAGMA user_version = %d", m.version)) })
		if err := exec(insert(func(int) string { return "?" }), entryArgs("n1", e, sqliteTime)[:old]...); err != nil {
			t.Fatal(err)
		}
		db.Close()
		s, err := openSQLite(ctx, path, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		check(t, s)
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.New(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		exec := func(q string, args ...any) error { _, err := conn.Exec(ctx, q, args...); return err }
		if err := exec(`CREATE TABLE ledger_schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			t.Fatal(err)
		}
		before(t, "postgres", exec, func(m migration) error {
			return exec("INSERT INTO ledger_schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
		})
		pgTime := func(t time.Time) any { return t }
		if err := exec(insert(func(i int) string { return fmt.Sprintf("$%d", i) }), entryArgs("n1", e, pgTime)[:old]...); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		s, err := openPostgres(ctx, dsn, 0, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		check(t, s)
	})
}
