# The learned output estimate: a reservation learned from few samples is
# slowed down; one at the request's own limit under a quantile warns.
package costgate.policies.learned

decision := {"outcome": "soft", "reason": sprintf("%s of %d samples: %d tokens", [input.estimate.output_quantile, input.estimate.output_samples, input.estimate.output_tokens]), "friction": {"delay_ms": 1}} if {
	input.estimate.output_basis == "learned"
	input.estimate.output_samples < 1000
} else := {"outcome": "hard", "status": 429, "reason": "no estimate yet"} if {
	input.estimate.output_basis == "limit"
	input.estimate.output_quantile != ""
	input.estimate.output_samples < 100
	input.estimate.output_tokens > 4000
}
