# Exercises string and object builtins: lower, upper, trim_space, abs and
# object.get on constant tables, input objects and built objects.
package costgate.policies.strings

aliases := {"GPT-4O": "gpt-4o", " o3 ": "o3"}

model := object.get(aliases, input.request.model, lower(trim_space(input.request.model)))

limit_name(l) := upper(object.get(l, "name", "none"))

info := {"m": model, "d": abs(input.estimate.output_tokens - input.estimate.input_tokens)}

decision := {"outcome": "soft", "reason": sprintf("%s %d %s", [object.get(info, "m", "?"), info.d, limit_name(l)]), "friction": {"warning": "w"}} if {
	startswith(model, "gpt")
	some l in input.limits
	object.get(l, "unit", "") == "tokens"
	object.get(l, "missing", 7) == 7
	l.remaining < 100
}
