# A policy whose two definitions can disagree: the general evaluator reports
# a conflict error, and the fast path must hand such inputs over to it.
package costgate.policies.conflict

decision := {"outcome": "soft", "reason": "route", "friction": {"delay_ms": 10}} if input.request.route == "web"

decision := {"outcome": "soft", "reason": "stream", "friction": {"delay_ms": 10}} if {
	input.request.stream
	input.caller.region == "us"
}

decision := {"outcome": "hard", "status": 403, "reason": s.scope} if {
	some s in input.spend
	s.spent_nano_usd < 0
}
