package policies_test

import (
	"context"
	"fmt"
	"os"
	"testing/fstest"

	"github.com/costgate/costgate/policies"
)

const budgetPolicy = `package costgate.policies.budget

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 402, "reason": "day budget spent"} if {
	some s in input.spend
	s.period == "day"
	s.spent_nano_usd >= s.budget_nano_usd
} else := {"outcome": "soft", "reason": "over 80% of the day budget", "friction": {"cap_max_tokens": 256}} if {
	some s in input.spend
	s.period == "day"
	s.spent_nano_usd * 100 >= s.budget_nano_usd * 80
}
`

func Example() {
	set, err := policies.Load(fstest.MapFS{"budget.rego": {Data: []byte(budgetPolicy)}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, spent := range []int64{10, 85, 100} {
		d, err := set.Decide(context.Background(), &policies.Input{
			Caller:  policies.Caller{Tenant: "acme", Plan: "pro"},
			Request: policies.Request{Route: "chat", Model: "gpt-4o"},
			Spend:   []policies.Spend{{Scope: "tenant", Period: "day", SpentNanoUSD: spent, BudgetNanoUSD: 100}},
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("spent %d%%: %s %d %q cap=%d\n", spent, d.Outcome, d.Status, d.Reason, d.Friction.CapMaxTokens)
	}
	// Output:
	// spent 10%: allow 0 "" cap=0
	// spent 85%: soft 0 "over 80% of the day budget" cap=256
	// spent 100%: hard 402 "day budget spent" cap=0
}

func ExampleLoad_error() {
	_, err := policies.Load(fstest.MapFS{"p.rego": {Data: []byte(`package costgate.policies.p

decision := {"outcome": "hard", "status": 403, "reason": "free"} if {
	input.caller.plann == "free"
}
`)}})
	fmt.Println(err)
	// Output:
	// policies: p.rego:4:2: rego_type_error: undefined ref: input.caller.plann
	// 	input.caller.plann
	// 	             ^
	// 	             have: "plann"
	// 	             want (one of): ["ip" "key_id" "plan" "region" "tenant" "user"]
}

func ExampleTest() {
	passed, failed, err := policies.Test(context.Background(), os.DirFS("../examples/quickstart/policies"), new(discard))
	fmt.Println(passed > 0, failed, err)
	// Output: true 0 <nil>
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func ExampleEngine_Reload() {
	v1 := fstest.MapFS{"p.rego": {Data: []byte(`package costgate.policies.p

decision := {"outcome": "hard", "status": 403, "reason": "closed"} if input.caller.plan == "free"
`)}}
	broken := fstest.MapFS{"p.rego": {Data: []byte(`package costgate.policies.p

decision := {"outcome": "hard", "status": 403, "reason": "closed"} if input.caller.plan = = "free"
`)}}
	e, err := policies.NewEngine(v1)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(e.Reload(broken))
	// The last good set is still active.
	d, _ := e.Decide(context.Background(), &policies.Input{Caller: policies.Caller{Plan: "free"}})
	fmt.Println(d.Outcome, d.Status, d.Policy)
	// Output:
	// policies: p.rego:3:91: rego_parse_error: unexpected eq token
	// 	decision := {"outcome": "hard", "status": 403, "reason": "closed"} if input.caller.plan = = "free"
	// 	                                                                                          ^
	// hard 403 p
}
