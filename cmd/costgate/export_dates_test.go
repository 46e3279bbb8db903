package main

import (
	"encoding/csv"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/proxy"
)

// TestLedgerExportDates: --from and --to dates are whole UTC days, both
// included, so one date names one day; RFC 3339 times are exact, --to
// excluded. GET /admin/v1/ledger?from=&to= reads them the same way.
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
			if got := csvIDs(t, out); !slices.Equal(got, c.want) {
				t.Fatalf("exported %v, want %v", got, c.want)
			}
			code, body := adminLedger(t, config, url.Values{"tenant": {"acme"}, "from": {c.from}, "to": {c.to}, "format": {"csv"}})
			if code != http.StatusOK {
				t.Fatalf("GET /admin/v1/ledger: %d %s", code, body)
			}
			if got := csvIDs(t, body); !slices.Equal(got, c.want) {
				t.Fatalf("GET /admin/v1/ledger listed %v, want %v", got, c.want)
			}
		})
	}
	if _, _, err := runCmd(t, "", "ledger", "export", "--config", config, "--tenant", "acme", "--from", "2026-03-15", "--to", "2026-03-14"); err == nil {
		t.Fatal("--to a day before --from: no error")
	}
	if code, body := adminLedger(t, config, url.Values{"tenant": {"acme"}, "from": {"2026-03-15"}, "to": {"2026-03-14"}}); code != http.StatusBadRequest {
		t.Fatalf("GET /admin/v1/ledger with to a day before from: %d %s, want 400", code, body)
	}
}

// csvIDs returns the request ids of a CSV export.
func csvIDs(t *testing.T, out string) []string {
	t.Helper()
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs[1:] {
		ids = append(ids, r[0])
	}
	return ids
}

// adminLedger serves the config as serve would and asks its admin plane
// for the ledger.
func adminLedger(t *testing.T, config string, q url.Values) (int, string) {
	t.Helper()
	cf := configFlags{config: config}
	cfg, _, err := cf.load()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.Open(t.Context(), cfg, proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	req := httptest.NewRequest("GET", "/admin/v1/ledger?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer test-admin")
	rec := httptest.NewRecorder()
	srv.AdminHandler().ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}
