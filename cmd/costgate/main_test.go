package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/logtest"
	"github.com/costgate/costgate/ledger"
)

// runCmd runs a command line and returns its output and error.
func runCmd(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(t.Context(), args, strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestVersion(t *testing.T) {
	out, _, err := runCmd(t, "", "version")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^costgate (\S+) commit (\S+) (\S+)\n$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("version printed %q, want costgate VERSION commit COMMIT GOVERSION", out)
	}
	if m[1] != buildVersion || m[3] != runtime.Version() {
		t.Errorf("version %q, Go %q; want %q and %q", m[1], m[3], buildVersion, runtime.Version())
	}
}

func TestCommandErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no command", nil, "no command"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"policy without a directory", []string{"policy", "check"}, "usage: costgate policy"},
		{"policy unknown action", []string{"policy", "lint", "."}, "usage: costgate policy"},
		{"policy not a directory", []string{"policy", "check", "main.go"}, "not a directory"},
		{"ledger without export", []string{"ledger"}, "usage: costgate ledger export"},
		{"ledger unknown action", []string{"ledger", "frob"}, "costgate ledger recover --node ID --before TIME"},
		{"ledger nodes argument", []string{"ledger", "nodes", "extra"}, `unexpected argument "extra"`},
		{"ledger export without tenant", []string{"ledger", "export", "--from", "2026-01-01", "--to", "2026-01-02"}, "--tenant, --from and --to are required"},
		{"ledger export bad date", []string{"ledger", "export", "--tenant", "a", "--from", "yesterday", "--to", "2026-01-02"}, "--from"},
		{"simulate bad error rate", []string{"simulate", "--error-rate", "2"}, "--error-rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runCmd(t, "", tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	t.Run("unknown command prints the usage", func(t *testing.T) {
		_, stderr, _ := runCmd(t, "", "frobnicate")
		if !strings.Contains(stderr, "Usage:") {
			t.Errorf("stderr %q, want the usage", stderr)
		}
	})
	t.Run("help", func(t *testing.T) {
		out, _, err := runCmd(t, "", "help")
		if err != nil || !strings.Contains(out, "costgate estimate") {
			t.Errorf("help: %v, %q", err, out)
		}
	})
}

// estimateOutput is what `costgate estimate` prints.
type estimateOutput struct {
	Kind  string `json:"kind"`
	Model string `json:"model"`
	Usage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
	CostNanoUSD int64  `json:"cost_nano_usd"`
	CostUSD     string `json:"cost_usd"`
}

func TestEstimate(t *testing.T) {
	const chat = `{"model":"gpt-4o-mini","max_tokens":50,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello, costgate!"}]}`
	const messages = `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[{"role":"user","content":"Hello"}]}`
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		args      []string
		body      string
		kind      costmodel.Kind
		wantModel string
		wantBody  string // the body the estimate must equal; default body
		wantErr   string
	}{
		{name: "chat by path", args: []string{"--route", "/v1/chat/completions"}, body: chat,
			kind: costmodel.ChatCompletions, wantModel: "gpt-4o-mini"},
		{name: "default route is chat", body: chat, kind: costmodel.ChatCompletions, wantModel: "gpt-4o-mini"},
		{name: "model override", args: []string{"--route", "/v1/chat/completions", "--model", "gpt-4o"}, body: chat,
			kind: costmodel.ChatCompletions, wantModel: "gpt-4o",
			wantBody: strings.Replace(chat, `"gpt-4o-mini"`, `"gpt-4o"`, 1)},
		{name: "anthropic by kind name", args: []string{"--route", "anthropic_messages"}, body: messages,
			kind: costmodel.AnthropicMessages, wantModel: "claude-haiku-4-5"},
		{name: "embeddings", args: []string{"--route", "/v1/embeddings"}, body: `{"model":"text-embedding-3-small","input":["a","b c"]}`,
			kind: costmodel.Embeddings, wantModel: "text-embedding-3-small"},
		{name: "malformed body", args: []string{"--route", "/v1/chat/completions"}, body: `{"model":"gpt-4o-mini","messages":[`,
			wantErr: "JSON"},
		{name: "malformed body with a model override", args: []string{"--model", "gpt-4o"}, body: `[1,2`,
			wantErr: "not a JSON object"},
		{name: "unknown route", args: []string{"--route", "/v1/nope"}, body: chat, wantErr: "nope"},
		{name: "unknown flag", args: []string{"--bogus", "x"}, body: chat, wantErr: "bogus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runCmd(t, tt.body, append([]string{"estimate"}, tt.args...)...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q; output %s", err, tt.wantErr, out)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got estimateOutput
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, out)
			}
			body := tt.wantBody
			if body == "" {
				body = tt.body
			}
			want, err := est.Estimate(tt.kind, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if got.Kind != tt.kind.String() || got.Model != tt.wantModel {
				t.Errorf("kind %q model %q, want %q %q", got.Kind, got.Model, tt.kind, tt.wantModel)
			}
			if got.Usage.InputTokens != want.Usage.InputTokens || got.Usage.InputTokens <= 0 {
				t.Errorf("input tokens %d, want %d", got.Usage.InputTokens, want.Usage.InputTokens)
			}
			if got.Usage.OutputTokens != want.Usage.OutputTokens {
				t.Errorf("output tokens %d, want %d", got.Usage.OutputTokens, want.Usage.OutputTokens)
			}
			if got.CostNanoUSD != int64(want.Cost) || got.CostNanoUSD <= 0 || got.CostUSD != want.Cost.String() {
				t.Errorf("cost %d (%s), want %d (%s)", got.CostNanoUSD, got.CostUSD, int64(want.Cost), want.Cost)
			}
		})
	}
}

func TestPolicy(t *testing.T) {
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, "ok.rego"), []byte("package ok\n\nallow := true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "broken.rego"), []byte("package broken\n\nallow if {\n\tinput.x ==\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	failing := t.TempDir()
	if err := os.WriteFile(filepath.Join(failing, "f_test.rego"), []byte("package f\n\ntest_false if { 1 == 2 }\n\ntest_true if { 1 == 1 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const examplesDir = "../../examples/policies"
	tests := []struct {
		name    string
		args    []string
		wantOut *regexp.Regexp
		wantErr *regexp.Regexp
	}{
		{"check examples", []string{"check", examplesDir}, regexp.MustCompile(`compile`), nil},
		{"check broken", []string{"check", broken}, nil, regexp.MustCompile(`broken\.rego:\d+`)},
		{"test examples", []string{"test", examplesDir}, regexp.MustCompile(`(?m)^[1-9]\d* passed, 0 failed$`), nil},
		{"test failing", []string{"test", failing}, regexp.MustCompile(`(?m)^1 passed, 1 failed$`), regexp.MustCompile(`1 policy tests failed`)},
		{"test broken", []string{"test", broken}, nil, regexp.MustCompile(`broken\.rego:\d+`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runCmd(t, "", append([]string{"policy"}, tt.args...)...)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("error %v; output %s", err, out)
			case tt.wantErr != nil && (err == nil || !tt.wantErr.MatchString(err.Error())):
				t.Fatalf("error %v, want one matching %s", err, tt.wantErr)
			}
			if tt.wantOut != nil && !tt.wantOut.MatchString(out) {
				t.Errorf("output %q, want it to match %s", out, tt.wantOut)
			}
		})
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// served is the request serveOnce sent and what it was told.
type served struct {
	requestID        string
	prompt, complete int64
}

// writeConfig writes a config whose only upstream is the simulator, with
// one tenant, acme, and its key cg-test-acme, and returns its path.
func writeConfig(t *testing.T, dir, dataDir string) string {
	t.Helper()
	config := filepath.Join(dir, "costgate.yaml")
	err := os.WriteFile(config, []byte(fmt.Sprintf(`
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
admin_token: test-admin
data_dir: %q
upstreams:
  - name: openai
    kind: openai
    simulate: always
tenants:
  - name: acme
    plan: free
    keys:
      - id: acme-key
        key: cg-test-acme
        user: alice
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 10
    period: 1m
`, dataDir)), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return config
}

// serveOnce runs `costgate serve` with args until it answers, checks
// /healthz on its admin address, sends one chat completion through its data
// plane, then stops it by cancelling its context and checks that it
// returns cleanly.
func serveOnce(t *testing.T, args ...string) served {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr logtest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve"}, args...), strings.NewReader(""), &stdout, &stderr)
	}()

	// serve announces the addresses it bound.
	announce := regexp.MustCompile(`serving .* on (127\.0\.0\.1:\d+) \(admin on (127\.0\.0\.1:\d+)\)`)
	var data, admin string
	waitFor(t, "serve announces its addresses", 20*time.Second, func() bool {
		select {
		case err := <-done:
			t.Fatalf("serve returned %v before it served; stderr:\n%s", err, stderr.String())
		default:
		}
		m := announce.FindStringSubmatch(stderr.String())
		if m != nil {
			data, admin = m[1], m[2]
		}
		return m != nil
	})
	// Startup lines and logs are one stream, stderr, of JSON records:
	// `2>serve.log` keeps them all.
	waitFor(t, "serve logs what it runs on", 5*time.Second, func() bool {
		return strings.Contains(stderr.String(), `"msg":"costgate: limiter store:`)
	})
	if out := stdout.String(); out != "" {
		t.Errorf("serve wrote to stdout: %q", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Level == "" || rec.Msg == "" {
			t.Errorf("a stderr line is not a log record: %q", line)
		}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %s", resp.Status)
	}

	const body = `{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"Hello, costgate!"}]}`
	req, err := http.NewRequest(http.MethodPost, "http://"+data+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	req.Header.Set("Content-Type", "application/json")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %s: %s", resp.Status, b)
	}
	var completion struct {
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &completion); err != nil {
		t.Fatal(err)
	}
	s := served{resp.Header.Get("X-Request-Id"), completion.Usage.PromptTokens, completion.Usage.CompletionTokens}
	if s.requestID == "" || s.prompt == 0 || s.complete == 0 {
		t.Fatalf("request id %q, usage %+v: %s", s.requestID, completion.Usage, b)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve stopped with %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop after its context was cancelled")
	}
	if _, err := http.Get("http://" + admin + "/healthz"); err == nil {
		t.Error("the admin listener still answers after serve returned")
	}
	return s
}

// checkExport checks that a CSV export holds exactly the request s.
func checkExport(t *testing.T, out string, s served) {
	t.Helper()
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatalf("export is not CSV: %v\n%s", err, out)
	}
	if len(rows) != 2 || !slices.Equal(rows[0], ledger.CSVHeader) {
		t.Fatalf("export has %d rows, want the header and one entry:\n%s", len(rows), out)
	}
	entry := map[string]string{}
	for i, col := range rows[0] {
		entry[col] = rows[1][i]
	}
	want := map[string]string{
		"request_id":    s.requestID,
		"tenant":        "acme",
		"user":          "alice",
		"key_id":        "acme-key",
		"route":         "/v1/chat/completions",
		"upstream":      "openai",
		"model":         "gpt-4o-mini",
		"status":        string(ledger.StatusSettled),
		"http_status":   "200",
		"input_tokens":  fmt.Sprint(s.prompt),
		"output_tokens": fmt.Sprint(s.complete),
	}
	for col, v := range want {
		if entry[col] != v {
			t.Errorf("%s = %q, want %q", col, entry[col], v)
		}
	}
}

// exportDays are --from and --to around today.
func exportDays() []string {
	day := time.Now().UTC()
	return []string{"--from", day.AddDate(0, 0, -1).Format(time.DateOnly), "--to", day.AddDate(0, 0, 1).Format(time.DateOnly)}
}

// TestServeAndExport runs `costgate serve` on a config with the simulator
// as its upstream, serves one request through the data plane, stops it by
// cancelling its context, and exports the request from the ledger.
func TestServeAndExport(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	t.Setenv("COSTGATE_CONFIG", "")
	dir := t.TempDir()
	config := writeConfig(t, dir, filepath.Join(dir, "data"))
	s := serveOnce(t, "--config", config)

	out, _, err := runCmd(t, "", append([]string{"ledger", "export", "--config", config, "--tenant", "acme"}, exportDays()...)...)
	if err != nil {
		t.Fatal(err)
	}
	checkExport(t, out, s)

	t.Run("other tenant is empty", func(t *testing.T) {
		out, _, err := runCmd(t, "", append([]string{"ledger", "export", "--config", config, "--tenant", "globex", "--format", "json"}, exportDays()...)...)
		if err != nil {
			t.Fatal(err)
		}
		var entries []json.RawMessage
		if err := json.Unmarshal([]byte(out), &entries); err != nil || len(entries) != 0 {
			t.Errorf("export of another tenant: %v, %s", err, out)
		}
	})
	t.Run("bad format", func(t *testing.T) {
		_, _, err := runCmd(t, "", "ledger", "export", "--config", config, "--tenant", "acme", "--format", "xml",
			"--from", "2026-01-01", "--to", "2026-01-02")
		if !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("error %v, want ledger.ErrInvalid", err)
		}
	})
}

// TestServeRelativeDataDir serves a config whose data_dir is relative,
// from another working directory: the ledger is under the config's
// directory, where ledger export --config finds it.
func TestServeRelativeDataDir(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	t.Setenv("COSTGATE_CONFIG", "")
	dir := t.TempDir()
	config := writeConfig(t, dir, "./data")
	t.Chdir(t.TempDir())
	s := serveOnce(t, "--config", config)
	if _, err := os.Stat(filepath.Join(dir, "data")); err != nil {
		t.Fatalf("no data directory beside the config: %v", err)
	}
	out, _, err := runCmd(t, "", append([]string{"ledger", "export", "--config", config, "--tenant", "acme"}, exportDays()...)...)
	if err != nil {
		t.Fatal(err)
	}
	checkExport(t, out, s)
}

// TestServeDataDirFlag: a relative -data-dir is the working directory's,
// as any path on a command line is, not the config file's.
func TestServeDataDirFlag(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	t.Setenv("DATABASE_URL", "")
	t.Setenv("COSTGATE_CONFIG", "")
	config := writeConfig(t, t.TempDir(), "./data")
	wd := t.TempDir()
	t.Chdir(wd)
	s := serveOnce(t, "--config", config, "--data-dir", "flagdata")
	if _, err := os.Stat(filepath.Join(wd, "flagdata", "ledger.db")); err != nil {
		t.Fatalf("no ledger under the working directory's flagdata: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(config), "flagdata")); err == nil {
		t.Fatal("the flag's relative data directory was put beside the config")
	}
	out, _, err := runCmd(t, "", append([]string{"ledger", "export", "--config", config, "--data-dir", "flagdata", "--tenant", "acme"}, exportDays()...)...)
	if err != nil {
		t.Fatal(err)
	}
	checkExport(t, out, s)
}

// TestServeCutsStreamsAfterTheDrain: a stream that outlasts the drain is cut
// when serve stops, and serve returns with its settlement in the ledger,
// instead of waiting for the stream to end.
func TestServeCutsStreamsAfterTheDrain(t *testing.T) {
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = 300 * time.Millisecond
	started := make(chan struct{})
	var once sync.Once
	endless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			once.Do(func() { close(started) })
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}))
	defer endless.Close()
	dir := t.TempDir()
	config := writeConfig(t, dir, filepath.Join(dir, "data"))
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	b = []byte(strings.Replace(string(b), "simulate: always", "base_url: "+endless.URL, 1))
	if err := os.WriteFile(config, b, 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr logtest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--config", config}, strings.NewReader(""), &stdout, &stderr)
	}()
	announce := regexp.MustCompile(`serving .* on (127\.0\.0\.1:\d+) \(admin`)
	var data string
	waitFor(t, "serve announces its address", 20*time.Second, func() bool {
		if m := announce.FindStringSubmatch(stderr.String()); m != nil {
			data = m[1]
		}
		return data != ""
	})
	req, err := http.NewRequest(http.MethodPost, "http://"+data+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"go on"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not start")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Logf("serve returned %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not return 15 s after it was stopped, with a stream in flight; stderr:\n%s", stderr.String())
	}
	out, _, err := runCmd(t, "", append([]string{"ledger", "export", "--config", config, "--tenant", "acme", "--format", "json"}, exportDays()...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"status":"settled"`) {
		t.Fatalf("the cut stream is not settled in the ledger: %s", out)
	}
}

// TestEstimateExplains: estimate prices what serve would, under the config:
// a generic route by its upstream's cost rule, and an LLM request without an
// output limit at the model's maximum output, saying so.
func TestEstimateExplains(t *testing.T) {
	t.Setenv("COSTGATE_CONFIG", "")
	dir := t.TempDir()
	config := filepath.Join(dir, "costgate.yaml")
	if err := os.WriteFile(config, []byte(`
admin_token: t
costs: {output_reserve: 50}
upstreams:
  - name: openai
    kind: openai
    simulate: always
  - name: search
    kind: generic
    base_url: http://127.0.0.1:1
    cost: {unit: results, per_call: "0.001", per_unit: "0.0001", units: {query: count, default: 10}}
    paths:
      - prefix: /images
        cost: {per_call: "0.01"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	type output struct {
		Kind            string   `json:"kind"`
		MaxOutputTokens *int64   `json:"max_output_tokens"`
		Reserved        *int64   `json:"reserved_output_tokens"`
		Upstream        string   `json:"upstream"`
		Cost            int64    `json:"cost_nano_usd"`
		Why             []string `json:"why"`
		Usage           struct {
			OutputTokens int64 `json:"output_tokens"`
			Units        int64 `json:"units"`
		} `json:"usage"`
	}
	estimate := func(body string, args ...string) output {
		t.Helper()
		out, stderr, err := runCmd(t, body, append([]string{"estimate"}, args...)...)
		if err != nil {
			t.Fatalf("estimate %v: %v\n%s", args, err, stderr)
		}
		var o output
		if err := json.Unmarshal([]byte(out), &o); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out)
		}
		return o
	}

	t.Run("no output limit", func(t *testing.T) {
		o := estimate(`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}`)
		if o.MaxOutputTokens == nil || *o.MaxOutputTokens != 0 || o.Reserved == nil || *o.Reserved != 16384 || o.Usage.OutputTokens != 16384 {
			t.Fatalf("max_output_tokens %v, reserved_output_tokens %v, usage.output_tokens %d; want 0, 16384, 16384", o.MaxOutputTokens, o.Reserved, o.Usage.OutputTokens)
		}
		why := strings.Join(o.Why, " ")
		if !strings.Contains(why, "sets no output limit") || !strings.Contains(why, "maximum output, 16384 tokens") {
			t.Errorf("why does not say the model's maximum is reserved: %q", why)
		}
	})
	t.Run("the config's output_reserve", func(t *testing.T) {
		o := estimate(`{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"Hello"}]}`, "--config", config)
		if *o.MaxOutputTokens != 100 || *o.Reserved != 50 {
			t.Fatalf("max_output_tokens %d, reserved %d; want 100 and 50 (output_reserve 50%%)", *o.MaxOutputTokens, *o.Reserved)
		}
		if why := strings.Join(o.Why, " "); !strings.Contains(why, "output_reserve 50%") {
			t.Errorf("why does not name the output reserve: %q", why)
		}
	})
	for _, c := range []struct {
		name, route string
		units, cost int64
		why         string
	}{
		{"generic route", "/u/search/v1/web?q=go&count=20", 20, 1_000_000 + 20*100_000, "upstream search's cost rule: per call $0.001000000, plus 20 results at $0.000100000 each"},
		{"generic route, default units", "/u/search/v1/web?q=go", 10, 1_000_000 + 10*100_000, "plus 10 results"},
		{"generic route, path rule", "/u/search/images/x", 1, 10_000_000, "for paths under /images"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := estimate("", "--config", config, "--method", "GET", "--route", c.route)
			if o.Kind != "generic" || o.Upstream != "search" || o.Usage.Units != c.units || o.Cost != c.cost {
				t.Fatalf("kind %q upstream %q units %d cost %d; want generic, search, %d, %d", o.Kind, o.Upstream, o.Usage.Units, o.Cost, c.units, c.cost)
			}
			if why := strings.Join(o.Why, " "); !strings.Contains(why, c.why) {
				t.Errorf("why %q, want it to say %q", why, c.why)
			}
		})
	}
	for _, c := range []struct{ name, route, want string }{
		{"unknown upstream", "/u/nope/x", `no upstream named "nope"`},
		{"not a generic upstream", "/u/openai/v1/chat/completions", "not generic"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, _, err := runCmd(t, "", "estimate", "--config", config, "--route", c.route); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}
