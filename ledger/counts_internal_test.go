package ledger

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
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
