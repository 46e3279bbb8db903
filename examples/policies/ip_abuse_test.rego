package costgate.policies.ip_abuse_test

import data.costgate.policies.ip_abuse
import data.costgate.testing.input_with
import data.costgate.testing.ip_limit
import data.costgate.testing.tokens_limit

test_quiet_ip_allowed if {
	ip_abuse.decision == {"outcome": "allow"} with input as input_with({}, {}, [ip_limit(100, 50)], [])
}

test_nearly_exhausted_ip if {
	d := ip_abuse.decision with input as input_with({}, {}, [tokens_limit(5), ip_limit(100, 9)], [])
	d.status == 429
	contains(d.reason, "198.51.100.7")
}

test_tenth_left_is_not_yet_abuse if {
	ip_abuse.decision == {"outcome": "allow"} with input as input_with({}, {}, [ip_limit(100, 10)], [])
}

test_unknown_region_half_used if {
	d := ip_abuse.decision with input as input_with({"region": ""}, {}, [ip_limit(100, 49)], [])
	d.status == 429
	ip_abuse.decision == {"outcome": "allow"} with input as input_with({"region": "eu"}, {}, [ip_limit(100, 49)], [])
}

test_other_limits_ignored if {
	ip_abuse.decision == {"outcome": "allow"} with input as input_with({}, {}, [tokens_limit(0)], [])
}

test_exempt_networks if {
	every ip in ["10.1.2.3", "192.168.0.9"] {
		ip_abuse.decision == {"outcome": "allow"} with input as input_with({"ip": ip, "region": ""}, {}, [ip_limit(100, 0)], [])
	}
	d := ip_abuse.decision with input as input_with({"ip": "11.1.2.3"}, {}, [ip_limit(100, 0)], [])
	d.status == 429
}
