# METADATA
# title: Bench (a copy of the quickstart rule)
# description: |
#   A copy of the quickstart policy for the proxy load benchmark
#   (bench/proxy.sh): 403 for a model the free plan may not use, 402 when the
#   tenant's daily budget is spent, allow otherwise. The benchmark's tenant
#   is on the free plan and asks for gpt-4o-mini, so every rule is evaluated
#   and the answer is allow.
package costgate.policies.bench

default decision := {"outcome": "allow"}

decision := {
	"outcome": "hard",
	"status": 403,
	"reason": sprintf("the free plan may not use model %q; use gpt-4o-mini, gpt-4.1-nano or a claude haiku model", [input.request.model]),
} if {
	input.caller.plan == "free"
	input.request.model != ""
	not free_model
} else := {
	"outcome": "hard",
	"status": 402,
	"reason": "the tenant's daily budget is spent",
} if {
	some s in input.spend
	s.scope == "tenant"
	s.period == "day"
	s.budget_nano_usd > 0
	s.spent_nano_usd >= s.budget_nano_usd
}

# free_model holds for the models of the free plan, with or without a date
# suffix (gpt-4o-mini-2024-07-18, claude-3-5-haiku-20241022).
free_model if input.request.model in {"gpt-4o-mini", "gpt-4.1-nano"}

free_model if startswith(input.request.model, "gpt-4o-mini-")

free_model if startswith(input.request.model, "gpt-4.1-nano-")

free_model if {
	startswith(input.request.model, "claude-")
	contains(input.request.model, "haiku")
}
