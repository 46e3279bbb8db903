# Array and set comprehensions: counts with and without repeats, membership,
# iteration over the result, equality of built arrays, outer bindings.
package costgate.policies.comprehension

low := [l.name | some l in input.limits; l.remaining < 10]

low_units := {l.unit | some l in input.limits; l.remaining < 1000}

remaining := [l.remaining | some l in input.limits]

scopes_over(pct) := {s.scope | some s in input.spend; s.spent_nano_usd * 100 >= s.budget_nano_usd * pct}

decision := {"outcome": "soft", "reason": sprintf("%d low, %d units", [count(low), count(low_units)]), "friction": {"warning": sprintf("%d", [count(low)])}} if {
	count(low) > 1
} else := {"outcome": "soft", "reason": "tokens low", "friction": {"delay_ms": 5}} if {
	"tokens" in low_units
	some r in remaining
	r < 0
} else := {"outcome": "hard", "status": 402, "reason": "over"} if {
	count(scopes_over(90)) >= 2
	[x | some x in remaining] == remaining
	remaining[0] >= 0
}
