package chaos_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the costgate binary, built once per test binary.
var (
	binDir    string
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// long reports whether the heavier variants run (CHAOS_LONG=1).
func long() bool { return os.Getenv("CHAOS_LONG") != "" }

// costgateBinary builds ./cmd/costgate once into a temporary directory
// (with -race when CHAOS_RACE is set) and returns its path.
func costgateBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "chaos-costgate-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "costgate")
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		args := []string{"build", "-o", binPath}
		if os.Getenv("CHAOS_RACE") != "" {
			args = append(args, "-race")
		}
		cmd := exec.Command(goTool, append(args, "./cmd/costgate")...)
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/costgate: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// process is costgate running as a separate process, on free loopback
// ports. Kill and Start run it again with the same config and data
// directory; its ports change.
type process struct {
	t      *testing.T
	bin    string
	config string
	log    string // stderr of every run, appended

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	url      string
	adminURL string
}

const adminToken = "chaos-admin"

// startCostgate writes cfg (a YAML document; listen, admin_listen,
// admin_token and data_dir are added) and runs costgate serve on it. The
// process is killed when the test ends.
func startCostgate(t *testing.T, cfg string) *process {
	t.Helper()
	dir := t.TempDir()
	full := fmt.Sprintf("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nadmin_token: %s\ndata_dir: %s\n%s",
		adminToken, filepath.Join(dir, "data"), cfg)
	p := &process{t: t, bin: costgateBinary(t), config: filepath.Join(dir, "costgate.yaml"), log: filepath.Join(dir, "costgate.log")}
	if err := os.WriteFile(p.config, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if !strings.Contains(l, `"msg":"request refused"`) {
					lines = append(lines, l)
				}
			}
			if len(lines) > 25 {
				lines = lines[len(lines)-25:]
			}
			t.Logf("costgate's last log lines (refusals left out):\n%s", strings.Join(lines, "\n"))
		}
	})
	p.Start()
	return p
}

// servingLine is serve's startup log record (on stderr, with its logs).
var servingLine = regexp.MustCompile(`serving .* on ([^\s)"]+) \(admin on ([^\s)"]+)\)`)

// Start runs costgate and returns once it serves and /readyz answers 200.
func (p *process) Start() {
	p.t.Helper()
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(p.bin, "serve", "--config", p.config)
	cmd.Env = cleanEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		p.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		p.t.Fatal(err)
	}
	exited := make(chan struct{})
	copied := make(chan struct{})
	addrs := make(chan []string, 1)
	// The log is copied line by line to the log file, and the serving line
	// picked out on the way.
	go func() {
		defer close(copied)
		defer logf.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			logf.Write(append(sc.Bytes(), '\n'))
			if m := servingLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addrs <- m[1:]:
				default:
				}
			}
		}
		io.Copy(logf, stderr)
	}()
	go func() {
		<-copied // Wait closes the pipe: read it all first
		cmd.Wait()
		close(exited)
	}()
	select {
	case a := <-addrs:
		p.mu.Lock()
		p.cmd, p.exited = cmd, exited
		p.url, p.adminURL = "http://"+a[0], "http://"+a[1]
		p.mu.Unlock()
	case <-exited:
		b, _ := os.ReadFile(p.log)
		p.t.Fatalf("costgate exited at start:\n%s", b)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		p.t.Fatal("costgate did not start within 60 s")
	}
	waitFor(p.t, 30*time.Second, "costgate's /readyz", func() bool {
		resp, err := http.Get(p.AdminURL() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// cleanEnv is the environment without the variables that would point
// costgate at stores other than the config's.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "REDIS_URL", name == "DATABASE_URL", strings.HasPrefix(name, "COSTGATE_"), strings.HasPrefix(name, "OTEL_"):
			continue
		}
		env = append(env, kv)
	}
	return env
}

// URL is the data plane's base URL of the current run.
func (p *process) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.url
}

// AdminURL is the admin plane's base URL of the current run.
func (p *process) AdminURL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.adminURL
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *process) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop sends SIGTERM, waits up to 40 s for the drain, then kills.
func (p *process) stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(40 * time.Second):
		cmd.Process.Kill()
		<-exited
	}
}

// admin GETs an admin path and decodes its JSON answer into v.
func (p *process) admin(path string, v any) error {
	req, _ := http.NewRequest("GET", p.AdminURL()+path, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return json.Unmarshal(b, v)
}

// usage is a ledger entry's usage.
type usage struct {
	InputTokens       int64 `json:"input_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens"`
	CacheWriteTokens  int64 `json:"cache_write_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	ReasoningTokens   int64 `json:"reasoning_tokens"`
}

// entry is a ledger entry as GET /admin/v1/ledger?format=json gives it.
type entry struct {
	RequestID     string `json:"request_id"`
	Tenant        string `json:"tenant"`
	Route         string `json:"route"`
	Model         string `json:"model"`
	Status        string `json:"status"`
	HTTPStatus    int    `json:"http_status"`
	Estimated     usage  `json:"estimated"`
	Actual        usage  `json:"actual"`
	EstimatedCost int64  `json:"estimated_cost_nanousd"`
	ActualCost    int64  `json:"actual_cost_nanousd"`
}

// charge is what the entry counts for in spend.
func (e entry) charge() int64 {
	if e.Status == "reserved" {
		return e.EstimatedCost
	}
	return e.ActualCost
}

// ledger returns the tenant's ledger entries of yesterday to tomorrow.
func (p *process) ledger(tenant string) ([]entry, error) {
	now := time.Now().UTC()
	from, to := now.AddDate(0, 0, -1).Format(time.DateOnly), now.AddDate(0, 0, 2).Format(time.DateOnly)
	var out []entry
	err := p.admin(fmt.Sprintf("/admin/v1/ledger?tenant=%s&from=%s&to=%s&format=json", tenant, from, to), &out)
	return out, err
}

// finalLedger polls the ledger until no entry of the tenant is reserved
// and at least want entries are there, and returns it. When that does not
// happen within 30 s it fails t and returns the last ledger it read.
func (p *process) finalLedger(t *testing.T, tenant string, want int) []entry {
	t.Helper()
	var es []entry
	var last error
	ok := poll(30*time.Second, func() bool {
		es, last = p.ledger(tenant)
		if last != nil || len(es) < want {
			return false
		}
		for _, e := range es {
			if e.Status == "reserved" {
				return false
			}
		}
		return true
	})
	if !ok {
		reserved := 0
		for _, e := range es {
			if e.Status == "reserved" {
				reserved++
			}
		}
		t.Errorf("after 30 s the ledger of %s has %d entries (%d reserved), want %d final (last error: %v)", tenant, len(es), reserved, want, last)
	}
	return es
}

// spend returns the tenant's spend today from GET /admin/v1/tenants/{t}/spend.
func (p *process) spend(tenant string) (int64, error) {
	var s struct {
		Spent int64 `json:"spent_nano_usd"`
	}
	err := p.admin("/admin/v1/tenants/"+tenant+"/spend?period=day", &s)
	return s.Spent, err
}

// waitFor polls cond every 20 ms until it holds, or fails t after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(within, cond) {
		t.Fatalf("gave up after %v waiting for %s", within, what)
	}
}

// poll checks cond every 20 ms until it holds (true) or within has passed
// (false).
func poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// client sends requests to costgate.
type client struct {
	p  *process
	hc *http.Client
}

func newClient(p *process) *client {
	tr := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, MaxConnsPerHost: 0, IdleConnTimeout: 30 * time.Second}
	return &client{p: p, hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// result is one request's outcome as the client saw it.
type result struct {
	Status int
	ID     string // costgate's X-Request-Id
	Body   []byte
	Stream bool // the answer was a stream
	// Complete is set when the client read the whole answer: a 200 body to
	// its end, or a stream to its [DONE] or message_stop.
	Complete bool
	Err      error
}

// call sends one request; cutAfter > 0 closes a stream after that many
// events.
func (c *client) call(ctx context.Context, key, path, body string, header map[string]string, cutAfter int) result {
	req, err := http.NewRequestWithContext(ctx, "POST", c.p.URL()+path, strings.NewReader(body))
	if err != nil {
		return result{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return result{Err: err}
	}
	defer resp.Body.Close()
	r := result{Status: resp.StatusCode, ID: resp.Header.Get("X-Request-Id")}
	r.Stream = strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if !r.Stream {
		r.Body, r.Err = io.ReadAll(resp.Body)
		r.Complete = r.Err == nil && r.Status == 200
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	events := 0
	var all bytes.Buffer
	for sc.Scan() {
		line := sc.Text()
		all.WriteString(line + "\n")
		if !strings.HasPrefix(line, "data:") {
			continue
		}
		events++
		data := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if data == "[DONE]" || strings.Contains(data, `"type":"message_stop"`) {
			r.Complete = true
		}
		if cutAfter > 0 && events >= cutAfter && !r.Complete {
			r.Body = all.Bytes()
			return r // the deferred Close cuts the stream
		}
	}
	r.Body, r.Err = all.Bytes(), sc.Err()
	return r
}

// chatBody is an OpenAI chat request.
func chatBody(model string, maxTokens int, stream bool, text string) string {
	s := ""
	if stream {
		s = `,"stream":true`
	}
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d%s,"messages":[{"role":"user","content":%q}]}`, model, maxTokens, s, text)
}

// messagesBody is an Anthropic messages request.
func messagesBody(model string, maxTokens int, stream bool, text string) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":%q}]}`, model, maxTokens, stream, text)
}

// embeddingsBody is an OpenAI embeddings request.
func embeddingsBody(model, text string) string {
	return fmt.Sprintf(`{"model":%q,"input":%q}`, model, text)
}

// upstreamsYAML points both kinds of upstream at u.
func upstreamsYAML(u *upstream) string {
	return fmt.Sprintf(`upstreams:
  - {name: openai, kind: openai, base_url: %s, api_key: sk-chaos, timeout: 2m}
  - {name: anthropic, kind: anthropic, base_url: %s, api_key: sk-ant-chaos, timeout: 2m}
`, u.srv.URL, u.srv.URL)
}

// prices are the prices the drills configure, in nano-dollars per token
// (each is a whole number, so a cost is exact): input, cached input, cache
// write, output.
var prices = map[string][4]int64{
	"gpt-4o-mini":            {1000, 250, 1000, 4000},
	"o4-mini":                {2000, 500, 2000, 8000},
	"claude-haiku-4-5":       {1000, 100, 1250, 5000},
	"text-embedding-3-small": {20, 20, 20, 0},
}

const pricesYAML = `costs:
  prices:
    gpt-4o-mini: {input: "1.00", cached_input: "0.25", output: "4.00"}
    o4-mini: {input: "2.00", cached_input: "0.50", output: "8.00"}
    claude-haiku-4-5: {input: "1.00", cached_input: "0.10", cache_write: "1.25", output: "5.00"}
    text-embedding-3-small: {input: "0.02", output: "0"}
`

// cost prices what the upstream billed, independently of costmodel.
func cost(model string, in, cached, written, out int64) int64 {
	p, ok := prices[model]
	if !ok {
		panic("no price for " + model)
	}
	return (in-cached-written)*p[0] + cached*p[1] + written*p[2] + out*p[3]
}

func billCost(b bill) int64 {
	return cost(b.Model, b.Usage.InputTokens, b.Usage.CachedInputTokens, b.Usage.CacheWriteTokens, b.Usage.OutputTokens)
}

// tenantsYAML declares one tenant per name, each on the plan of its name,
// with the key "cg-NAME".
func tenantsYAML(names ...string) string {
	var b strings.Builder
	b.WriteString("tenants:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  - {name: %s, plan: %s, keys: [{id: %s-key, key: cg-%s, user: u}]}\n", n, n, n, n)
	}
	return b.String()
}
