package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/costgate/costgate/learned"
)

// TestEstimateShowsTheLearnedEstimate: with output_reserve: p95 and a
// tenant, estimate reads the learned estimates serve keeps in its data
// directory and prints the quantile, its sample count and the reservation.
func TestEstimateShowsTheLearnedEstimate(t *testing.T) {
	t.Setenv("COSTGATE_CONFIG", "")
	dir := t.TempDir()
	config := filepath.Join(dir, "costgate.yaml")
	if err := os.WriteFile(config, []byte(`
admin_token: t
data_dir: data
costs: {output_reserve: p95, learned: {min_samples: 50}}
tenants: [{name: acme, plan: p, keys: [{key: cg-acme-0123456789}]}, {name: globex, plan: p, keys: [{key: cg-globex-0123456789}]}]
upstreams: [{name: openai, kind: openai, simulate: always}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// What serve learned: 60 answers of 200 tokens for acme's gpt-4o
	// chat requests with max_tokens 1000.
	tb, err := learned.Open(context.Background(), learned.Config{File: filepath.Join(dir, "data", "learned.json")})
	if err != nil {
		t.Fatal(err)
	}
	k := learned.Key{Tenant: "acme", Model: "gpt-4o", Route: "/v1/chat/completions", Shape: learned.ShapeOf(1000, false, 1)}
	for range 60 {
		tb.Observe(k, 200)
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	type output struct {
		Reserved int64    `json:"reserved_output_tokens"`
		Why      []string `json:"why"`
		Learned  *struct {
			Quantile     string `json:"quantile"`
			Samples      int64  `json:"samples"`
			OutputTokens int64  `json:"output_tokens"`
			Reserved     bool   `json:"reserved"`
			Key          string `json:"key"`
		} `json:"learned"`
	}
	estimate := func(body string, args ...string) output {
		t.Helper()
		out, stderr, err := runCmd(t, body, append([]string{"estimate", "--config", config}, args...)...)
		if err != nil {
			t.Fatalf("estimate %v: %v\n%s", args, err, stderr)
		}
		var o output
		if err := json.Unmarshal([]byte(out), &o); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out)
		}
		return o
	}
	body := `{"model":"gpt-4o-2024-08-06","max_tokens":1000,"messages":[{"role":"user","content":"Hello"}]}`
	o := estimate(body, "--tenant", "acme")
	if o.Learned == nil || o.Learned.Quantile != "p95" || o.Learned.Samples != 60 || !o.Learned.Reserved || o.Learned.OutputTokens < 198 || o.Learned.OutputTokens > 202 || o.Reserved != o.Learned.OutputTokens {
		t.Fatalf("acme: reserved %d, learned %+v", o.Reserved, o.Learned)
	}
	if why := strings.Join(o.Why, " "); !strings.Contains(why, "learned p95 of 60 settled requests") {
		t.Errorf("why %q", why)
	}
	// Another tenant, or no tenant: the whole output limit.
	for _, args := range [][]string{{"--tenant", "globex"}, nil} {
		if o := estimate(body, args...); o.Reserved != 1000 {
			t.Errorf("%v: reserved %d, want 1000", args, o.Reserved)
		}
	}
	if o := estimate(body, "--tenant", "globex"); o.Learned == nil || o.Learned.Samples != 0 || o.Learned.Reserved {
		t.Errorf("globex: %+v", o.Learned)
	}
	if _, _, err := runCmd(t, body, "estimate", "--config", config, "--tenant", "nobody"); err == nil || !strings.Contains(err.Error(), "not in the config") {
		t.Errorf("an unknown tenant: %v", err)
	}
	// A learned file that does not parse: a warning, the whole limit.
	if err := os.WriteFile(filepath.Join(dir, "data", "learned.json"), []byte("{\"version\":"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runCmd(t, body, "estimate", "--config", config, "--tenant", "acme")
	if err != nil || !strings.Contains(stderr, "does not parse") || !strings.Contains(out, `"reserved_output_tokens": 1000`) {
		t.Fatalf("a bad learned file: %v\nstdout %s\nstderr %s", err, out, stderr)
	}
}
