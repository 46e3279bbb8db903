package main

import (
	"os"
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

// TestConfigPrecedence: the flags win over the config file, and the file
// over the environment's defaults (COSTGATE_ADMIN_TOKEN, REDIS_URL,
// DATABASE_URL), which fill what the file leaves out.
func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	write := func(yaml string) string {
		t.Helper()
		p := filepath.Join(dir, "costgate.yaml")
		if err := os.WriteFile(p, []byte(yaml+"upstreams: [{name: openai, kind: openai, simulate: always}]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("COSTGATE_CONFIG", "")
	t.Setenv("COSTGATE_ADMIN_TOKEN", "env-token")
	t.Setenv("REDIS_URL", "redis://env:6379")
	t.Setenv("DATABASE_URL", "postgres://env/db")

	cf := configFlags{config: write("")}
	cfg, _, err := cf.load()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminToken != "env-token" || cfg.Store.Redis != "redis://env:6379" || cfg.Ledger.DSN != "postgres://env/db" {
		t.Errorf("a file without them: %q, %q, %q; want the environment's", cfg.AdminToken, cfg.Store.Redis, cfg.Ledger.DSN)
	}

	cf = configFlags{config: write("admin_token: file-token\nstore: {redis: 'redis://file:6379'}\nledger: {dsn: 'postgres://file/db'}\n")}
	if cfg, _, err = cf.load(); err != nil {
		t.Fatal(err)
	}
	if cfg.AdminToken != "file-token" || cfg.Store.Redis != "redis://file:6379" || cfg.Ledger.DSN != "postgres://file/db" {
		t.Errorf("a file with them: %q, %q, %q; want the file's", cfg.AdminToken, cfg.Store.Redis, cfg.Ledger.DSN)
	}

	cf.redis, cf.ledger = "redis://flag:6379", "postgres://flag/db"
	if cfg, _, err = cf.load(); err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Redis != "redis://flag:6379" || cfg.Ledger.DSN != "postgres://flag/db" {
		t.Errorf("with flags: %q, %q; want the flags'", cfg.Store.Redis, cfg.Ledger.DSN)
	}
	if _, ok := os.LookupEnv("REDIS_URL"); !ok || os.Getenv("REDIS_URL") != "redis://env:6379" {
		t.Errorf("loading the config changed REDIS_URL to %q", os.Getenv("REDIS_URL"))
	}
}
