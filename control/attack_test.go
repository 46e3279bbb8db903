package control_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// ctlAtkSpend sends chat completions with key until one is refused, and
// returns how many were admitted and the refusal's status (0 when none
// was refused within max).
func ctlAtkSpend(t *testing.T, r *replica, key string, max int) (admitted, status int) {
	t.Helper()
	for range max {
		st, body := r.chat(t, key)
		switch st {
		case 200:
			admitted++
		case 402, 429:
			return admitted, st
		default:
			t.Fatalf("status %d: %s", st, body)
		}
	}
	return admitted, 0
}

// TestControlAttackBudgetPeriodChange: a budget spent for its period, whose
// period an operator changes to a longer one that contains it (same id,
// same amount), is still spent: this period's spend counts in the longer
// period too. The budget's counter keeps its key (its id and generation),
// so the new window must read what the old one counted.
func TestControlAttackBudgetPeriodChange(t *testing.T) {
	rd := redistest.New(t)
	r := newReplica(t, simulatorURL(t), replicaOptions{redis: rd.URL})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	for _, c := range []struct{ from, to string }{
		{"day", "week"},
		{"day", "month"},
		{"day", "720h"},
		{"1h", "day"},
	} {
		t.Run(c.from+" to "+c.to, func(t *testing.T) {
			var k created
			r.must(t, 201, "POST", "/admin/v1/keys",
				`{"tenant":"t1","budgets":[{"id":"b","amount_usd":"0.0002","period":"`+c.from+`"}]}`, &k)
			n, st := ctlAtkSpend(t, r, k.Key, 50)
			if st != 402 || n == 0 {
				t.Fatalf("%d admitted, then %d: want some, then 402", n, st)
			}
			r.must(t, 200, "PATCH", "/admin/v1/keys/"+k.ID,
				`{"budgets":[{"id":"b","amount_usd":"0.0002","period":"`+c.to+`"}]}`, nil)
			if st, body := r.chat(t, k.Key); st != 402 {
				t.Fatalf("after the period went from %s to %s (the spend of this %s is in it): %d %s, want 402",
					c.from, c.to, c.from, st, body)
			}
		})
	}
}

// TestControlAttackAdminInputBytes: ids and filters are the caller's
// bytes, and PostgreSQL refuses a NUL or invalid UTF-8 in text: the admin
// API must answer 4xx (404 for an id no entity can have, 400 for a
// filter), never 500, and never the 503 that says the database is down.
func TestControlAttackAdminInputBytes(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{dsn: pgtest.New(t)})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	for _, c := range []struct{ name, method, path, body string }{
		{"key id with a NUL", "GET", "/admin/v1/keys/key_%00", ""},
		{"tenant id not UTF-8", "GET", "/admin/v1/tenants/t%ff", ""},
		{"team id not UTF-8", "PATCH", "/admin/v1/teams/%c3%28", `{"active":false}`},
		{"revoke a key id with a NUL", "DELETE", "/admin/v1/keys/%00", ""},
		{"rotate a key id not UTF-8", "POST", "/admin/v1/keys/%fe/rotate", `{}`},
		{"reset a budget of an id with a NUL", "POST", "/admin/v1/users/u%00/budgets/day/reset", ""},
		{"list filter tenant with a NUL", "GET", "/admin/v1/keys?tenant=%00", ""},
		{"list filter after not UTF-8", "GET", "/admin/v1/teams?after=%ff", ""},
		{"audit filter entity with a NUL", "GET", "/admin/v1/audit?entity=%00", ""},
		{"key of a team not UTF-8", "POST", "/admin/v1/keys", `{"tenant":"t1","team":"\udc00x"}`},
		{"key of a team with a NUL", "POST", "/admin/v1/keys", `{"tenant":"t1","team":"a\u0000b"}`},
		{"key of a user with a NUL", "POST", "/admin/v1/keys", `{"tenant":"t1","user":"\u0000"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, body := r.call(t, "test-admin", c.method, c.path, c.body, nil)
			if st < 400 || st >= 500 || !strings.Contains(body, `"error"`) {
				t.Fatalf("%s %s: %d %s, want a 4xx", c.method, c.path, st, body)
			}
		})
	}
	// The database is fine: the API still works.
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, nil)
}

// TestControlAttackAdminNumbers: amounts, rates, periods and durations at
// and past the ends of what they can hold are 400 with the field named,
// never 500 and never accepted into a limit that overflows.
func TestControlAttackAdminNumbers(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	r.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"t1","name":"ops","budgets":[{"amount_usd":"1"}]}`, nil)
	var team struct {
		ID string `json:"id"`
	}
	st, body := r.call(t, "test-admin", "GET", "/admin/v1/teams?tenant=t1", "", nil)
	if st != 200 {
		t.Fatalf("%d %s", st, body)
	}
	team.ID = body[strings.Index(body, "team_") : strings.Index(body, "team_")+17]
	for _, c := range []struct {
		name, method, path, body string
		says                     string
	}{
		{"ten decimals", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"0.0000000001"}]}`, "amount_usd"},
		{"a plus sign", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"+1"}]}`, "amount_usd"},
		{"hex", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"0x10"}]}`, "amount_usd"},
		{"underscores", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1_000"}]}`, "amount_usd"},
		{"infinity", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"Inf"}]}`, "amount_usd"},
		{"a dot alone", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"."}]}`, "amount_usd"},
		{"negative zero point", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"-0.000000001"}]}`, "positive"},
		{"2^63 nano-dollars", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"9223372036.854775808"}]}`, "amount_usd"},
		{"rate at int64's end", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","rate":9223372036854775807,"period":"1ns"}]}`, "limits[0]"},
		{"rate past int64", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","rate":9223372036854775808,"period":"1m"}]}`, "rate"},
		{"fractional rate", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","rate":1.5,"period":"1m"}]}`, "rate"},
		{"burst at int64's end", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","rate":10,"burst":9223372036854775807,"period":"1m"}]}`, "limits[0]"},
		{"negative burst", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","rate":10,"burst":-1,"period":"1m"}]}`, "limits[0]"},
		{"usd limit too large", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","unit":"usd","rate_usd":"99999999999","period":"1m"}]}`, "rate_usd"},
		{"usd limit without an amount", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","unit":"usd","period":"1m"}]}`, "rate_usd"},
		{"unknown unit", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","unit":"bananas","rate":1,"period":"1m"}]}`, "unit"},
		{"period of a century", "POST", "/admin/v1/keys", `{"tenant":"t1","limits":[{"name":"x","rate":1,"period":"876000h"}]}`, "limits[0]"},
		{"budget period of a century", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1","period":"876000h"}]}`, "period"},
		{"negative budget period", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1","period":"-24h"}]}`, "-24h"},
		{"soft percent 100", "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"amount_usd":"1","soft_percent":100}]}`, "soft_percent"},
		{"raise for a negative while", "POST", "/admin/v1/teams/" + team.ID + "/budgets/day/raise", `{"amount_usd":"2","for":"-1h"}`, "for"},
		{"raise for longer than a duration holds", "POST", "/admin/v1/teams/" + team.ID + "/budgets/day/raise", `{"amount_usd":"2","for":"9999999999h"}`, "for"},
		{"raise by an amount too large", "POST", "/admin/v1/teams/" + team.ID + "/budgets/day/raise", `{"amount_usd":"1e9","for":"1h"}`, "amount_usd"},
		{"raise with until and for", "POST", "/admin/v1/teams/" + team.ID + "/budgets/day/raise", `{"amount_usd":"2","for":"1h","until":"2999-01-01T00:00:00Z"}`, "not both"},
		{"raise until year 10000", "POST", "/admin/v1/teams/" + team.ID + "/budgets/day/raise", `{"amount_usd":"2","until":"10000-01-01T00:00:00Z"}`, "parsing time"},
		{"grace of a year", "POST", "/admin/v1/keys/key_nope/rotate", `{"grace":"8760h"}`, "grace"},
		{"expiry of year 0", "POST", "/admin/v1/keys", `{"tenant":"t1","expires_at":"0000-01-01T00:00:00Z"}`, "expires_at"},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, body := r.call(t, "test-admin", c.method, c.path, c.body, nil)
			if st != 400 || !strings.Contains(body, c.says) {
				t.Fatalf("%s %s %s: %d %s, want 400 naming %q", c.method, c.path, c.body, st, body, c.says)
			}
		})
	}
}

// TestControlAttackModelListWithoutAModel: a key allowed one model only
// sends a request that names none, or names the allowed one in another
// spelling the upstream serves otherwise: the upstream must never serve a
// model outside the list.
func TestControlAttackModelListWithoutAModel(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	var k created
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","models":["gpt-4o-mini"]}`, &k)
	for _, c := range []struct{ name, body string }{
		{"no model", `{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"null model", `{"model":null,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"empty model", `{"model":"","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"another model in upper case", `{"model":"GPT-4O","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", r.data+"/v1/chat/completions", strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer "+k.Key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && !strings.Contains(string(b), `"model":"gpt-4o-mini`) {
				t.Fatalf("a key allowed gpt-4o-mini only was served: %s", b)
			}
		})
	}
}
