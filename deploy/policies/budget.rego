# METADATA
# title: Budget friction
# description: |
#   Friction as a tenant's budget is spent: past half of it the output is
#   capped at 64 tokens and the caller is warned; past 75% the model is also
#   downgraded to gpt-4o-mini. A spent budget is refused with 402 by the
#   budget itself, before this policy runs.
package costgate.policies.budget

budget := b if {
	some s in input.spend
	s.scope == "tenant"
	s.budget_nano_usd > 0
	b := s
}

past(pct) if budget.spent_nano_usd * 100 >= budget.budget_nano_usd * pct

default decision := {"outcome": "allow"}

decision := {
	"outcome": "soft",
	"reason": "over 75% of the budget",
	"friction": {"cap_max_tokens": 64, "downgrade_model": "gpt-4o-mini", "warning": "over 75% of your budget: capped output, cheaper model"},
} if {
	past(75)
	input.request.model != "gpt-4o-mini"
} else := {
	"outcome": "soft",
	"reason": "over half of the budget",
	"friction": {"cap_max_tokens": 64, "warning": "over half of your budget: capped output"},
} if {
	past(50)
}
