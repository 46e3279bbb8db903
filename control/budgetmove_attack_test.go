package control_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// TestBudgetMoveAtkLevelRenamedInFlight: a key's control-plane budget of
// $0.01 a day; a request reserved at $0.005 and recorded is in flight
// when an operator renames the budget (PATCH, same amount); the request
// then costs $0.001. The new counter, restored while the ledger held the
// request at its estimate, must come to $0.001: $0.009 of $0.001
// requests fit after it.
func TestBudgetMoveAtkLevelRenamedInFlight(t *testing.T) {
	rd := redistest.New(t)
	a := newReplica(t, simulatorURL(t), replicaOptions{redis: rd.URL})
	a.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	var k created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"id":"b","amount_usd":"0.01","period":"day"}]}`, &k)
	g := a.srv.Gate()
	ctx := context.Background()
	reserve := func(cost string) (*gate.Reservation, gate.Decision) {
		c := g.Identify(k.Key)
		if c == nil {
			t.Fatal("the key identifies nobody")
		}
		v, err := costmodel.ParseUSD(cost)
		if err != nil {
			t.Fatal(err)
		}
		res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: costmodel.Estimate{Cost: v}})
		if res != nil {
			if d, ok := res.Record(ctx); !ok {
				t.Fatalf("record: %+v", d)
			}
		}
		return res, d
	}
	res, d := reserve("0.005")
	if res == nil {
		t.Fatalf("$0.005 refused: %+v", d)
	}
	a.must(t, 200, "PATCH", "/admin/v1/keys/"+k.ID, `{"budgets":[{"id":"c","amount_usd":"0.01","period":"day"}]}`, nil)
	within(t, "the renamed budget deciding", 5*time.Second, func() bool {
		r, d := reserve("0.000001")
		if r == nil {
			return false
		}
		r.Cancel(ctx)
		return d.RateLimit != nil && strings.HasSuffix(d.RateLimit.Name, "/c")
	})
	res.Settle(ctx, gate.Charge{Cost: 1_000_000, HTTPStatus: http.StatusOK}) // $0.001
	n := 0
	for range 20 {
		r, _ := reserve("0.001")
		if r == nil {
			break
		}
		r.Settle(ctx, gate.Charge{Cost: 1_000_000, HTTPStatus: http.StatusOK})
		n++
	}
	if n != 9 {
		t.Errorf("a key's $0.01 budget renamed while a request reserved at $0.005 was in flight, which cost $0.001: %d of $0.001 admitted after it, want 9", n)
	}
}
