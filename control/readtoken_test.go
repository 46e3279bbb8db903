package control_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestReadTokenReadsEveryAdminGet: the read-only token (control.read_token)
// reads what the admin token reads, on every GET route of the admin
// listener, the dashboard's data.json included (before, data.json
// answered it 401 and the dashboard refused to log in), and every GET
// route the OpenAPI document lists; each of its writes is 403 and changes
// nothing.
func TestReadTokenReadsEveryAdminGet(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{dsn: pgtest.NewPrivate(t).URL(), redis: redistest.New(t).URL})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"acme","plan":"free","budgets":[{"amount_usd":"5"}]}`, nil)
	var team, user, k created
	r.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"acme","name":"ops"}`, &team)
	r.must(t, 201, "POST", "/admin/v1/users", `{"tenant":"acme","name":"ann"}`, &user)
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"acme","team":"ops","user":"ann","budgets":[{"amount_usd":"1"}]}`, &k)
	if st, body := r.chat(t, k.Key); st != 200 {
		t.Fatalf("chat: %d %s", st, body)
	}

	gets := []string{
		"/metrics",
		"/admin/data.json",
		"/admin/v1/openapi.json",
		"/admin/v1/tenants/acme/spend?period=day",
		"/admin/v1/ledger?tenant=acme&format=csv",
		"/admin/v1/limits?key=%7Bacme%7D:tenant=acme",
		"/admin/v1/leases",
		"/admin/v1/top-throttled?n=5",
		"/admin/v1/shadow",
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	r.must(t, 200, "GET", "/admin/v1/openapi.json", "", &doc)
	ids := map[string]string{"tenants": "acme", "teams": team.ID, "users": user.ID, "keys": k.ID}
	for path, ops := range doc.Paths {
		if _, ok := ops["get"]; !ok {
			continue
		}
		if seg, _, ok := strings.Cut(strings.TrimPrefix(path, "/admin/v1/"), "/"); ok {
			path = strings.Replace(path, "{id}", ids[seg], 1)
		}
		gets = append(gets, path)
	}
	for _, path := range gets {
		for _, method := range []string{"GET", "HEAD"} {
			want, _ := r.call(t, "test-admin", method, path, "", nil)
			if want != 200 {
				t.Errorf("%s %s with the admin token: %d", method, path, want)
				continue
			}
			if st, body := r.call(t, "test-read", method, path, "", nil); st != want {
				t.Errorf("%s %s with the read-only token: %d %s, want %d as the admin token", method, path, st, body, want)
			}
		}
		if st, _ := r.call(t, "not-a-token", "GET", path, "", nil); st != 401 {
			t.Errorf("GET %s with another token: %d, want 401", path, st)
		}
	}

	for _, w := range []struct{ method, path, body string }{
		{"POST", "/admin/v1/tenants", `{"name":"intruder","plan":"free"}`},
		{"PATCH", "/admin/v1/tenants/acme", `{"active":false}`},
		{"POST", "/admin/v1/teams", `{"tenant":"acme","name":"intruders"}`},
		{"PATCH", "/admin/v1/teams/" + team.ID, `{"active":false}`},
		{"POST", "/admin/v1/users", `{"tenant":"acme","name":"mallory"}`},
		{"PATCH", "/admin/v1/users/" + user.ID, `{"active":false}`},
		{"POST", "/admin/v1/keys", `{"tenant":"acme"}`},
		{"PATCH", "/admin/v1/keys/" + k.ID, `{"active":false}`},
		{"POST", "/admin/v1/keys/" + k.ID + "/rotate", `{"grace":"0s"}`},
		{"DELETE", "/admin/v1/keys/" + k.ID, ""},
		{"POST", "/admin/v1/keys/" + k.ID + "/budgets/day/reset", ""},
		{"POST", "/admin/v1/tenants/acme/budgets/day/raise", `{"amount_usd":"50","until":"2099-01-01T00:00:00Z"}`},
		{"POST", "/admin/v1/reload", ""},
		{"POST", "/admin/v1/policies/replay", `{}`},
		{"POST", "/admin/v1/policies/p/promote/replay", `{}`},
		{"POST", "/admin/v1/policies/p/promote", `{}`},
		{"POST", "/admin/v1/policies/p/demote", `{}`},
		{"POST", "/admin/data.json", ""},
	} {
		st, body := r.call(t, "test-read", w.method, w.path, w.body, nil)
		want := 403
		if w.path == "/admin/data.json" {
			want = 405 // the dashboard's data is GET or HEAD only, whoever asks
		}
		if st != want {
			t.Errorf("%s %s with the read-only token: %d %s, want %d", w.method, w.path, st, body, want)
		}
	}
	// Nothing changed: the key serves, acme is active, no intruder.
	if st, body := r.chat(t, k.Key); st != 200 {
		t.Errorf("the key after the read-only token's writes: %d %s", st, body)
	}
	r.must(t, 404, "GET", "/admin/v1/tenants/intruder", "", nil)
	var acme struct{ Active bool }
	r.must(t, 200, "GET", "/admin/v1/tenants/acme", "", &acme)
	if !acme.Active {
		t.Error("acme was turned off by the read-only token")
	}
}
