# METADATA
# title: Budget friction
# description: |
#   Friction as a tenant's budget is spent: past 80% of it the output is
#   capped at 64 tokens and the caller is warned; past 90% the model is also
#   downgraded to gpt-4o-mini. A spent budget is refused with 402 by the
#   budget itself, before this policy runs.
package costgate.policies.budget

budget := b if {
	some b in input.spend
	b.scope == "tenant"
	b.budget_nano_usd > 0
}

past(pct) if budget.spent_nano_usd * 100 >= budget.budget_nano_usd * pct

default decision := {"outcome": "allow"}

decision := {
	"outcome": "soft",
	"reason": "over 90% of the budget",
	"friction": {"cap_max_tokens": 64, "downgrade_model": "gpt-4o-mini", "warning": "over 90% of your budget: capped output, cheaper model"},
} if {
	past(90)
	input.request.model != "gpt-4o-mini"
} else := {
	"outcome": "soft",
	"reason": "over 80% of the budget",
	"friction": {"cap_max_tokens": 64, "warning": "over 80% of your budget: capped output"},
} if {
	past(80)
}
