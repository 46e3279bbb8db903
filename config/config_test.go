package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/costgate/costgate/config"
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
		{"negative upstream timeout", "admin_token: x\nupstreams: [{name: u, kind: openai, base_url: \"http://127.0.0.1:1\", timeout: -1s}]\n", "upstreams[0].timeout: must be positive"},
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
		{"negative keys per tenant", base + "store: {max_keys_per_tenant: -1}\n", "store.max_keys_per_tenant"},
		{"huge keys per tenant", base + "store: {max_keys_per_tenant: 2000000}\n", "store.max_keys_per_tenant"},
		{"negative peer wait", base + "ledger: {peer_wait: -1s}\n", "ledger.peer_wait"},
		{"peer wait past a minute", base + "ledger: {peer_wait: 2m}\n", "ledger.peer_wait"},
		{"negative close timeout", base + "ledger: {close_timeout: -1s}\n", "ledger.close_timeout"},
		{"close timeout past five minutes", base + "ledger: {close_timeout: 6m}\n", "ledger.close_timeout"},
		{"empty file", "", "the config is empty"},
		{"tenant without plan", base + "tenants: [{name: t, keys: [{key: a}]}]\n", "tenants[0].plan: required"},
		{"user the RLS reads apart", base + "tenants: [{name: t, plan: p, keys: [{key: a, user: '50%off'}]}]\n", "tenants[0].keys[0].user: must be UTF-8 text without '%'"},
		{"user with a NUL", base + "tenants: [{name: t, plan: p, keys: [{key: a, user: \"a\\0b\"}]}]\n", "tenants[0].keys[0].user"},
		// Names every ledger entry records: one the ledger could not store
		// would refuse every request at its record (a region or key id
		// with a NUL, a 600-byte tenant or plan did).
		{"region with a NUL", base + "region: \"eu\\0\"\n", "region: must be UTF-8 text without NUL"},
		{"key id with a NUL", base + "tenants: [{name: t, plan: p, keys: [{id: \"k\\0\", key: a}]}]\n", "tenants[0].keys[0].id"},
		{"plan with a NUL", base + "tenants: [{name: t, plan: \"p\\0\", keys: [{key: a}]}]\n", "tenants[0].plan"},
		{"tenant too long", base + "tenants: [{name: " + strings.Repeat("t", 600) + ", plan: p, keys: [{key: a}]}]\n", "tenants[0].name: must be UTF-8 text without NUL, at most 512 bytes"},
		{"user too long", base + "tenants: [{name: t, plan: p, keys: [{key: a, user: " + strings.Repeat("u", 600) + "}]}]\n", "tenants[0].keys[0].user"},
		{"upstream with a NUL", "admin_token: x\nupstreams: [{name: \"o\\0\", kind: openai, base_url: 'http://127.0.0.1:1'}]\n", "upstreams[0].name"},
		{"limit plan nobody has", base + "tenants: [{name: t, plan: free, keys: [{key: a}]}]\nlimits: [{name: a, plans: [free, gold], rate: 1, period: 1s}]\n", `limits[0].plans[1]: no tenant has plan "gold"`},
		{"budget plan nobody has", base + "tenants: [{name: t, plan: free, keys: [{key: a}]}]\nbudgets: [{name: b, plans: [pro], amount: '1'}]\n", `budgets[0].plans[0]: no tenant has plan "pro"`},
		{"rate_usd on requests", base + "limits: [{name: a, rate: 1, rate_usd: '1', period: 1s}]\n", "limits[0].rate_usd: only a usd limit takes rate_usd"},
		{"TRACE forwarded", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, methods: [GET, trace]}]\n", "upstreams[0].methods[1]: TRACE is never forwarded"},
		{"CONNECT forwarded", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, methods: [CONNECT]}]\n", "upstreams[0].methods[0]: CONNECT is never forwarded"},
		{"unknown method", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, methods: [FETCH]}]\n", "upstreams[0].methods[0]: unknown method"},
		{"methods on an LLM upstream", "admin_token: x\nupstreams: [{name: o, kind: openai, base_url: 'http://127.0.0.1:1', methods: [GET]}]\n", "upstreams[0].methods: only a generic upstream"},
		{"path prefixes that differ in case", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, paths: [{prefix: /Expensive, cost: {per_call: '1'}}, {prefix: /expensive, cost: {per_call: '0.001'}}]}]\n", "upstreams[0].paths[1].prefix: \"/expensive\" is paths[0]'s prefix \"/Expensive\": paths match in any case"},
		{"unclean path prefix", "admin_token: x\nupstreams: [{name: s, kind: generic, base_url: 'http://127.0.0.1:1', cost: {per_call: '0.01'}, paths: [{prefix: /a/../b, cost: {per_call: '1'}}]}]\n", "upstreams[0].paths[0].prefix: must be a clean path"},
		{"demo key in public", base + "listen: ':8080'\ntenants: [{name: t, plan: p, keys: [{key: cg-demo-free}]}]\n", "tenants[0].keys[0].key: \"cg-demo-free\" is a published demo key"},
		{"capture sample above 1", base + "capture: {enabled: true, sample: 1.5}\n", "capture.sample: must be in (0, 1]"},
		{"capture negative sample", base + "capture: {enabled: true, sample: -0.1}\n", "capture.sample"},
		{"capture tiny files", base + "capture: {enabled: true, max_bytes: 10}\n", "capture.max_bytes"},
		{"capture no files", base + "capture: {enabled: true, max_files: -1}\n", "capture.max_files"},
		{"demo admin token in public", "admin_token: cg-demo-admin\nadmin_listen: '0.0.0.0:9090'\n", "admin_token: \"cg-demo-admin\" is the published demo token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Parse([]byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	t.Run("a base_url's secrets are not repeated", func(t *testing.T) {
		_, err := config.Parse([]byte("admin_token: x\nupstreams: [{name: o, kind: openai, base_url: 'ftp://user:hunter2@h/?key=qsecret'}]\n"))
		if err == nil || !strings.Contains(err.Error(), "upstreams[0].base_url") {
			t.Fatalf("got %v, want an error naming upstreams[0].base_url", err)
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "qsecret") {
			t.Errorf("the error repeats a secret: %v", err)
		}
	})
	t.Run("demo keys on loopback", func(t *testing.T) {
		for _, listen := range []string{"127.0.0.1:8080", "localhost:0", "[::1]:8080"} {
			if _, err := config.Parse([]byte("admin_token: cg-demo-admin\nlisten: '" + listen + "'\ntenants: [{name: t, plan: p, keys: [{key: cg-demo-free}]}]\n")); err != nil {
				t.Errorf("listen %s: %v", listen, err)
			}
		}
	})
	var fe *config.FieldError
	_, err := config.Parse([]byte(base + "limits: [{name: a, unit: bananas, rate: 1, period: 1s}]\n"))
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
	if _, err := config.Load(path); err != nil {
		t.Fatalf("a key file next to the config: %v", err)
	}
}

// TestWatchReloadsOnFileChange: editing the config file reloads it; a
// broken edit keeps the last good config.
func TestParseIsPure(t *testing.T) {
	t.Setenv("COSTGATE_ADMIN_TOKEN", "from-env")
	t.Setenv("REDIS_URL", "redis://from-env:6379")
	t.Setenv("DATABASE_URL", "postgres://from-env/db")
	const noToken = "upstreams: [{name: openai, kind: openai, simulate: always}]\n"
	if _, err := config.Parse([]byte(noToken)); err == nil || !strings.Contains(err.Error(), "admin_token: required") {
		t.Fatalf("Parse of a config without admin_token = %v, want admin_token: required (the environment is not read)", err)
	}
	cfg, err := config.Parse([]byte("admin_token: t\n" + noToken))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminToken != "t" || cfg.Store.Redis != "" || cfg.Ledger.DSN != "" {
		t.Errorf("Parse took %q, %q, %q; want t and no store or ledger URL", cfg.AdminToken, cfg.Store.Redis, cfg.Ledger.DSN)
	}
	d := config.Defaults{AdminToken: "default-token", Redis: "redis://default:6379", LedgerDSN: "postgres://default/db"}
	cfg, err = config.ParseWith([]byte(noToken), d)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminToken != d.AdminToken || cfg.Store.Redis != d.Redis || cfg.Ledger.DSN != d.LedgerDSN {
		t.Errorf("ParseWith took %q, %q, %q; want the defaults", cfg.AdminToken, cfg.Store.Redis, cfg.Ledger.DSN)
	}
	cfg, err = config.ParseWith([]byte("admin_token: file\nstore: {redis: 'redis://file:6379'}\nledger: {dsn: 'postgres://file/db'}\n"+noToken), d)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminToken != "file" || cfg.Store.Redis != "redis://file:6379" || cfg.Ledger.DSN != "postgres://file/db" {
		t.Errorf("ParseWith took %q, %q, %q; want the file's values over the defaults", cfg.AdminToken, cfg.Store.Redis, cfg.Ledger.DSN)
	}
}

// Capture is off by default; on, it samples every request into
// data_dir/capture, 8 files of 64 MiB.
func TestCaptureDefaults(t *testing.T) {
	cfg, err := config.Parse([]byte("admin_token: x\ndata_dir: /var/cg\ncapture: {enabled: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Capture
	if !c.Enabled || c.Sample != 1 || c.MaxBytes != 64<<20 || c.MaxFiles != 8 {
		t.Errorf("capture %+v", c)
	}
	if got := cfg.CaptureDir(); got != filepath.Join("/var/cg", "capture") {
		t.Errorf("capture dir %q", got)
	}
	off, err := config.Parse([]byte("admin_token: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	if off.Capture.Enabled {
		t.Error("capture is on by default")
	}
}
