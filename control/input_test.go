package control_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/control"
	"github.com/costgate/costgate/internal/pgtest"
)

// TestBadInput: every input the admin API refuses gets a clear 4xx that
// says why, on the embedded store.
func TestBadInput(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{extra: `
limits:
  - name: free-per-key
    plans: [free]
    dimensions: [api_key]
    rate: 1000
    period: 1m
`})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1","plan":"free"}`, nil)
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t2","plan":"free"}`, nil)
	r.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"t2","name":"ops"}`, nil)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		says                     string
	}{
		{"unknown field", "POST", "/admin/v1/keys", `{"tenant":"t1","bogus":1}`, 400, `unknown field \"bogus\"`},
		{"unknown field in a budget", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1","amount":"2"}]}`, 400, "unknown field"},
		{"negative amount", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"-1.00","period":"day"}]}`, 400, "must be positive"},
		{"zero amount", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"0"}]}`, 400, "must be positive"},
		{"amount too large to hold", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"99999999999999999999"}]}`, 400, "amount_usd"},
		{"amount over a million", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1000000.01"}]}`, 400, "at most"},
		{"amount as a number", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":1}]}`, 400, "amount_usd"},
		{"amount in another spelling", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1e3"}]}`, 400, "decimal"},
		{"unknown period", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1","period":"fortnight"}]}`, 400, "period"},
		{"two budgets of one period", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1"},{"amount_usd":"2"}]}`, 400, "given twice"},
		{"team of another tenant", "POST", "/admin/v1/keys", `{"tenant":"t1","team":"ops"}`, 400, `belongs to tenant \"t2\"`},
		{"unknown team", "POST", "/admin/v1/keys", `{"tenant":"t1","team":"nope"}`, 400, "does not exist"},
		{"unknown tenant", "POST", "/admin/v1/keys", `{"tenant":"nope"}`, 400, "does not exist"},
		{"expired at creation", "POST", "/admin/v1/keys", `{"tenant":"t1","expires_at":"` + past + `"}`, 400, "in the past"},
		{"bad limit", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"rpm","rate":-5,"period":"1m"}]}`, 400, "rate"},
		{"bad algorithm", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"rpm","algorithm":"magic","rate":5,"period":"1m"}]}`, 400, "algorithm"},
		{"tenant name", "POST", "/admin/v1/tenants", `{"name":"Bad Name"}`, 400, "name"},
		{"tenant name with a brace", "POST", "/admin/v1/tenants", `{"name":"a{b}"}`, 400, "name"},
		{"plan the config does not know", "POST", "/admin/v1/tenants", `{"name":"t4","plan":"fre"}`, 400, "the configuration's plans: free"},
		{"no plan where limits apply by plan", "POST", "/admin/v1/tenants", `{"name":"t4"}`, 400, "plan is required"},
		{"plan patched to one the config does not know", "PATCH", "/admin/v1/tenants/t1", `{"plan":"pro"}`, 400, "the configuration's plans: free"},
		{"plan of NUL", "POST", "/admin/v1/tenants", `{"name":"t4","plan":"free\u0000"}`, 400, "plan"},
		{"plan too long", "POST", "/admin/v1/tenants", `{"name":"t4","plan":"` + strings.Repeat("p", 513) + `"}`, 400, "plan"},
		{"plan patched to NUL", "PATCH", "/admin/v1/tenants/t1", `{"plan":"pro\u0000"}`, 400, "plan"},
		{"tenant twice", "POST", "/admin/v1/tenants", `{"name":"t1"}`, 409, "already exists"},
		{"tenant of the config file", "POST", "/admin/v1/tenants", `{"name":"yamlco"}`, 409, "config file"},
		{"change a tenant of the config file", "PATCH", "/admin/v1/tenants/yamlco", `{"plan":"pro"}`, 409, "read-only"},
		{"trailing data", "POST", "/admin/v1/tenants", `{"name":"t3"} {}`, 400, "after the object"},
		{"body too large", "POST", "/admin/v1/tenants", `{"name":"` + strings.Repeat("a", 2<<20) + `"}`, 413, "1 MiB"},
		{"unknown key", "GET", "/admin/v1/keys/key_nope", "", 404, "no key"},
		{"unknown list filter", "GET", "/admin/v1/keys?colour=red", "", 400, "unknown filter"},
		{"page size", "GET", "/admin/v1/keys?limit=100000", "", 400, "limit"},
		{"grace", "POST", "/admin/v1/keys/key_nope/rotate", `{"grace":"forever"}`, 400, "grace"},
		{"raise without until", "POST", "/admin/v1/tenants/t1/budgets/day/raise", `{"amount_usd":"1"}`, 400, "until"},
		{"reset of no budget", "POST", "/admin/v1/tenants/t1/budgets/day/reset", ``, 404, "no budget"},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, body := r.call(t, "test-admin", c.method, c.path, c.body, nil)
			if st != c.status || !strings.Contains(body, c.says) || !strings.Contains(body, `"error"`) {
				t.Fatalf("%d %s, want %d saying %q", st, body, c.status, c.says)
			}
		})
	}
	var doc struct {
		OpenAPI string         `json:"openapi"`
		Paths   map[string]any `json:"paths"`
	}
	r.must(t, 200, "GET", "/admin/v1/openapi.json", "", &doc)
	for _, p := range []string{"/admin/v1/tenants", "/admin/v1/keys", "/admin/v1/keys/{id}", "/admin/v1/keys/{id}/rotate", "/admin/v1/teams/{id}/budgets/{budget}/raise", "/admin/v1/audit", "/admin/v1/policies", "/admin/v1/policies/{id}/promote/replay", "/admin/v1/policies/{id}/promote", "/admin/v1/policies/{id}/demote"} {
		if doc.OpenAPI != "3.1.0" || doc.Paths[p] == nil {
			t.Fatalf("openapi.json (%s) does not document %s", doc.OpenAPI, p)
		}
	}
	if st, _ := r.call(t, "wrong-token", "GET", "/admin/v1/keys", "", nil); st != 401 {
		t.Fatalf("a wrong token: %d", st)
	}

	t.Run("a key expires", func(t *testing.T) {
		var k created
		at := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
		r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","expires_at":"`+at+`"}`, &k)
		if st, body := r.chat(t, k.Key); st != 200 {
			t.Fatalf("before expiry: %d %s", st, body)
		}
		within(t, "expired key refused", 3*time.Second, func() bool { st, _ := r.chat(t, k.Key); return st == 401 })
	})

	t.Run("models and limits of a key", func(t *testing.T) {
		var k created
		r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","models":["gpt-4o"],"limits":[{"name":"rpm","rate":2,"period":"1m"}]}`, &k)
		if st, body := r.chat(t, k.Key); st != 403 || !strings.Contains(body, "gpt-4o-mini") || !strings.Contains(body, k.ID) {
			t.Fatalf("a model the key may not use: %d %s", st, body)
		}
		r.must(t, 200, "PATCH", "/admin/v1/keys/"+k.ID, `{"models":["gpt-4o-mini"]}`, nil)
		for i := range 2 {
			if st, body := r.chat(t, k.Key); st != 200 {
				t.Fatalf("request %d: %d %s", i, st, body)
			}
		}
		if st, body := r.chat(t, k.Key); st != 429 || !strings.Contains(body, "key/"+k.ID+"/rpm") {
			t.Fatalf("third request in a minute: %d %s", st, body)
		}
	})

	t.Run("a tenant turned off stops its keys", func(t *testing.T) {
		var k created
		r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t2","team":"ops"}`, &k)
		if st, body := r.chat(t, k.Key); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
		r.must(t, 200, "PATCH", "/admin/v1/tenants/t2", `{"active":false}`, nil)
		if st, _ := r.chat(t, k.Key); st != 401 {
			t.Fatalf("key of a tenant turned off: %d", st)
		}
		r.must(t, 200, "PATCH", "/admin/v1/tenants/t2", `{"active":true}`, nil)
		if st, _ := r.chat(t, k.Key); st != 200 {
			t.Fatalf("key of a tenant turned on again: %d", st)
		}
	})

	t.Run("revoking a rotated key ends its old secret too", func(t *testing.T) {
		var k, rot created
		r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &k)
		r.must(t, 200, "POST", "/admin/v1/keys/"+k.ID+"/rotate", `{"grace":"1h"}`, &rot)
		if st, _ := r.chat(t, k.Key); st != 200 {
			t.Fatalf("old secret in its grace period: %d", st)
		}
		r.must(t, 200, "DELETE", "/admin/v1/keys/"+k.ID, "", nil)
		for _, s := range []string{k.Key, rot.Key} {
			if st, _ := r.chat(t, s); st != 401 {
				t.Fatalf("a secret of a revoked key: %d", st)
			}
		}
	})

	t.Run("concurrent requests never spend more than a budget", func(t *testing.T) {
		r.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"t1","name":"burst","budgets":[{"amount_usd":"0.0002"}]}`, nil)
		var k1, k2 created
		r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","team":"burst"}`, &k1)
		r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","team":"burst"}`, &k2)
		var wg sync.WaitGroup
		statuses := make([]int, 40)
		for i := range statuses {
			wg.Go(func() {
				key := k1.Key
				if i%2 == 1 {
					key = k2.Key
				}
				statuses[i], _ = r.chat(t, key)
			})
		}
		wg.Wait()
		ok := 0
		for _, st := range statuses {
			switch st {
			case 200:
				ok++
			case 402:
			default:
				t.Fatalf("status %d", st)
			}
		}
		var lv struct {
			Levels []control.LevelState `json:"levels"`
		}
		r.must(t, 200, "GET", "/admin/v1/keys/"+k1.ID+"/levels", "", &lv)
		if len(lv.Levels) != 1 || lv.Levels[0].Remaining < 0 || lv.Levels[0].Capacity != 200_000 || ok == 0 || ok == len(statuses) {
			t.Fatalf("%d admitted; team budget %+v", ok, lv.Levels)
		}
	})

	t.Run("a key of a tenant the config file declares", func(t *testing.T) {
		var ten control.Entity
		r.must(t, 200, "GET", "/admin/v1/tenants/yamlco", "", &ten)
		if ten.Source != "config" || ten.Plan != "free" {
			t.Fatalf("config tenant: %+v", ten)
		}
		var k created
		r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"yamlco","budgets":[{"amount_usd":"0.0001"}]}`, &k)
		st, body := 0, ""
		for range 10 {
			if st, body = r.chat(t, k.Key); st != 200 {
				break
			}
		}
		if st != 402 || !strings.Contains(body, fmt.Sprintf("key/%s/day", k.ID)) {
			t.Fatalf("the key's budget: %d %s", st, body)
		}
		// The config tenant's plan applies to the API's key.
		req, _ := http.NewRequest("GET", r.data+"/v1/costgate/usage", nil)
		req.Header.Set("Authorization", "Bearer "+k.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		usage, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(usage), `"plan":"free"`) || !strings.Contains(string(usage), "free-per-key") {
			t.Fatalf("usage of a key of a config tenant: %s", usage)
		}
		if st, body := r.chat(t, "cg-test-yaml"); st != 200 {
			t.Fatalf("the config file's own key: %d %s", st, body)
		}
	})
}

// TestDatabaseDown: with the database down, the admin API says so (503)
// and the data plane keeps serving the keys it knows, from its last copy;
// once the database is back, changes flow again.
func TestDatabaseDown(t *testing.T) {
	pg := pgtest.NewPrivate(t)
	r := newReplica(t, simulatorURL(t), replicaOptions{dsn: pg.URL()})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	var k created
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"5"}]}`, &k)
	pg.Stop()
	st, body := r.call(t, "test-admin", "POST", "/admin/v1/keys", `{"tenant":"t1"}`, nil)
	if st != 503 || !strings.Contains(body, "unavailable") {
		t.Fatalf("create with the database down: %d %s", st, body)
	}
	if st, _ := r.call(t, "test-admin", "GET", "/admin/v1/keys/"+k.ID, "", nil); st != 503 {
		t.Fatalf("get with the database down: %d", st)
	}
	time.Sleep(300 * time.Millisecond) // a few polls fail meanwhile
	for i := range 3 {
		if st, body := r.chat(t, k.Key); st != 200 {
			t.Fatalf("request %d with the database down: %d %s", i, st, body)
		}
	}
	pg.Start()
	within(t, "the admin API back", 10*time.Second, func() bool {
		st, _ := r.call(t, "test-admin", "POST", "/admin/v1/keys", `{"tenant":"t1"}`, nil)
		return st == 201
	})
}
