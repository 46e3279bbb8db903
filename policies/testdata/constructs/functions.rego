# Exercises user functions (tests, outputs, else chains, nested calls) and
# every, with and without a key.
package costgate.policies.functions

over(s, pct) if s.spent_nano_usd * 100 >= s.budget_nano_usd * pct

over_any(pct) if {
	some s in input.spend
	over(s, pct)
}

level(s) := 100 if s.spent_nano_usd >= s.budget_nano_usd
else := 90 if over(s, 90)
else := 0

double(x) := x * 2

decision := {"outcome": "soft", "reason": sprintf("%d", [double(input.request.page)]), "friction": {"delay_ms": 1}} if {
	count(input.limits) > 0
	every l in input.limits { l.remaining > 0 }
	over_any(80)
} else := {"outcome": "hard", "status": 402, "reason": "levels"} if {
	every k, s in input.spend {
		k >= 0
		level(s) == 100
	}
	count(input.spend) > 1
}

shadow_decision := {"outcome": "soft", "reason": "level", "friction": {"delay_ms": level(s)}} if {
	some s in input.spend
	over(s, 80)
}
