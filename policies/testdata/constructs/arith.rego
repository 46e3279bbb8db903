# Exercises the fast path's arithmetic and comparisons against the general
# evaluator: overflow, exact and inexact division, remainders, negatives.
package costgate.policies.arith

total := input.estimate.input_tokens + input.estimate.output_tokens

per_token := input.estimate.cost_nano_usd / total

half := input.estimate.output_tokens % 2

decision := {"outcome": "hard", "status": 429, "reason": sprintf("%d tokens at %d each", [total, per_token])} if {
	per_token > 1000
} else := {"outcome": "soft", "reason": sprintf("odd %v %s %d", [half == 1, input.caller.plan, total * total]), "friction": {"delay_ms": half + 1}} if {
	total * total > 1000000
	half == 1
} else := {"outcome": "soft", "reason": "negative", "friction": {"cap_max_tokens": 0 - input.estimate.output_tokens}} if {
	input.estimate.output_tokens < 0
}
