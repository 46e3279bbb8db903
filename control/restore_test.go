package control_test

import (
	"context"
	"strings"
	"testing"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// spendUntil402 sends requests with key on r until one is refused with
// 402 and returns that body; it fails on any other status, or when 40
// requests do not spend the budget.
func spendUntil402(t *testing.T, r *replica, key string) string {
	t.Helper()
	for range 40 {
		st, body := r.chat(t, key)
		if st == 402 {
			return body
		}
		if st != 200 {
			t.Fatalf("%d %s", st, body)
		}
	}
	t.Fatal("40 requests did not spend the budget")
	return ""
}

// refused fails unless key is refused with 402 naming limit.
func refused(t *testing.T, r *replica, key, limit string) {
	t.Helper()
	if st, body := r.chat(t, key); st != 402 || !strings.Contains(body, limit) {
		t.Fatalf("want 402 naming %s, got %d %s", limit, st, body)
	}
}

// TestLevelBudgetsSurviveDataLoss spends budgets of every level of the
// control plane (a team's spent by two users' keys, a key's, a tenant's),
// flushes Redis, and checks that each is still spent: the counters are
// restored from the ledger before the next debit, as the config's budgets
// are. A budget reset counts only what was spent after it.
func TestLevelBudgetsSurviveDataLoss(t *testing.T) {
	dsn := pgtest.New(t)
	rd := redistest.New(t)
	a := newReplica(t, simulatorURL(t), replicaOptions{dsn: dsn, redis: rd.URL})
	flush := func() {
		t.Helper()
		if err := rd.Client(t).FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// Each request reserves about $0.00003 and costs less.
	a.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"umbrella","budgets":[{"amount_usd":"0.0004","period":"day"}]}`, nil)
	var team struct {
		ID string `json:"id"`
	}
	a.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"umbrella","name":"lab","budgets":[{"amount_usd":"0.0001","period":"day"}]}`, &team)
	a.must(t, 201, "POST", "/admin/v1/users", `{"tenant":"umbrella","name":"alice"}`, nil)
	a.must(t, 201, "POST", "/admin/v1/users", `{"tenant":"umbrella","name":"bob","budgets":[{"amount_usd":"0.00006","period":"72h"}]}`, nil)
	var k1, k2, k3, k4 created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"umbrella","team":"lab","user":"alice"}`, &k1)
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"umbrella","team":"lab"}`, &k2)
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"umbrella","user":"bob"}`, &k3)
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"umbrella","budgets":[{"amount_usd":"0.00005","period":"month"}]}`, &k4)

	t.Run("team", func(t *testing.T) {
		for i := 0; ; i++ {
			key := []string{k1.Key, k2.Key}[i%2]
			st, body := a.chat(t, key)
			if st == 402 {
				if !strings.Contains(body, "team/lab/day") {
					t.Fatalf("refused by another budget: %s", body)
				}
				break
			}
			if st != 200 || i > 40 {
				t.Fatalf("request %d: %d %s", i, st, body)
			}
		}
		flush()
		refused(t, a, k1.Key, "team/lab/day")
		refused(t, a, k2.Key, "team/lab/day")
	})
	t.Run("user", func(t *testing.T) {
		if body := spendUntil402(t, a, k3.Key); !strings.Contains(body, "user/bob/72h") {
			t.Fatalf("refused by another budget: %s", body)
		}
		flush()
		refused(t, a, k3.Key, "user/bob/72h")
	})
	t.Run("key", func(t *testing.T) {
		if body := spendUntil402(t, a, k4.Key); !strings.Contains(body, "key/"+k4.ID+"/month") {
			t.Fatalf("refused by another budget: %s", body)
		}
		flush()
		refused(t, a, k4.Key, "key/"+k4.ID+"/month")
	})
	t.Run("a reset counts what was spent after it", func(t *testing.T) {
		a.must(t, 200, "POST", "/admin/v1/teams/"+team.ID+"/budgets/day/reset", `{}`, nil)
		within(t, "the reset on the data plane", 2e9, func() bool { st, _ := a.chat(t, k1.Key); return st == 200 })
		flush()
		if st, body := a.chat(t, k2.Key); st != 200 {
			t.Fatalf("after the reset and a data loss: %d %s", st, body)
		}
		spendUntil402(t, a, k1.Key)
		flush()
		refused(t, a, k2.Key, "team/lab/day")
	})
	t.Run("tenant", func(t *testing.T) {
		var k5 created
		a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"umbrella"}`, &k5)
		within(t, "the new key", 2e9, func() bool { st, _ := a.chat(t, k5.Key); return st != 401 })
		if body := spendUntil402(t, a, k5.Key); !strings.Contains(body, "tenant/umbrella/day") {
			t.Fatalf("refused by another budget: %s", body)
		}
		flush()
		refused(t, a, k5.Key, "tenant/umbrella/day")
	})
}

// TestLevelBudgetsSurviveARestart spends a team's budget on a replica with
// the in-memory store and the embedded ledger, and opens another on the
// same data directory: the budget is still spent.
func TestLevelBudgetsSurviveARestart(t *testing.T) {
	up, dir := simulatorURL(t), t.TempDir()
	a := newReplica(t, up, replicaOptions{dir: dir})
	var team struct {
		ID string `json:"id"`
	}
	a.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"hooli"}`, nil)
	a.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"hooli","name":"moonshot","budgets":[{"amount_usd":"0.0001","period":"week"}]}`, &team)
	var k created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"hooli","team":"moonshot"}`, &k)
	if body := spendUntil402(t, a, k.Key); !strings.Contains(body, "team/moonshot/week") {
		t.Fatalf("refused by another budget: %s", body)
	}
	a.srv.Close()
	b := newReplica(t, up, replicaOptions{dir: dir})
	within(t, "the key on the new replica", 2e9, func() bool { st, _ := b.chat(t, k.Key); return st != 401 })
	refused(t, b, k.Key, "team/moonshot/week")
}
