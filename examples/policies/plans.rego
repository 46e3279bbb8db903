# METADATA
# title: Plans
# description: |
#   Token and spend quotas of the free, pro and enterprise plans.
#   - An unknown plan is refused (403).
#   - Output tokens are capped per request at the plan's cap (friction).
#   - A token limit that cannot cover the request's estimate refuses free
#     (429), delays pro, and only warns enterprise.
#   - The plan's monthly spend quota refuses free (402), downgrades pro to a
#     cheaper model (or slows it down when there is none), and only warns
#     enterprise.
package costgate.policies.plans

# Quotas per plan. Money in nano-dollars (1 USD = 1000000000).
plans := {
	"free": {"max_output_tokens": 1024, "month_quota_nano_usd": 5000000000},
	"pro": {"max_output_tokens": 8192, "month_quota_nano_usd": 500000000000},
	"enterprise": {"max_output_tokens": 32768, "month_quota_nano_usd": 20000000000000},
}

downgrades := {
	"gpt-4o": "gpt-4o-mini",
	"gpt-4.1": "gpt-4.1-mini",
	"claude-sonnet-4-5": "claude-haiku-4-5",
	"claude-opus-4-1": "claude-sonnet-4-5",
}

plan := plans[input.caller.plan]

estimated_tokens := input.estimate.input_tokens + input.estimate.output_tokens

# A token limit that the request's estimate would overdraw.
tokens_short if {
	some l in input.limits
	l.unit == "tokens"
	l.remaining < estimated_tokens
}

month_spent if {
	some s in input.spend
	s.scope == "tenant"
	s.period == "month"
	s.spent_nano_usd + input.estimate.cost_nano_usd > plan.month_quota_nano_usd
}

# The client of a model asked for more output than the plan allows, or for
# no cap at all.
over_token_cap if {
	input.request.model != ""
	input.request.max_output_tokens > plan.max_output_tokens
}

over_token_cap if {
	input.request.model != ""
	input.request.max_output_tokens == 0
}

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 403, "reason": sprintf("unknown plan %q", [input.caller.plan])} if {
	not plan
} else := {"outcome": "hard", "status": 429, "reason": "the free plan's token limit is reached"} if {
	input.caller.plan == "free"
	tokens_short
} else := {"outcome": "hard", "status": 402, "reason": "the free plan's monthly quota is spent"} if {
	input.caller.plan == "free"
	month_spent
} else := {
	"outcome": "soft",
	"reason": "the pro plan's monthly quota is spent: cheaper model",
	"friction": pro_over_quota_friction,
} if {
	input.caller.plan == "pro"
	month_spent
} else := {
	"outcome": "soft",
	"reason": "the pro plan's token limit is reached: slowed down",
	"friction": {"delay_ms": 750, "cap_max_tokens": plan.max_output_tokens},
} if {
	input.caller.plan == "pro"
	tokens_short
} else := {
	"outcome": "soft",
	"reason": "the enterprise plan's quota is exceeded",
	"friction": {"warning": "enterprise quota exceeded: usage above quota is billed as overage"},
} if {
	input.caller.plan == "enterprise"
	enterprise_over
} else := {
	"outcome": "soft",
	"reason": "output tokens capped at the plan's maximum",
	"friction": {"cap_max_tokens": plan.max_output_tokens},
} if {
	over_token_cap
}

# Over its quota, pro moves to a cheaper model, or is slowed down when the
# model has no cheaper sibling.
pro_over_quota_friction := {"downgrade_model": m, "cap_max_tokens": plan.max_output_tokens} if {
	m := downgrades[input.request.model]
} else := {"delay_ms": 1000, "cap_max_tokens": plan.max_output_tokens}

enterprise_over if month_spent

enterprise_over if tokens_short
