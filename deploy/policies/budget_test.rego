package costgate.policies.budget_test

import data.costgate.policies.budget

spent(n, model) := {
	"caller": {"tenant": "t", "user": "", "key_id": "k", "plan": "trial", "ip": "", "region": ""},
	"request": {"route": "/v1/chat/completions", "upstream": "openai", "model": model, "stream": false, "max_output_tokens": 256, "page": 0},
	"estimate": {"input_tokens": 10, "output_tokens": 256, "cost_nano_usd": 1000},
	"limits": [],
	"spend": [{"scope": "tenant", "period": "day", "spent_nano_usd": n, "budget_nano_usd": 1000}],
	"time": {"unix": 0, "hour": 0, "weekday": 0},
}

test_allow_below_half if budget.decision.outcome == "allow" with input as spent(499, "gpt-4o")

test_cap_past_half if {
	d := budget.decision with input as spent(500, "gpt-4o")
	d.outcome == "soft"
	d.friction.cap_max_tokens == 64
	not d.friction.downgrade_model
}

test_downgrade_past_three_quarters if {
	d := budget.decision with input as spent(750, "gpt-4o")
	d.friction.downgrade_model == "gpt-4o-mini"
}

test_no_downgrade_of_the_cheap_model if {
	d := budget.decision with input as spent(950, "gpt-4o-mini")
	d.outcome == "soft"
	not d.friction.downgrade_model
}

test_no_budget_no_friction if {
	none := json.patch(spent(0, "gpt-4o"), [{"op": "replace", "path": "/spend", "value": []}])
	budget.decision.outcome == "allow" with input as none
}
