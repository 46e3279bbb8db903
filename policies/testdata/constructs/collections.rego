# Exercises iteration, partial sets, membership, count, not, several
# definitions of one rule, and lookups in constant tables.
package costgate.policies.collections

import rego.v1

premium := {"gpt-4o", "o3", "claude-opus-4-1"}

weights := {"tokens": 1, "requests": 100, "usd": 1000}

names contains l.name if some l in input.limits

low contains l if {
	some l in input.limits
	l.remaining * weights[l.unit] < 1000
}

busy if count(input.limits) >= 3

busy if count(input.spend) >= 3

decision := {"outcome": "hard", "status": 403, "reason": "premium model on a busy key"} if {
	input.request.model in premium
	busy
	not input.caller.plan == "enterprise"
}

decision := {"outcome": "hard", "status": 403, "reason": "premium model on a busy key"} if {
	input.request.model in premium
	"per_ip" in names
	some l in low
	l.name == "per_ip"
}

shadow_decision := {"outcome": "soft", "reason": "low", "friction": {"warning": sprintf("a low limit of %d: %s", [count(input.limits), l.name])}} if {
	some l in low
}
