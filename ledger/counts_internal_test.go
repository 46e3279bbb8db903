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
)

// TestCountsScansTheTenantsRange: the embedded store's counts read is a
// range scan of the index on (tenant, created_at), not a scan of every
// entry, whatever the caller filters it names.
func TestCountsScansTheTenantsRange(t *testing.T) {
	ctx := context.Background()
	s, err := openSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	rows, err := s.db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+sqliteCounts, "acme", 0, 1, "ann", "ann", "", "", "eu", "eu")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
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
	joined := strings.Join(plan, "; ")
	if !strings.Contains(joined, "USING INDEX ledger_entries_tenant_time (tenant=? AND created_at>? AND created_at<?)") {
		t.Fatalf("plan %q: want a range scan of ledger_entries_tenant_time", joined)
	}
}

// TestCountsOfEntriesStoredBeforeRequests: an embedded store written
// before migration 004 keeps its entries' meaning: each admitted one
// counts one request.
func TestCountsOfEntriesStoredBeforeRequests(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	old := slices.Index(entryColumns, "requests")
	for _, m := range ms {
		if strings.Contains(m.sql, "requests") {
			break
		}
		if _, err := db.ExecContext(ctx, m.sql); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", m.version)); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	e := &Entry{RequestID: "r1", Tenant: "acme", Decision: "allow", Status: StatusSettled, HTTPStatus: 200, CreatedAt: at, SettledAt: at}
	q := "INSERT INTO ledger_entries (" + strings.Join(entryColumns[:old], ", ") + ") VALUES (?" + strings.Repeat(", ?", old-1) + ")"
	if _, err := db.ExecContext(ctx, q, entryArgs("n1", e, sqliteTime)[:old]...); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := openSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	c, err := s.counts(ctx, spendQueryKey{tenant: "acme"}, at.Add(-time.Hour), at.Add(time.Hour))
	if err != nil || c.Requests != 1 {
		t.Fatalf("Counts of an entry stored before its requests = %+v, %v; want 1 request", c, err)
	}
}
