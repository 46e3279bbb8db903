# METADATA
# title: Per-IP abuse (shadow)
# description: |
#   A candidate rule, run in shadow to see whom it would hit before it is
#   enforced: refuse (429) an IP that has used nine tenths of its per-IP
#   request limit, or that comes from an unknown region while already past
#   half of it. Internal and monitoring networks are exempt.
# custom:
#   shadow: true
package costgate.policies.ip_abuse

# Networks that are never treated as abusive.
exempt := ["10.0.0.0/8", "192.168.0.0/16"]

exempt_ip if {
	some c in exempt
	net.cidr_contains(c, input.caller.ip)
}

ip_limits contains l if {
	some l in input.limits
	l.name == "per_ip"
	l.limit > 0
}

nearly_exhausted if {
	some l in ip_limits
	l.remaining * 10 < l.limit
}

half_used if {
	some l in ip_limits
	l.remaining * 2 < l.limit
}

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 429, "reason": sprintf("IP %s sends too many requests", [input.caller.ip])} if {
	input.caller.ip != ""
	not exempt_ip
	nearly_exhausted
} else := {"outcome": "hard", "status": 429, "reason": "IP of unknown region is past half its limit"} if {
	input.caller.region == ""
	input.caller.ip != ""
	not exempt_ip
	half_used
}
