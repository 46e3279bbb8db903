package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/costgate/costgate/internal/redistest"
)

// TestStackQueries runs costgate (deploy/costgate.yaml with test
// listeners, a private Redis, the embedded ledger and the built-in
// simulator), drives traffic that gives every kind of decision through it,
// takes Redis away, and scrapes it with a real Prometheus. Then every
// PromQL expression of every dashboard panel, and every metric selector of
// every alert rule, must return at least one series: a panel left blank or
// an alert left deaf by a renamed metric or label fails here.
func TestStackQueries(t *testing.T) {
	prometheus := tool(t, "prometheus")
	redis := redistest.New(t)
	start := time.Now()

	dir := t.TempDir()
	bin := filepath.Join(dir, "costgate")
	// Built with the test's own -race setting: under `go test -race ./...`
	// the packages are then already compiled, as the other tests' are.
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "./cmd/costgate")...)
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/costgate: %v\n%s", err, out)
	}
	t.Logf("built costgate in %v", time.Since(start).Round(time.Millisecond))

	keys := map[string]string{"acme": "test-acme-key", "globex": "test-globex-key", "initech": "test-initech-key"}
	const adminToken = "test-admin-token"
	config := stackConfig(t, dir, keys)
	data, admin := freeAddr(t), freeAddr(t)
	cg := exec.Command(bin, "serve", "--config", config, "--listen", data, "--admin-listen", admin,
		"--data-dir", filepath.Join(dir, "data"))
	cg.Env = append(cleanEnv(), "COSTGATE_ADMIN_TOKEN="+adminToken, "REDIS_URL="+redis.URL)
	cgLog := &logFile{path: filepath.Join(dir, "costgate.log")}
	cg.Stdout, cg.Stderr = cgLog.open(t), cgLog.open(t)
	startProcess(t, cg, cgLog)
	waitHTTP(t, "http://"+admin+"/healthz", cgLog)

	tokenFile := filepath.Join(dir, "admin-token")
	writeFile(t, tokenFile, adminToken)
	promAddr := freeAddr(t)
	promConfig := filepath.Join(dir, "prometheus.yml")
	alerts, err := filepath.Abs("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, promConfig, fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: costgate
    authorization: {type: Bearer, credentials_file: %q}
    static_configs: [{targets: [%q]}]
`, alerts, tokenFile, admin))
	prom := exec.Command(prometheus, "--config.file="+promConfig, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr)
	promLog := &logFile{path: filepath.Join(dir, "prometheus.log")}
	prom.Stdout, prom.Stderr = promLog.open(t), promLog.open(t)
	startProcess(t, prom, promLog)
	waitHTTP(t, "http://"+promAddr+"/-/ready", promLog)

	driveLoad(t, "http://"+data, "http://"+admin, adminToken, keys, redis)

	var queries []string
	d := dashboard(t)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			queries = append(queries, panelQuery(tg.Expr))
		}
	}
	for _, v := range d.Templating.List {
		// label_values(metric, label) is Grafana's, not PromQL: ask for the metric.
		if m := regexp.MustCompile(`^label_values\((\w+), *\w+\)$`).FindStringSubmatch(v.Definition); m != nil {
			queries = append(queries, m[1])
		} else {
			t.Errorf("template variable %s: cannot check %q", v.Name, v.Definition)
		}
	}
	for _, r := range alertRules(t) {
		sel := selectors(r.Expr)
		if len(sel) == 0 {
			t.Errorf("alert %s: no metric selector found in %q", r.Alert, r.Expr)
		}
		queries = append(queries, sel...)
	}
	slices.Sort(queries)
	queries = slices.Compact(queries)

	// Prometheus scrapes every second; a query is retried until its series
	// show or the deadline passes.
	empty := map[string]bool{}
	for _, q := range queries {
		empty[q] = true
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(empty) > 0 && time.Now().Before(deadline) {
		for q := range empty {
			n, err := seriesCount("http://"+promAddr, q)
			if err != nil {
				t.Fatalf("query %s: %v", q, err)
			}
			if n > 0 {
				delete(empty, q)
			}
		}
		if len(empty) > 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	for q := range empty {
		t.Errorf("no series for %s", q)
	}
	// The alert rules ran on the real series without an evaluation error
	// (a many-to-many match, say, that synthetic test series miss).
	states := ruleHealth(t, "http://"+promAddr)
	if len(states) != len(alertRules(t)) {
		t.Errorf("Prometheus loaded %d rules, alerts.yml has %d", len(states), len(alertRules(t)))
	}
	for _, r := range states {
		if r.Health != "ok" {
			t.Errorf("alert %s: health %q after evaluation: %s", r.Name, r.Health, r.LastError)
		}
	}
	t.Logf("%d queries checked in %v", len(queries), time.Since(start).Round(time.Millisecond))
	if t.Failed() {
		t.Logf("costgate's log:\n%s", cgLog.tail())
	}
}

// stackConfig writes deploy/costgate.yaml for a test: the tenants' keys in
// files of dir instead of /run/secrets, the policies of deploy/policies.
// The rest (limits, budgets, the simulator upstreams) is the stack's own.
func stackConfig(t *testing.T, dir string, keys map[string]string) string {
	t.Helper()
	var cfg map[string]any
	readYAML(t, "costgate.yaml", &cfg)
	for _, tv := range cfg["tenants"].([]any) {
		tenant := tv.(map[string]any)
		name := tenant["name"].(string)
		key, ok := keys[name]
		if !ok {
			t.Fatalf("costgate.yaml: tenant %s is new: give it a key in TestStackQueries", name)
		}
		for _, kv := range tenant["keys"].([]any) {
			k := kv.(map[string]any)
			file := filepath.Join(dir, filepath.Base(k["key_file"].(string)))
			writeFile(t, file, key+"\n")
			k["key_file"] = file
		}
	}
	policies, err := filepath.Abs("policies")
	if err != nil {
		t.Fatal(err)
	}
	cfg["policies"] = map[string]any{"dir": policies}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "costgate.yaml")
	writeFile(t, path, string(b))
	return path
}

// driveLoad sends requests that give each outcome the dashboard and the
// alerts watch: admitted, friction, 429, 402, shadow would-blocks, a
// config reload, and, with Redis stopped, fail-open admissions and
// fail-closed 503s.
func driveLoad(t *testing.T, data, admin, adminToken string, keys map[string]string, redis *redistest.Server) {
	t.Helper()
	statuses := map[string]map[int]int{}
	friction := 0
	send := func(tenant, model string, maxTokens int) int {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"How much does this cost?"}]}`, model, maxTokens)
		req, err := http.NewRequest("POST", data+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+keys[tenant])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tenant, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if statuses[tenant] == nil {
			statuses[tenant] = map[int]int{}
		}
		statuses[tenant][resp.StatusCode]++
		if resp.Header.Get("Costgate-Friction") != "" {
			friction++
		}
		return resp.StatusCode
	}

	// acme (pro): a burst past the shadow candidate's 3 per 10 s.
	for range 8 {
		send("acme", "gpt-4o-mini", 50)
	}
	// globex (free): past 5 requests a minute, 429.
	for range 7 {
		send("globex", "gpt-4o-mini", 50)
	}
	// initech (trial, $0.01 a day): friction past 80% of it, then 402.
	for i := 0; i < 60 && statuses["initech"][402] == 0; i++ {
		send("initech", "gpt-4o", 300)
		time.Sleep(110 * time.Millisecond) // under 10 requests a second
	}
	req, _ := http.NewRequest("POST", admin+"/admin/v1/reload", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatalf("reload: %v", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("reload: status %d", resp.StatusCode)
		}
	}

	// Redis goes away: pro's fail-closed limit answers 503, the free
	// plan's fail-open limits admit on the local fallback budget, and the
	// breaker opens.
	redis.Stop(t)
	for range 3 {
		send("acme", "gpt-4o-mini", 50)
		send("globex", "gpt-4o-mini", 50)
	}
	t.Logf("statuses by tenant: %v; %d with friction", statuses, friction)
	for _, want := range []struct {
		tenant string
		status int
	}{{"acme", 200}, {"globex", 429}, {"initech", 402}, {"acme", 503}} {
		if statuses[want.tenant][want.status] == 0 {
			t.Errorf("the load gave %s no %d", want.tenant, want.status)
		}
	}
	if friction == 0 {
		t.Error("the load gave no request with friction")
	}
}

// panelQuery gives a Grafana panel's expression the values Grafana would:
// every replica, and a rate interval wide enough for a 1 s scrape.
func panelQuery(expr string) string {
	return strings.NewReplacer(`$__rate_interval`, "1m", `$instance`, ".*").Replace(expr)
}

// selectorRE matches the metric selectors of an expression: costgate's
// metrics, the GenAI token histogram, and Prometheus's up.
var selectorRE = regexp.MustCompile(`\b(?:costgate_\w+|gen_ai_\w+|up)\b(?:\{[^}]*\})?`)

// selectors returns an alert expression's metric selectors with their label
// matchers (no range or offset): each must find a series on a running
// costgate, quiet or not, for the alert to be able to fire.
func selectors(expr string) []string {
	return selectorRE.FindAllString(expr, -1)
}

// seriesCount runs an instant query and counts the series it returns.
func seriesCount(prom, query string) (int, error) {
	resp, err := http.Get(prom + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s", r.Error)
	}
	if r.Data.ResultType == "scalar" {
		return 0, fmt.Errorf("a scalar, not series")
	}
	return len(r.Data.Result), nil
}

type ruleState struct {
	Name      string `json:"name"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// ruleHealth returns the state of every rule Prometheus has loaded, once
// each has been evaluated.
func ruleHealth(t *testing.T, prom string) []ruleState {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(prom + "/api/v1/rules")
		if err != nil {
			t.Fatalf("rules: %v", err)
		}
		var r struct {
			Data struct {
				Groups []struct {
					Rules []ruleState `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("rules: %v", err)
		}
		var rules []ruleState
		evaluated := true
		for _, g := range r.Data.Groups {
			for _, rule := range g.Rules {
				evaluated = evaluated && rule.Health != "unknown"
				rules = append(rules, rule)
			}
		}
		if len(rules) > 0 && evaluated || time.Now().After(deadline) {
			if len(rules) == 0 {
				t.Fatal("Prometheus loaded no alert rule")
			}
			return rules
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cleanEnv is the test's environment without what would change the
// config: costgate's own variables, the stores', the upstreams'
// credentials (the simulator must answer) and OpenTelemetry's.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "COSTGATE_") || strings.HasPrefix(name, "OTEL_") || slices.Contains(
			[]string{"REDIS_URL", "DATABASE_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"}, name) {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// logFile collects a child process's output for the test's failure report.
type logFile struct {
	path string
	f    *os.File
}

func (l *logFile) open(t *testing.T) *os.File {
	t.Helper()
	if l.f == nil {
		f, err := os.Create(l.path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		l.f = f
	}
	return l.f
}

// tail returns the end of the log.
func (l *logFile) tail() string {
	b, _ := os.ReadFile(l.path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// startProcess starts cmd and stops it (SIGINT, then a kill) when the test
// ends.
func startProcess(t *testing.T, cmd *exec.Cmd, log *logFile) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Logf("%s did not stop on SIGINT; killed. Its log:\n%s", filepath.Base(cmd.Path), log.tail())
		}
	})
}

// waitHTTP waits until url answers 200.
func waitHTTP(t *testing.T, url string, log *logFile) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not answer 200 in 30 s (last error %v). Log:\n%s", url, err, log.tail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
