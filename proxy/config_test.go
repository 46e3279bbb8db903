package proxy_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/proxy"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	base := "admin_token: x\nupstreams: [{name: openai, kind: openai, base_url: 'http://127.0.0.1:1'}]\n"
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown field", base + "limitz: []\n", "field limitz not found"},
		{"bad algorithm", base + "limits: [{name: a, algorithm: leaky, rate: 1, period: 1s}]\n", `limits[0].algorithm: unknown algorithm "leaky"`},
		{"no rate", base + "limits: [{name: a, period: 1s}]\n", "limits[0].rate: required"},
		{"no usd rate", base + "limits: [{name: a, unit: usd, period: 1s}]\n", "limits[0].rate_usd: required"},
		{"no period", base + "limits: [{name: a, rate: 1}]\n", "limits[0].period: required"},
		{"negative burst", base + "limits: [{name: a, rate: 1, period: 1s, burst: -1}]\n", "limits[0].burst: must not be negative"},
		{"burst on a window", base + "limits: [{name: a, algorithm: fixed_window, rate: 1, period: 1s, burst: 5}]\n", "limits[0].burst: does not apply to fixed_window"},
		{"key delimiter in a name", base + "limits: [{name: 'a:b', rate: 1, period: 1s}]\n", "limits[0].name: must not contain"},
		{"bad unit", base + "limits: [{name: a, unit: bananas, rate: 1, period: 1s}]\n", "limits[0].unit"},
		{"bad dimension", base + "limits: [{name: a, dimensions: [moon], rate: 1, period: 1s}]\n", "limits[0].dimensions"},
		{"duplicate limit", base + "limits: [{name: a, rate: 1, period: 1s}, {name: a, rate: 1, period: 1s}]\n", "limits[1].name"},
		{"usd with rate", base + "limits: [{name: a, unit: usd, rate: 5, period: 1s}]\n", "limits[0].rate"},
		{"bad money", base + "budgets: [{name: b, amount: '1.0000000001'}]\n", "nine decimals"},
		{"two key sources", base + "tenants: [{name: t, plan: p, keys: [{key: a, key_env: B}]}]\n", "tenants[0].keys[0]"},
		{"missing key file", base + "tenants: [{name: t, plan: p, keys: [{key_file: /nonexistent/key}]}]\n", "tenants[0].keys[0].key_file"},
		{"generic without cost", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1'}]\n", "upstreams[0].cost"},
		{"route to nowhere", base + "routes: [{path: /v1/chat/completions, upstream: nope}]\n", "routes[0].upstream"},
		{"bad posture", base + "limits: [{name: a, rate: 1, period: 1s, on_store_failure: maybe}]\n", "limits[0].on_store_failure"},
		{"bad budget period", base + "budgets: [{name: b, period: week, amount: '1'}]\n", "budgets[0].period"},
		{"negative batch", base + "store: {max_batch: -1}\n", "store.max_batch"},
		{"huge batch", base + "store: {max_batch: 100000}\n", "store.max_batch"},
		{"empty file", "", "the config is empty"},
		{"tenant without plan", base + "tenants: [{name: t, keys: [{key: a}]}]\n", "tenants[0].plan: required"},
		{"limit plan nobody has", base + "tenants: [{name: t, plan: free, keys: [{key: a}]}]\nlimits: [{name: a, plans: [free, gold], rate: 1, period: 1s}]\n", `limits[0].plans[1]: no tenant has plan "gold"`},
		{"budget plan nobody has", base + "tenants: [{name: t, plan: free, keys: [{key: a}]}]\nbudgets: [{name: b, plans: [pro], amount: '1'}]\n", `budgets[0].plans[0]: no tenant has plan "pro"`},
		{"rate_usd on requests", base + "limits: [{name: a, rate: 1, rate_usd: '1', period: 1s}]\n", "limits[0].rate_usd: only a usd limit takes rate_usd"},
		{"TRACE forwarded", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, methods: [GET, trace]}]\n", "upstreams[0].methods[1]: TRACE is never forwarded"},
		{"CONNECT forwarded", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, methods: [CONNECT]}]\n", "upstreams[0].methods[0]: CONNECT is never forwarded"},
		{"unknown method", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, methods: [FETCH]}]\n", "upstreams[0].methods[0]: unknown method"},
		{"methods on an LLM upstream", "admin_token: x\nupstreams: [{name: o, kind: openai, base_url: 'http://127.0.0.1:1', methods: [GET]}]\n", "upstreams[0].methods: only a generic upstream"},
		{"unclean path prefix", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, paths: [{prefix: /a/../b, cost: {per_call: '1'}}]}]\n", "upstreams[0].paths[0].prefix: must be a clean path"},
		{"demo key in public", base + "listen: ':8080'\ntenants: [{name: t, plan: p, keys: [{key: cg-demo-free}]}]\n", "tenants[0].keys[0].key: \"cg-demo-free\" is a published demo key"},
		{"demo admin token in public", "admin_token: cg-demo-admin\nadmin_listen: '0.0.0.0:9090'\n", "admin_token: \"cg-demo-admin\" is the published demo token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := proxy.Parse([]byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	t.Run("a base_url's secrets are not repeated", func(t *testing.T) {
		_, err := proxy.Parse([]byte("admin_token: x\nupstreams: [{name: o, kind: openai, base_url: 'ftp://user:hunter2@h/?key=qsecret'}]\n"))
		if err == nil || !strings.Contains(err.Error(), "upstreams[0].base_url") {
			t.Fatalf("got %v, want an error naming upstreams[0].base_url", err)
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "qsecret") {
			t.Errorf("the error repeats a secret: %v", err)
		}
	})
	t.Run("demo keys on loopback", func(t *testing.T) {
		for _, listen := range []string{"127.0.0.1:8080", "localhost:0", "[::1]:8080"} {
			if _, err := proxy.Parse([]byte("admin_token: cg-demo-admin\nlisten: '" + listen + "'\ntenants: [{name: t, plan: p, keys: [{key: cg-demo-free}]}]\n")); err != nil {
				t.Errorf("listen %s: %v", listen, err)
			}
		}
	})
	var fe *proxy.FieldError
	_, err := proxy.Parse([]byte(base + "limits: [{name: a, unit: bananas, rate: 1, period: 1s}]\n"))
	if !errors.As(err, &fe) || fe.Path != "limits[0].unit" {
		t.Errorf("want a *FieldError at limits[0].unit, got %#v", err)
	}
}

func TestKeyFromFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "acme.key"), []byte("cg-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "costgate.yaml")
	yaml := "admin_token: x\nupstreams: [{name: openai, kind: openai, simulate: always}]\ntenants: [{name: acme, plan: p, keys: [{key_file: acme.key}]}]\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := proxy.Load(path); err != nil {
		t.Fatalf("a key file next to the config: %v", err)
	}
}

// TestWatchReloadsOnFileChange: editing the config file reloads it; a
// broken edit keeps the last good config.
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
	cfg, err := proxy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store.Redis, cfg.Ledger.DSN = "", ""
	load := func() (*proxy.Config, error) {
		c, err := proxy.Load(path)
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
	load := func() (*proxy.Config, error) {
		c, err := proxy.Load(path)
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
	load := func() (*proxy.Config, error) {
		c, err := proxy.Load(path)
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
func TestParseIsPure(t *testing.T) {
	t.Setenv("COSTGATE_ADMIN_TOKEN", "from-env")
	t.Setenv("REDIS_URL", "redis://from-env:6379")
	t.Setenv("DATABASE_URL", "postgres://from-env/db")
	const noToken = "upstreams: [{name: openai, kind: openai, simulate: always}]\n"
	if _, err := proxy.Parse([]byte(noToken)); err == nil || !strings.Contains(err.Error(), "admin_token: required") {
		t.Fatalf("Parse of a config without admin_token = %v, want admin_token: required (the environment is not read)", err)
	}
	cfg, err := proxy.Parse([]byte("admin_token: t\n" + noToken))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminToken != "t" || cfg.Store.Redis != "" || cfg.Ledger.DSN != "" {
		t.Errorf("Parse took %q, %q, %q; want t and no store or ledger URL", cfg.AdminToken, cfg.Store.Redis, cfg.Ledger.DSN)
	}
	d := proxy.Defaults{AdminToken: "default-token", Redis: "redis://default:6379", LedgerDSN: "postgres://default/db"}
	cfg, err = proxy.ParseWith([]byte(noToken), d)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminToken != d.AdminToken || cfg.Store.Redis != d.Redis || cfg.Ledger.DSN != d.LedgerDSN {
		t.Errorf("ParseWith took %q, %q, %q; want the defaults", cfg.AdminToken, cfg.Store.Redis, cfg.Ledger.DSN)
	}
	cfg, err = proxy.ParseWith([]byte("admin_token: file\nstore: {redis: 'redis://file:6379'}\nledger: {dsn: 'postgres://file/db'}\n"+noToken), d)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminToken != "file" || cfg.Store.Redis != "redis://file:6379" || cfg.Ledger.DSN != "postgres://file/db" {
		t.Errorf("ParseWith took %q, %q, %q; want the file's values over the defaults", cfg.AdminToken, cfg.Store.Redis, cfg.Ledger.DSN)
	}
}
