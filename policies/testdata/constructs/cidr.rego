# Exercises net.cidr_contains with IP addresses, CIDRs and garbage as its
# second operand. In shadow, so that garbage (an error) is recorded rather
# than failing every decision.
# METADATA
# custom:
#   shadow: true
package costgate.policies.cidr

internal := ["10.0.0.0/8", "198.51.100.0/24", "2001:db8::/32", "not a cidr"]

internal_ip if {
	some c in internal
	c != "not a cidr"
	net.cidr_contains(c, input.caller.ip)
}

decision := {"outcome": "soft", "reason": "internal", "friction": {"warning": "internal"}} if {
	input.caller.region != "us"
	internal_ip
}

shadow_decision := {"outcome": "hard", "status": 403, "reason": "bad"} if {
	input.caller.region == "us"
	net.cidr_contains("203.0.113.0/24", input.caller.ip)
}
