package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/proxy"
)

// TestEmbeddedDefaultStaysLocal: `costgate serve` with no config listens on
// loopback only and serves every upstream from the simulator, even with
// real API keys in the environment: its demo keys are published.
func TestEmbeddedDefaultStaysLocal(t *testing.T) {
	t.Setenv("COSTGATE_CONFIG", "")
	t.Setenv("COSTGATE_ADMIN_TOKEN", "")
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	t.Setenv("OPENAI_API_KEY", "sk-real-key-that-must-not-be-used")
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-real-key-that-must-not-be-used")
	t.Chdir(t.TempDir())

	var cf configFlags
	cfg, source, err := cf.load()
	if err != nil {
		t.Fatal(err)
	}
	if source != "the embedded quickstart" {
		t.Fatalf("source %q", source)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.AdminListen != "127.0.0.1:9090" {
		t.Errorf("listens on %q (admin %q), want 127.0.0.1:8080 and 127.0.0.1:9090", cfg.Listen, cfg.AdminListen)
	}
	if cfg.AdminToken != "cg-demo-admin" {
		t.Errorf("admin token %q, want the demo's", cfg.AdminToken)
	}

	srv, err := proxy.Open(t.Context(), cfg, proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	describe := strings.Join(srv.Describe(), "\n")
	for _, up := range []string{"openai", "anthropic"} {
		if !strings.Contains(describe, "upstream "+up+" ("+up+"): the built-in simulator") {
			t.Errorf("upstream %s is not simulated:\n%s", up, describe)
		}
	}
	if strings.Contains(describe, "api.openai.com") || strings.Contains(describe, "api.anthropic.com") {
		t.Errorf("a real API is named:\n%s", describe)
	}
	// A request is answered by the simulator (the real API would be
	// unreachable here, or charge the key).
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	req, _ := http.NewRequest("POST", ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer cg-demo-pro")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %s through the simulator", resp.Status)
	}

	t.Run("COSTGATE_ADMIN_TOKEN wins", func(t *testing.T) {
		t.Setenv("COSTGATE_ADMIN_TOKEN", "my-own-token")
		cfg, _, err := cf.load()
		if err != nil || cfg.AdminToken != "my-own-token" {
			t.Errorf("admin token %v, %v; want my-own-token", cfg, err)
		}
	})
	t.Run("the quickstart file runs as is", func(t *testing.T) {
		cf := configFlags{config: filepath.Join(testDir, "..", "..", "examples", "quickstart", "costgate.yaml")}
		cfg, _, err := cf.load()
		if err != nil {
			t.Fatalf("--config examples/quickstart/costgate.yaml: %v", err)
		}
		if cfg.AdminToken != "cg-demo-admin" || cfg.Listen != "127.0.0.1:8080" {
			t.Errorf("admin token %q, listen %q", cfg.AdminToken, cfg.Listen)
		}
	})
}

// testDir is the package's directory, where the tests start.
var testDir, _ = os.Getwd()

// TestServeRefusesToExpose: serve refuses, before it listens, to put the
// published demo keys or token on a non-loopback address, to run without a
// config it was told to read (as the Docker image is), and a config with
// errors; each error names what is wrong.
func TestServeRefusesToExpose(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	t.Setenv("COSTGATE_ADMIN_TOKEN", "")
	t.Setenv("COSTGATE_CONFIG", "")
	dir := t.TempDir()
	t.Chdir(dir)
	write := func(name, yaml string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	noPlan := write("noplan.yaml", "admin_token: t\nupstreams: [{name: openai, kind: openai, simulate: always}]\ntenants: [{name: a, keys: [{key: k}]}, {name: b, plan: free, keys: [{key: k2}]}]\nlimits: [{name: l, plans: [gold], rate: 1, period: 1s}]\n")
	noToken := write("notoken.yaml", "upstreams: [{name: openai, kind: openai, simulate: always}]\ntenants: [{name: a, plan: free, keys: [{key: k}]}]\n")
	empty := write("empty.yaml", "# nothing yet\n")
	cases := []struct {
		name string
		env  string // COSTGATE_CONFIG
		args []string
		want []string
	}{
		{"demo keys on every interface", "", []string{"--listen", ":0"}, []string{`tenants[0].keys[0].key: "cg-demo-free" is a published demo key`}},
		{"demo admin token on every interface", "", []string{"--admin-listen", "0.0.0.0:0"}, []string{`admin_token: "cg-demo-admin" is the published demo token`}},
		{"the image's default without a config", "/etc/costgate-missing/costgate.yaml", []string{"--listen", ":0", "--admin-listen", ":0"}, []string{"/etc/costgate-missing/costgate.yaml does not exist", "mount"}},
		{"no admin token", "", []string{"--config", noToken}, []string{"admin_token: required"}},
		{"tenant without plan", "", []string{"--config", noPlan}, []string{"tenants[0].plan: required", `limits[0].plans[0]: no tenant has plan "gold"`}},
		{"empty config", "", []string{"--config", empty}, []string{"the config is empty"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("COSTGATE_CONFIG", c.env)
			// Were serve to start, it would stop when ctx ends, without error.
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var out, errOut bytes.Buffer
			err := run(ctx, append([]string{"serve"}, c.args...), strings.NewReader(""), &out, &errOut)
			if err == nil {
				t.Fatalf("serve started:\n%s", out.String())
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
