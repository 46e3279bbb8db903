# Exact and inexact division and signed remainders: a quarter of the input
# tokens is an integer for one input in four.
package costgate.policies.division

quarter := input.estimate.input_tokens / 4

signed_rem := (0 - input.estimate.input_tokens) % 7

decision := {"outcome": "soft", "reason": sprintf("quarter %d rem %d %v", [quarter, signed_rem, quarter]), "friction": {"delay_ms": signed_rem + 7}} if {
	quarter > 100
	quarter < 1000
}
