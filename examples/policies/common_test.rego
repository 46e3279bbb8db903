# Helpers shared by the example policies' tests.
package costgate.testing

base := {
	"caller": {"tenant": "acme", "user": "u1", "key_id": "k1", "plan": "pro", "ip": "198.51.100.7", "region": "eu"},
	"request": {"route": "chat", "upstream": "openai", "model": "gpt-4o", "stream": false, "max_output_tokens": 1000, "page": 0},
	"estimate": {"input_tokens": 500, "output_tokens": 1000, "cost_nano_usd": 12500000},
	"limits": [],
	"spend": [],
	"time": {"unix": 1764500000, "hour": 10, "weekday": 1},
}

# input with the given caller, request and estimate fields replaced, and
# the given limits and spend.
input_with(caller, request, limits, spend) := object.union(base, {
	"caller": object.union(base.caller, caller),
	"request": object.union(base.request, request),
	"limits": limits,
	"spend": spend,
})

tokens_limit(remaining) := {"name": "tokens_per_minute", "unit": "tokens", "limit": 100000, "remaining": remaining, "reset_seconds": 30}

ip_limit(limit, remaining) := {"name": "per_ip", "unit": "requests", "limit": limit, "remaining": remaining, "reset_seconds": 60}

spend(scope, period, spent, budget) := {"scope": scope, "period": period, "spent_nano_usd": spent, "budget_nano_usd": budget}
