# count of partial sets whose members repeat: the distinct members count.
package costgate.policies.counts

units contains l.unit if some l in input.limits

spends contains s if some s in input.spend

decision := {"outcome": "soft", "reason": sprintf("%d units %d spends", [count(units), count(spends)]), "friction": {"delay_ms": count(units)}} if count(units) > 1
