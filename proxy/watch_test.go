package proxy_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/proxy"
)

func TestWatchReloadsOnFileChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "costgate.yaml")
	write := func(keys string) {
		t.Helper()
		y := "admin_token: x\ndata_dir: data\nupstreams: [{name: openai, kind: openai, simulate: always}]\ntenants: [{name: acme, plan: p, keys: [" + keys + "]}]\n"
		// Write and rename, as editors and config managers do.
		if err := os.WriteFile(path+".tmp", []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("{key: cg-one}")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store.Redis, cfg.Ledger.DSN = "", ""
	load := func() (*config.Config, error) {
		c, err := config.Load(path)
		if err == nil {
			c.Store.Redis, c.Ledger.DSN = "", ""
		}
		return c, err
	}
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{Loader: load})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := srv.Watch(ctx, path); err != nil {
		t.Fatal(err)
	}
	status := func(key string) int {
		req := httptest.NewRequest("GET", "/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	waitFor := func(key string, want int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); status(key) != want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("key %s: status %d, want %d after the file changed", key, status(key), want)
			}
		}
	}
	if status("cg-one") != 200 || status("cg-two") != 401 {
		t.Fatal("initial keys")
	}
	write("{key: cg-one}, {key: cg-two}")
	waitFor("cg-two", 200)

	write("{key: cg-three, key_env: ALSO}") // invalid: two sources
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Authorization", "Bearer x")
		rec := httptest.NewRecorder()
		srv.AdminHandler().ServeHTTP(rec, req)
		if strings.Contains(rec.Body.String(), "costgate_config_last_reload_success 0") {
			break // the broken file was tried and refused
		}
		if time.Now().After(deadline) {
			t.Fatal("the broken config was never tried")
		}
	}
	if status("cg-two") != 200 || status("cg-three") != 401 {
		t.Error("a broken config replaced the last good one")
	}
}

// TestWatchReloadsOnPolicySubfolderEdit: a policy in a subfolder of the
// policy directory (policies/lib/*.rego) is loaded, and editing it, or adding
// one in a subfolder made after Watch started, reloads the config.
func TestWatchReloadsOnPolicySubfolderEdit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		// Write and rename, as editors do.
		if err := os.WriteFile(p+".tmp", []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
	}
	policy := func(pkg, outcome string) string {
		if outcome == "allow" {
			return "package costgate.policies." + pkg + "\n\ndecision := {\"outcome\": \"allow\"}\n"
		}
		return "package costgate.policies." + pkg + "\n\ndecision := {\"outcome\": \"hard\", \"status\": 403, \"reason\": \"" + pkg + " says no\"}\n"
	}
	path := filepath.Join(dir, "costgate.yaml")
	write("costgate.yaml", "admin_token: x\ndata_dir: data\npolicies: {dir: policies}\nupstreams: [{name: openai, kind: openai, simulate: always}]\ntenants: [{name: acme, plan: p, keys: [{key: cg-one}]}]\n")
	write("policies/main.rego", policy("main", "allow"))
	write("policies/lib/lib.rego", policy("lib", "allow"))
	load := func() (*config.Config, error) {
		c, err := config.Load(path)
		if err == nil {
			c.Store.Redis, c.Ledger.DSN = "", ""
		}
		return c, err
	}
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{Loader: load})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := srv.Watch(ctx, path); err != nil {
		t.Fatal(err)
	}
	status := func() int {
		req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer cg-one")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	waitFor := func(what string, want int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); status() != want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: status %d, want %d", what, status(), want)
			}
		}
	}
	if got := status(); got != 200 {
		t.Fatalf("before any edit: status %d, want 200", got)
	}
	write("policies/lib/lib.rego", policy("lib", "hard"))
	waitFor("after policies/lib/lib.rego was edited to refuse", 403)
	write("policies/lib/lib.rego", policy("lib", "allow"))
	waitFor("after policies/lib/lib.rego was edited back", 200)
	write("policies/lib/more/deep.rego", policy("deep", "hard"))
	waitFor("after a policy was added in a new subfolder", 403)
}

// TestWatchPolicyConfigMapLayout follows a Kubernetes ConfigMap volume as
// the policy directory: its files are symlinks into a hidden ..data
// directory, itself a symlink swapped atomically on update; the swap reloads.
func TestWatchPolicyConfigMapLayout(t *testing.T) {
	dir := t.TempDir()
	pdir := filepath.Join(dir, "policies")
	if err := os.Mkdir(pdir, 0o755); err != nil {
		t.Fatal(err)
	}
	version := func(name, outcome string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(pdir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		src := "package costgate.policies.p\n\ndecision := {\"outcome\": \"allow\"}\n"
		if outcome == "hard" {
			src = "package costgate.policies.p\n\ndecision := {\"outcome\": \"hard\", \"status\": 403, \"reason\": \"no\"}\n"
		}
		if err := os.WriteFile(filepath.Join(pdir, name, "p.rego"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(pdir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(pdir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "allow")
	if err := os.Symlink(filepath.Join("..data", "p.rego"), filepath.Join(pdir, "p.rego")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "costgate.yaml")
	if err := os.WriteFile(path, []byte("admin_token: x\ndata_dir: data\npolicies: {dir: policies}\nupstreams: [{name: openai, kind: openai, simulate: always}]\ntenants: [{name: acme, plan: p, keys: [{key: cg-one}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	load := func() (*config.Config, error) {
		c, err := config.Load(path)
		if err == nil {
			c.Store.Redis, c.Ledger.DSN = "", ""
		}
		return c, err
	}
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{Loader: load})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Watch(t.Context(), path); err != nil {
		t.Fatal(err)
	}
	status := func() int {
		req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer cg-one")
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	if got := status(); got != 200 {
		t.Fatalf("before the swap: status %d, want 200", got)
	}
	version("..v2", "hard")
	for deadline := time.Now().Add(10 * time.Second); status() != 403; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after the ConfigMap swap: status %d, want 403", status())
		}
	}
}

// TestParseIsPure: parsing reads the YAML and the Defaults it is given,
// never the environment; the file's values win over the Defaults.
