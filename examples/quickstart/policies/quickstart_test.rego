package costgate.policies.quickstart_test

import data.costgate.policies.quickstart

base := {
	"caller": {"tenant": "demo-free", "user": "", "key_id": "k1", "plan": "free", "ip": "192.0.2.1", "region": ""},
	"request": {"route": "chat", "upstream": "openai", "model": "gpt-4o-mini", "stream": false, "max_output_tokens": 0, "page": 0},
	"estimate": {"input_tokens": 12, "output_tokens": 64, "cost_nano_usd": 40000},
	"limits": [],
	"spend": [{"scope": "tenant", "period": "day", "spent_nano_usd": 10000000, "budget_nano_usd": 50000000}],
	"time": {"unix": 1764500000, "hour": 10, "weekday": 1},
}

with_model(plan, model) := object.union(base, {
	"caller": object.union(base.caller, {"plan": plan}),
	"request": object.union(base.request, {"model": model}),
})

with_spend(spent, budget) := object.union(base, {"spend": [{"scope": "tenant", "period": "day", "spent_nano_usd": spent, "budget_nano_usd": budget}]})

test_free_plan_allowed_models if {
	every m in ["gpt-4o-mini", "gpt-4o-mini-2024-07-18", "gpt-4.1-nano", "claude-3-5-haiku-20241022", "claude-haiku-4-5"] {
		quickstart.decision == {"outcome": "allow"} with input as with_model("free", m)
	}
}

test_free_plan_forbidden_models if {
	every m in ["gpt-4o", "gpt-4.1", "claude-sonnet-4-5", "o3", "gpt-4o-minis"] {
		d := quickstart.decision with input as with_model("free", m)
		d.status == 403
	}
}

test_free_plan_forbids_gpt_4o if {
	d := quickstart.decision with input as with_model("free", "gpt-4o")
	d.outcome == "hard"
	d.status == 403
	contains(d.reason, "gpt-4o")
}

test_free_plan_forbids_sonnet if {
	d := quickstart.decision with input as with_model("free", "claude-sonnet-4-5")
	d.status == 403
}

test_pro_plan_may_use_any_model if {
	quickstart.decision == {"outcome": "allow"} with input as with_model("pro", "gpt-4o")
}

test_requests_without_model_are_not_forbidden if {
	quickstart.decision == {"outcome": "allow"} with input as with_model("free", "")
}

test_budget_spent_is_402 if {
	d := quickstart.decision with input as with_spend(50000000, 50000000)
	d.outcome == "hard"
	d.status == 402
}

test_budget_overspent_is_402 if {
	d := quickstart.decision with input as with_spend(50000001, 50000000)
	d.status == 402
}

test_budget_not_yet_spent_allows if {
	quickstart.decision == {"outcome": "allow"} with input as with_spend(49999999, 50000000)
}

test_no_budget_means_no_402 if {
	quickstart.decision == {"outcome": "allow"} with input as with_spend(99, 0)
}

test_month_budget_is_not_the_day_budget if {
	inp := object.union(base, {"spend": [{"scope": "tenant", "period": "month", "spent_nano_usd": 9, "budget_nano_usd": 9}]})
	quickstart.decision == {"outcome": "allow"} with input as inp
}

test_forbidden_model_wins_over_spent_budget if {
	inp := object.union(with_model("free", "gpt-4o"), {"spend": [{"scope": "tenant", "period": "day", "spent_nano_usd": 9, "budget_nano_usd": 9}]})
	d := quickstart.decision with input as inp
	d.status == 403
}
