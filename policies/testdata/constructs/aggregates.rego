# sum, max and min over comprehensions (with repeats in sets), constant
# arrays and sets, empty collections.
package costgate.policies.aggregates

spent := [s.spent_nano_usd | some s in input.spend]

units := {l.unit | some l in input.limits}

remaining_set := {l.remaining | some l in input.limits}

decision := {"outcome": "soft", "reason": sprintf("%d %d %d %s %d", [sum(spent), max(spent), min(spent), max(units), sum(remaining_set)]), "friction": {"delay_ms": 1}} if {
	sum(spent) > 0
	max([1, 5, 3]) == 5
	min({4, 2}) == 2
} else := {"outcome": "hard", "status": 429, "reason": min(units)} if {
	not max(spent)
	count(units) > 0
}
