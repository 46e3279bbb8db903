package control_test

// Attacks of a tenant on a budget's temporary raise: an operator who
// lowers the budget of a tenant that abuses its raise must stop it.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestRaiseAtkLoweredBudgetEndsRaise: a budget raised for a day, then
// lowered by a PATCH below what was spent, refuses at once: the lowering
// ends the raise (before, the raise kept its amount in force until its end,
// and the PATCH, answered 200 with the lowered amount, changed nothing for
// a day). A PATCH that leaves the amount as it is, or raises it below the
// raise, keeps the raise; so does a PATCH of another field; an amount at
// the raise's ends it.
func TestRaiseAtkLoweredBudgetEndsRaise(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	budget := func(amount string) string {
		return fmt.Sprintf(`{"budgets":[{"id":"b","amount_usd":%q,"period":"day"}]}`, amount)
	}
	for _, c := range []struct {
		name, patch string
		keeps       bool
		status      int // of the next request
	}{
		{"lowered below the spend", "", false, 402},
		{"the same amount", budget("0.0001"), true, 200},
		{"raised, below the raise", budget("0.0002"), true, 200},
		{"raised to the raise", budget("100.00"), false, 200},
		{"another field", `{"metadata":{"who":"x"}}`, true, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			var k created
			r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1",`+budget("0.0001")[1:], &k)
			r.must(t, 200, "POST", "/admin/v1/keys/"+k.ID+"/budgets/b/raise", `{"amount_usd":"100.00","for":"24h"}`, nil)
			for range 3 {
				if st, body := r.chat(t, k.Key); st != 200 {
					t.Fatalf("under the raise: %d %s", st, body)
				}
			}
			_, spent := cpraceLevel(t, r, k.ID, "key/"+k.ID+"/b")
			patch := c.patch
			if patch == "" {
				patch = budget((spent * 2 / 3).String())
			}
			body := r.must(t, 200, "PATCH", "/admin/v1/keys/"+k.ID, patch, nil)
			if got := strings.Contains(body, "raised_amount_usd"); got != c.keeps {
				t.Errorf("after the PATCH the raise is there: %v, want %v: %s", got, c.keeps, body)
			}
			if st, resp := r.chat(t, k.Key); st != c.status {
				t.Fatalf("after the PATCH %s (spent %s, raised to $100): %d, want %d: %s", patch, spent, st, c.status, resp)
			}
			amount, _ := cpraceLevel(t, r, k.ID, "key/"+k.ID+"/b")
			want := spent * 2 / 3
			if c.keeps || c.patch != "" {
				want = costmodel.NanoUSD(100e9)
			}
			if amount != want {
				t.Fatalf("the level shows an amount of %s", amount)
			}
		})
	}
}
