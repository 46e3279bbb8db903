package main

import (
	"encoding/csv"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLedgerExportDates: --from and --to dates are whole UTC days, both
// included, so one date names one day; RFC 3339 times are exact, --to
// excluded.
func TestLedgerExportDates(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	dir := t.TempDir()
	config := writeConfig(t, dir, "./data")
	day := time.Date(2026, 3, 14, 0, 0, 0, 0, time.UTC)
	reserveAndClose(t, filepath.Join(dir, "data"), map[string]time.Time{
		"before": day.Add(-time.Microsecond),
		"first":  day,
		"noon":   day.Add(12 * time.Hour),
		"last":   day.Add(24*time.Hour - time.Microsecond),
		"after":  day.Add(24 * time.Hour),
	})
	for _, c := range []struct {
		name, from, to string
		want           []string
	}{
		{"one date is that day", "2026-03-14", "2026-03-14", []string{"first", "noon", "last"}},
		{"two dates are two days", "2026-03-14", "2026-03-15", []string{"first", "noon", "last", "after"}},
		{"times are exact", "2026-03-14T00:00:00Z", "2026-03-14T12:00:00Z", []string{"first"}},
		{"times in another zone", "2026-03-14T13:00:00+01:00", "2026-03-15T01:00:00.000001+01:00", []string{"noon", "last", "after"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, _, err := runCmd(t, "", "ledger", "export", "--config", config, "--tenant", "acme", "--from", c.from, "--to", c.to)
			if err != nil {
				t.Fatal(err)
			}
			recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range recs[1:] {
				got = append(got, r[0])
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("exported %v, want %v", got, c.want)
			}
		})
	}
	if _, _, err := runCmd(t, "", "ledger", "export", "--config", config, "--tenant", "acme", "--from", "2026-03-15", "--to", "2026-03-14"); err == nil {
		t.Fatal("--to a day before --from: no error")
	}
}
