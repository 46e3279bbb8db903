package costgate.policies.budget_test

import data.costgate.policies.budget
import data.costgate.testing.input_with
import data.costgate.testing.spend

at(pct, model) := input_with({}, {"model": model}, [], [spend("tenant", "day", pct * 1000000, 100000000)])

test_under_70_allows if {
	budget.decision == {"outcome": "allow"} with input as at(69, "gpt-4o")
	not budget.shadow_decision with input as at(69, "gpt-4o")
}

test_70_only_in_shadow if {
	budget.decision == {"outcome": "allow"} with input as at(70, "gpt-4o")
	budget.shadow_decision.outcome == "soft" with input as at(70, "gpt-4o")
	not budget.shadow_decision with input as at(80, "gpt-4o")
}

test_80_caps if {
	d := budget.decision with input as at(80, "gpt-4o")
	d.outcome == "soft"
	d.friction.cap_max_tokens == 1024
	not d.friction.downgrade_model
}

test_90_downgrades if {
	d := budget.decision with input as at(90, "gpt-4o")
	d.friction.downgrade_model == "gpt-4o-mini"
	d.friction.cap_max_tokens == 512
}

test_90_without_cheaper_model_only_caps if {
	d := budget.decision with input as at(95, "gpt-4.1-nano")
	d.outcome == "soft"
	not d.friction.downgrade_model
	d.friction.cap_max_tokens == 512
}

test_100_refuses_402 if {
	every pct in [100, 101, 250] {
		d := budget.decision with input as at(pct, "gpt-4o")
		d.outcome == "hard"
		d.status == 402
	}
}

test_89_is_still_80 if {
	d := budget.decision with input as at(89, "gpt-4o")
	d.reason == "over 80% of budget"
}

test_most_spent_budget_decides if {
	inp := input_with({}, {}, [], [spend("tenant", "month", 10, 100), spend("user", "day", 95, 100)])
	d := budget.decision with input as inp
	d.reason == "over 90% of budget"
}

test_zero_budget_is_no_budget if {
	budget.decision == {"outcome": "allow"} with input as input_with({}, {}, [], [spend("key", "day", 5, 0)])
}

test_huge_amounts_stay_exact if {
	# 10^17 nano-dollars: spent*100 exceeds 64 bits; Rego arithmetic is exact.
	inp := input_with({}, {}, [], [spend("tenant", "month", 89999999999999999, 100000000000000000)])
	d := budget.decision with input as inp
	d.reason == "over 80% of budget"
}
