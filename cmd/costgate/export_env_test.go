package main

import (
	"path/filepath"
	"testing"
)

// TestExportWithConfigFromEnvironment: serve and ledger export read the
// same config from COSTGATE_CONFIG, whose data_dir is relative.
func TestExportWithConfigFromEnvironment(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	dir := t.TempDir()
	writeConfig(t, dir, "./data")
	t.Setenv("COSTGATE_CONFIG", filepath.Join(dir, "costgate.yaml"))
	t.Chdir(t.TempDir())
	s := serveOnce(t)
	out, _, err := runCmd(t, "", append([]string{"ledger", "export", "--tenant", "acme"}, exportDays()...)...)
	if err != nil {
		t.Fatal(err)
	}
	checkExport(t, out, s)
}
