package costgate.policies.plans_test

import data.costgate.policies.plans
import data.costgate.testing.input_with
import data.costgate.testing.spend
import data.costgate.testing.tokens_limit

usd := 1000000000

test_unknown_plan_is_forbidden if {
	d := plans.decision with input as input_with({"plan": "gold"}, {}, [], [])
	d.outcome == "hard"
	d.status == 403
	contains(d.reason, "gold")
}

test_within_quotas_allows if {
	every p in ["free", "pro", "enterprise"] {
		plans.decision == {"outcome": "allow"} with input as input_with({"plan": p}, {"max_output_tokens": 500}, [tokens_limit(90000)], [spend("tenant", "month", 1, 1)])
	}
}

test_free_token_limit_refuses_429 if {
	d := plans.decision with input as input_with({"plan": "free"}, {}, [tokens_limit(1499)], [])
	d.status == 429
}

test_free_token_limit_exactly_enough_allows if {
	# estimate is 500 + 1000 tokens; max_output_tokens 1000 is under the cap.
	plans.decision == {"outcome": "allow"} with input as input_with({"plan": "free"}, {}, [tokens_limit(1500)], [])
}

test_free_month_quota_refuses_402 if {
	d := plans.decision with input as input_with({"plan": "free"}, {}, [], [spend("tenant", "month", 5 * usd, 0)])
	d.status == 402
}

test_only_tenant_month_spend_counts if {
	plans.decision == {"outcome": "allow"} with input as input_with({"plan": "free"}, {}, [], [spend("user", "month", 6 * usd, 0), spend("tenant", "day", 6 * usd, 0)])
}

test_pro_over_quota_downgrades if {
	d := plans.decision with input as input_with({"plan": "pro"}, {"model": "gpt-4o"}, [], [spend("tenant", "month", 500 * usd, 0)])
	d.outcome == "soft"
	d.friction == {"downgrade_model": "gpt-4o-mini", "cap_max_tokens": 8192}
}

test_pro_over_quota_without_cheaper_model_slows_down if {
	d := plans.decision with input as input_with({"plan": "pro"}, {"model": "gpt-4o-mini"}, [], [spend("tenant", "month", 500 * usd, 0)])
	d.friction == {"delay_ms": 1000, "cap_max_tokens": 8192}
}

test_pro_token_limit_delays if {
	d := plans.decision with input as input_with({"plan": "pro"}, {}, [tokens_limit(10)], [])
	d.outcome == "soft"
	d.friction.delay_ms == 750
}

test_enterprise_only_warned if {
	d := plans.decision with input as input_with({"plan": "enterprise"}, {}, [tokens_limit(0)], [spend("tenant", "month", 30000 * usd, 0)])
	d.outcome == "soft"
	object.keys(d.friction) == {"warning"}
}

test_output_cap_per_plan if {
	d := plans.decision with input as input_with({"plan": "free"}, {"max_output_tokens": 4096}, [], [])
	d.outcome == "soft"
	d.friction == {"cap_max_tokens": 1024}
}

test_no_max_tokens_gets_the_plan_cap if {
	d := plans.decision with input as input_with({"plan": "enterprise"}, {"max_output_tokens": 0}, [], [])
	d.friction == {"cap_max_tokens": 32768}
}

test_requests_without_model_are_not_capped if {
	plans.decision == {"outcome": "allow"} with input as input_with({"plan": "free"}, {"model": "", "max_output_tokens": 0}, [], [])
}
