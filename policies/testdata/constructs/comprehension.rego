# Comprehensions are not compiled by the fast path: this policy runs on the
# general evaluator, beside fast ones.
package costgate.policies.comprehension

low := [l.name | some l in input.limits; l.remaining < 10]

decision := {"outcome": "soft", "reason": "low", "friction": {"warning": sprintf("%d low limits", [count(low)])}} if count(low) > 1
