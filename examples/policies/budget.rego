# METADATA
# title: Budget thresholds
# description: |
#   Budgets get stricter as they are spent, whatever their scope (tenant,
#   user, key) and period (day, month): at 80% the output is capped, at 90%
#   the model is downgraded to a cheaper one as well, at 100% the request is
#   refused with 402. The shadow_decision tries a 70% warning without
#   enforcing it. All arithmetic is on integers: spent*100 >= budget*pct.
package costgate.policies.budget

downgrades := {
	"gpt-4o": "gpt-4o-mini",
	"gpt-4.1": "gpt-4.1-mini",
	"gpt-4.1-mini": "gpt-4.1-nano",
	"o3": "o4-mini",
	"claude-opus-4-1": "claude-sonnet-4-5",
	"claude-sonnet-4-5": "claude-haiku-4-5",
}

# Budgets that apply (a budget of 0 is no budget).
budgets contains s if {
	some s in input.spend
	s.budget_nano_usd > 0
}

at_least_100 if {
	some s in budgets
	s.spent_nano_usd >= s.budget_nano_usd
}

at_least_90 if {
	some s in budgets
	s.spent_nano_usd * 100 >= s.budget_nano_usd * 90
}

at_least_80 if {
	some s in budgets
	s.spent_nano_usd * 100 >= s.budget_nano_usd * 80
}

at_least_70 if {
	some s in budgets
	s.spent_nano_usd * 100 >= s.budget_nano_usd * 70
}

# friction at 90%: downgrade when the model has a cheaper sibling.
friction_90 := {"cap_max_tokens": 512, "downgrade_model": m, "warning": "over 90% of budget: cheaper model"} if {
	m := downgrades[input.request.model]
} else := {"cap_max_tokens": 512, "warning": "over 90% of budget"}

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 402, "reason": "budget spent"} if {
	at_least_100
} else := {"outcome": "soft", "reason": "over 90% of budget", "friction": friction_90} if {
	at_least_90
} else := {"outcome": "soft", "reason": "over 80% of budget", "friction": {"cap_max_tokens": 1024, "warning": "over 80% of budget"}} if {
	at_least_80
}

shadow_decision := {"outcome": "soft", "reason": "over 70% of budget", "friction": {"warning": "over 70% of budget"}} if {
	at_least_70
	not at_least_80
}
