package costgate.policies.demo_test

import data.costgate.policies.demo

spent(n) := {
	"caller": {"tenant": "t", "user": "", "key_id": "k", "plan": "free", "ip": "", "region": ""},
	"request": {"route": "/v1/chat/completions", "upstream": "openai", "model": "gpt-4o", "stream": false, "max_output_tokens": 256, "page": 0},
	"estimate": {"input_tokens": 10, "output_tokens": 256, "cost_nano_usd": 1000},
	"limits": [],
	"spend": [{"scope": "tenant", "period": "day", "spent_nano_usd": n, "budget_nano_usd": 1000}],
	"time": {"unix": 0, "hour": 0, "weekday": 0},
}

test_allow_below_half if demo.decision.outcome == "allow" with input as spent(499)

test_cap_past_half if {
	d := demo.decision with input as spent(500)
	d.outcome == "soft"
	d.friction.cap_max_tokens == 64
	not d.friction.downgrade_model
}

test_downgrade_past_three_quarters if {
	d := demo.decision with input as spent(750)
	d.friction.downgrade_model == "gpt-4o-mini"
}

test_refuse_when_spent if {
	d := demo.decision with input as spent(1000)
	d.outcome == "hard"
	d.status == 402
}
