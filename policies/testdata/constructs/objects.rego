# Several solutions building equal objects are one value, different objects
# a conflict: both evaluators must agree on which is which. In shadow, so
# that its conflicts are recorded rather than failing every decision.
# METADATA
# custom:
#   shadow: true
package costgate.policies.objects

limit_unit := {"unit": l.unit, "n": 1} if {
	some l in input.limits
	l.remaining < 50000
}

decision := {"outcome": "soft", "reason": limit_unit.unit, "friction": {"delay_ms": limit_unit.n}}
