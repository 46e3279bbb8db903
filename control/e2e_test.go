package control_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/control"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/simulator"
)

// replica is one costgate: its data plane and admin plane on loopback.
type replica struct {
	srv         *proxy.Server
	data, admin string
}

type replicaOptions struct {
	dsn, redis string // empty: the embedded ledger / the in-memory store
	dir        string // the data directory; empty: a new one
	alertURL   string
	format     string // the alerts' format; empty: cloudevents
	extra      string // more YAML at the end
	log        *slog.Logger
}

const alertSecret = "whsec-test"

func newReplica(t *testing.T, upstream string, o replicaOptions) *replica {
	t.Helper()
	alerts := ""
	if o.alertURL != "" {
		alerts = fmt.Sprintf(`
  alerts:
    url: %s
    secret: %s
    backoff: 50ms
    timeout: 2s`, o.alertURL, alertSecret)
		if o.format != "" {
			alerts += "\n    format: " + o.format
		}
	}
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	yaml := replicaYAML(o.dir, alerts, upstream, o.extra)
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	cfg.Store.Redis, cfg.Ledger.DSN = o.redis, o.dsn
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{Logger: o.log})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	data := httptest.NewServer(srv.Handler())
	t.Cleanup(data.Close)
	admin := httptest.NewServer(srv.AdminHandler())
	t.Cleanup(admin.Close)
	return &replica{srv: srv, data: data.URL, admin: admin.URL}
}

func simulatorURL(t *testing.T) string {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := httptest.NewServer(simulator.New(simulator.Config{Estimator: est}))
	t.Cleanup(sim.Close)
	return sim.URL
}

// call sends an admin request with token and decodes the answer into out
// (when not nil); it returns the status and the raw body.
func (r *replica) call(t *testing.T, token, method, path, body string, out any) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, r.admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Costgate-Actor", "tester")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

// must is call with the admin token, failing unless the status is want.
func (r *replica) must(t *testing.T, want int, method, path, body string, out any) string {
	t.Helper()
	st, b := r.call(t, "test-admin", method, path, body, out)
	if st != want {
		t.Fatalf("%s %s %s: %d, want %d: %s", method, path, body, st, want, b)
	}
	return b
}

// chat sends one chat completion with key; it returns the status and body.
func (r *replica) chat(t *testing.T, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", r.data+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// within polls cond until it holds or d passes, and returns how long it
// took; it fails the test on timeout.
func within(t *testing.T, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

type created struct {
	ID  string `json:"id"`
	Key string `json:"key"`
}

// receiver is a webhook endpoint on loopback: it checks every delivery's
// signature, answers the first attempt of each event 500, and counts the
// events it accepted.
type receiver struct {
	mu       sync.Mutex
	attempts map[string]int                // by idempotency key
	accepted map[string]control.CloudEvent // by idempotency key
	badSig   int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := control.Verify([]byte(alertSecret), r.Header.Get(control.SignatureHeader), body, time.Now(), 5*time.Minute); err != nil {
		rc.badSig++
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	idem := r.Header.Get("Idempotency-Key")
	rc.attempts[idem]++
	if rc.attempts[idem] == 1 {
		http.Error(w, "try again", http.StatusInternalServerError)
		return
	}
	var ev control.CloudEvent
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID != idem || ev.SpecVersion != "1.0" {
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	if _, dup := rc.accepted[idem]; dup {
		rc.attempts[idem+":dup"]++
	}
	rc.accepted[idem] = ev
}

// TestTwoReplicas runs two costgate replicas on one PostgreSQL and one
// Redis: what the admin API does on one holds on the other within a
// second.
func TestTwoReplicas(t *testing.T) {
	dsn := pgtest.New(t)
	rd := redistest.New(t)
	up := simulatorURL(t)
	rc := &receiver{attempts: map[string]int{}, accepted: map[string]control.CloudEvent{}}
	hook := httptest.NewServer(rc)
	t.Cleanup(hook.Close)
	a := newReplica(t, up, replicaOptions{dsn: dsn, redis: rd.URL, alertURL: hook.URL})
	b := newReplica(t, up, replicaOptions{dsn: dsn, redis: rd.URL, alertURL: hook.URL})

	a.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"initech","plan":"pro"}`, nil)
	// The team's budget fits a few requests (each reserves about $0.00003).
	a.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"initech","name":"research","budgets":[{"amount_usd":"0.0001","period":"day"}]}`, nil)
	a.must(t, 201, "POST", "/admin/v1/users", `{"tenant":"initech","name":"alice"}`, nil)
	a.must(t, 201, "POST", "/admin/v1/users", `{"tenant":"initech","name":"bob"}`, nil)
	var k1, k2 created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"initech","team":"research","user":"alice","budgets":[{"amount_usd":"1.00","period":"day"}]}`, &k1)
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"initech","team":"research","user":"bob"}`, &k2)
	if !strings.HasPrefix(k1.Key, "cgk_") || k1.ID == "" {
		t.Fatalf("created key: %+v", k1)
	}

	t.Run("created on one, works on the other within 1s", func(t *testing.T) {
		if st, body := a.chat(t, k1.Key); st != 200 {
			t.Fatalf("on the replica that created it: %d %s", st, body)
		}
		took := within(t, "key on replica b", time.Second, func() bool { st, _ := b.chat(t, k2.Key); return st == 200 })
		t.Logf("propagation: %s", took)
	})

	t.Run("the key is stored as a hash and shown once", func(t *testing.T) {
		body := b.must(t, 200, "GET", "/admin/v1/keys/"+k1.ID, "", nil)
		if strings.Contains(body, k1.Key) || strings.Contains(body, k1.Key[12:]) {
			t.Fatalf("GET shows the secret: %s", body)
		}
		var n int
		db := openDB(t, dsn)
		if err := db.QueryRow(`SELECT count(*) FROM control_entities WHERE spec LIKE '%' || $1 || '%' OR key_hash = $1`, k1.Key).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the secret is in the database (%d rows, %v)", n, err)
		}
	})

	t.Run("a team budget spent by two users refuses both with 402 naming the team", func(t *testing.T) {
		var last string
		for i := 0; i < 20; i++ {
			r, key := a, k1.Key
			if i%2 == 1 {
				r, key = b, k2.Key
			}
			st, body := r.chat(t, key)
			if st == 402 {
				last = body
				break
			}
			if st != 200 {
				t.Fatalf("request %d: %d %s", i, st, body)
			}
		}
		if !strings.Contains(last, "team/research/day") || !strings.Contains(last, "budget_exceeded") {
			t.Fatalf("the refusal does not name the team's budget: %q", last)
		}
		for _, c := range []struct {
			r   *replica
			key string
		}{{a, k1.Key}, {b, k1.Key}, {a, k2.Key}, {b, k2.Key}} {
			if st, body := c.r.chat(t, c.key); st != 402 || !strings.Contains(body, "team/research/day") {
				t.Fatalf("after the team's budget is spent: %d %s", st, body)
			}
		}
		// The key's own budget is far from spent: the team is the level
		// closest to refusing.
		var lv struct {
			Levels []control.LevelState `json:"levels"`
		}
		b.must(t, 200, "GET", "/admin/v1/keys/"+k1.ID+"/levels", "", &lv)
		if len(lv.Levels) != 2 {
			t.Fatalf("levels: %+v", lv.Levels)
		}
		for _, l := range lv.Levels {
			if l.Closest != (l.Level == "team") {
				t.Fatalf("closest: %+v", lv.Levels)
			}
		}
		// The dashboard shows the team's budget spent.
		var dash struct {
			Budgets []struct {
				Kind, Name    string
				SpentNanoUSD  int64 `json:"spent_nano_usd,string"`
				AmountNanoUSD int64 `json:"amount_nano_usd,string"`
			} `json:"budgets"`
		}
		_, raw := b.call(t, "test-admin", "GET", "/admin/data.json", "", nil)
		if err := json.Unmarshal([]byte(raw), &dash); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range dash.Budgets {
			if r.Kind == "team" && r.Name == "research" {
				found = r.AmountNanoUSD == 100_000 && r.SpentNanoUSD > 50_000
			}
		}
		if !found {
			t.Fatalf("the dashboard does not show the team's spent budget: %s", raw)
		}
		// The key sees its own budgets at every level.
		req, _ := http.NewRequest("GET", b.data+"/v1/costgate/usage", nil)
		req.Header.Set("Authorization", "Bearer "+k1.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		usage, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(usage), "team/research/day") || !strings.Contains(string(usage), "key/"+k1.ID+"/day") {
			t.Fatalf("usage: %d %s", resp.StatusCode, usage)
		}
	})

	t.Run("alerts: once per threshold, signed, retried after a 500", func(t *testing.T) {
		within(t, "three threshold alerts", 10*time.Second, func() bool {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			return len(rc.accepted) >= 3
		})
		time.Sleep(300 * time.Millisecond) // room for a duplicate to show
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if rc.badSig != 0 {
			t.Fatalf("%d deliveries with a bad signature", rc.badSig)
		}
		seen := map[int]int{}
		for idem, ev := range rc.accepted {
			b, _ := json.Marshal(ev.Data)
			var d control.ThresholdData
			json.Unmarshal(b, &d)
			if ev.Type != control.EventBudgetThreshold || d.Level != "team" || d.Budget != "day" {
				t.Fatalf("event: %+v", ev)
			}
			seen[d.Threshold]++
			if rc.attempts[idem] < 2 || rc.attempts[idem+":dup"] != 0 {
				t.Fatalf("event %s: %d attempts, %d duplicates", idem, rc.attempts[idem], rc.attempts[idem+":dup"])
			}
		}
		if seen[50] != 1 || seen[80] != 1 || seen[100] != 1 || len(seen) != 3 {
			t.Fatalf("thresholds seen: %v", seen)
		}
	})

	t.Run("rotation: the old key works for the grace period, then not", func(t *testing.T) {
		var rot created
		a.must(t, 200, "POST", "/admin/v1/keys/"+k2.ID+"/rotate", `{"grace":"1500ms"}`, &rot)
		if rot.Key == "" || rot.Key == k2.Key {
			t.Fatalf("rotate: %+v", rot)
		}
		// Spent team: 402 means the key was identified; 401 that it was not.
		within(t, "new key on b", time.Second, func() bool { st, _ := b.chat(t, rot.Key); return st == 402 })
		if st, _ := b.chat(t, k2.Key); st != 402 {
			t.Fatalf("old key within its grace period: %d", st)
		}
		within(t, "old key refused after the grace", 3*time.Second, func() bool { st, _ := b.chat(t, k2.Key); return st == 401 })
		if st, _ := a.chat(t, rot.Key); st != 402 {
			t.Fatalf("new key after the grace: %d", st)
		}
	})

	t.Run("revoked on one, refused on the other within 1s", func(t *testing.T) {
		b.must(t, 200, "DELETE", "/admin/v1/keys/"+k1.ID, "", nil)
		took := within(t, "revoked key on replica a", time.Second, func() bool { st, _ := a.chat(t, k1.Key); return st == 401 })
		t.Logf("revocation propagated in %s", took)
		st, body := a.call(t, "test-admin", "POST", "/admin/v1/keys/"+k1.ID+"/rotate", "", nil)
		if st != 409 {
			t.Fatalf("rotating a revoked key: %d %s", st, body)
		}
	})

	t.Run("budget reset and raise", func(t *testing.T) {
		var k3 created
		a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"initech","team":"research"}`, &k3)
		within(t, "k3 refused by the team", time.Second, func() bool { st, _ := b.chat(t, k3.Key); return st == 402 })
		var teams struct {
			Teams []control.Entity `json:"teams"`
		}
		a.must(t, 200, "GET", "/admin/v1/teams?tenant=initech", "", &teams)
		if len(teams.Teams) != 1 {
			t.Fatalf("teams: %+v", teams)
		}
		team := teams.Teams[0].ID
		a.must(t, 200, "POST", "/admin/v1/teams/"+team+"/budgets/day/reset", "", nil)
		within(t, "k3 served after the reset", time.Second, func() bool { st, _ := b.chat(t, k3.Key); return st == 200 })
		for i := 0; i < 10; i++ {
			if st, _ := b.chat(t, k3.Key); st == 402 {
				break
			}
		}
		a.must(t, 200, "POST", "/admin/v1/teams/"+team+"/budgets/day/raise", `{"amount_usd":"1.00","for":"1h"}`, nil)
		within(t, "k3 served after the raise", time.Second, func() bool { st, _ := b.chat(t, k3.Key); return st == 200 })
	})

	t.Run("audit log", func(t *testing.T) {
		var au struct {
			Audit []control.AuditEntry `json:"audit"`
		}
		b.must(t, 200, "GET", "/admin/v1/audit?entity="+k1.ID, "", &au)
		var actions []string
		for _, e := range au.Audit {
			if e.Actor != "admin:tester" || e.At.IsZero() {
				t.Fatalf("audit entry: %+v", e)
			}
			actions = append(actions, e.Action)
		}
		if strings.Join(actions, ",") != "revoke,create" {
			t.Fatalf("audit of the key: %v", actions)
		}
		if bytes.Contains([]byte(fmt.Sprint(au)), []byte(k1.Key)) {
			t.Fatal("the audit log holds the secret")
		}
	})

	t.Run("the read-only token reads and never writes", func(t *testing.T) {
		if st, body := b.call(t, "test-read", "GET", "/admin/v1/keys?tenant=initech", "", nil); st != 200 {
			t.Fatalf("read: %d %s", st, body)
		}
		if st, body := b.call(t, "test-read", "POST", "/admin/v1/tenants", `{"name":"evil"}`, nil); st != 403 || !strings.Contains(body, `"forbidden"`) {
			t.Fatalf("write with the read-only token: %d %s", st, body)
		}
		if st, _ := b.call(t, "test-read", "DELETE", "/admin/v1/keys/"+k2.ID, "", nil); st != 403 {
			t.Fatalf("revoke with the read-only token: %d", st)
		}
	})
}

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestPropagation measures how long a key created through one replica
// takes to be identified by another (both polling every 100 ms): p99
// must be under a second.
func TestPropagation(t *testing.T) {
	dsn := pgtest.New(t)
	up := simulatorURL(t)
	a := newReplica(t, up, replicaOptions{dsn: dsn})
	b := newReplica(t, up, replicaOptions{dsn: dsn})
	a.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	const n = 100
	took := make([]time.Duration, 0, n)
	for range n {
		var k created
		a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1"}]}`, &k)
		start := time.Now()
		for b.srv.Gate().Identify(k.Key) == nil {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("key %s not identified by the other replica within 5s", k.ID)
			}
			time.Sleep(time.Millisecond)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	p50, p99 := took[n/2], took[n*99/100]
	t.Logf("propagation of %d keys to another replica: p50 %s, p99 %s, max %s", n, p50, p99, took[n-1])
	if p99 >= time.Second {
		t.Fatalf("propagation p99 %s, want under 1s", p99)
	}
}

// replicaYAML is a replica's configuration: data directory dir, alerts
// (YAML under control, or ""), the upstream's URL and more YAML at the
// end (tenants after yamlco, then other sections).
func replicaYAML(dir, alerts, upstream, extra string) string {
	return fmt.Sprintf(`
admin_token: test-admin
data_dir: %q
store:
  timeout: 2s
  queue_timeout: 2s
control:
  read_token: test-read
  poll: 100ms%s
upstreams:
  - name: openai
    kind: openai
    base_url: %s
    api_key: sk-upstream
tenants:
  - name: yamlco
    plan: free
    keys:
      - id: yaml-key
        key: cg-test-yaml
%s`, dir, alerts, upstream, extra)
}
