# Exercises constant arrays, sets and objects (with string and number keys),
# lookups and iteration over them, partial set lookups, iteration over an
# object built at evaluation time, and an ill-formed shadow decision.
package costgate.policies.tables

tiers := ["bronze", "silver", "gold"]

hours := {9, 10, 11, 12, 13, 14, 15, 16, 17}

weekday_names := {0: "sun", 6: "sat"}

region_delay := {"eu": 10, "us": 20, "": 50}

tier := tiers[input.request.page % 3] if input.request.page >= 0

default business_hours := false

business_hours if hours[input.time.hour]

default weekend := false

weekend if weekday_names[input.time.weekday]

units contains u if {
	some l in input.limits
	u := l.unit
}

has_tokens_limit if units.tokens

delays := {"region": region_delay[input.caller.region], "tier": count(tier)}

max_delay := d if {
	some k, d in delays
	k == "region"
}

some_tier if {
	some i, t in tiers
	t == tier
	i >= 0
}

some_hour if {
	some h in hours
	h == input.time.hour
}

decision := {"outcome": "soft", "reason": sprintf("%s %v %v %d", [tier, business_hours, weekend, delays.tier]), "friction": {"delay_ms": max_delay}} if {
	some_tier
	some_hour
	not weekend
	has_tokens_limit
} else := {"outcome": "soft", "reason": "weekend", "friction": {"warning": weekday_names[input.time.weekday]}} if {
	weekend
	input.caller.plan != "enterprise"
}

shadow_decision := {"outcome": "soft", "reason": "limit", "friction": {"warning": "w"}, "limit": l} if {
	some l in input.limits
	l.name == "rpm"
	l.remaining == 0
}
