# METADATA
# title: Demo budget friction
# description: |
#   Friction as a daily budget is spent: past half of it the output is
#   capped at 64 tokens, past three quarters the model is also downgraded to
#   gpt-4o-mini; a spent budget is refused with 402.
package costgate.policies.demo

budget := b if {
	some s in input.spend
	s.scope == "tenant"
	s.period == "day"
	s.budget_nano_usd > 0
	b := s
}

past(pct) if budget.spent_nano_usd * 100 >= budget.budget_nano_usd * pct

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 402, "reason": "the daily budget is spent"} if {
	past(100)
} else := {
	"outcome": "soft",
	"reason": "over 75% of the daily budget",
	"friction": {"cap_max_tokens": 64, "downgrade_model": "gpt-4o-mini", "warning": "over 75% of the daily budget: cheaper model"},
} if {
	past(75)
	input.request.model != "gpt-4o-mini"
} else := {
	"outcome": "soft",
	"reason": "over half of the daily budget",
	"friction": {"cap_max_tokens": 64, "warning": "over half of the daily budget"},
} if {
	past(50)
}
