package gate

// Other models: a request may make models besides its own run and bill
// (an Anthropic advisor tool's sub-inferences, its fallbacks: see
// costmodel.Usage.Steps). A limit keyed by model applies to each of them:
// the reservation holds, beside the limit's item of the request's model,
// one item of each other model, keyed by that model and reserving its
// steps' share of the estimate in the limit's unit (a request counts once
// on each model's key), debited with the others all or nothing. The
// settlement charges each the usage the answer's steps of its model
// report; a model that ran none gets its reservation back. The item of the
// request's own model counts the whole request, as it did before: what
// the steps' models ran is charged there too, so that a limit of the
// request's model never counts less than the same limit without an
// advisor. The item of "default" fallbacks (costmodel.DefaultFallbacks,
// the model's own, which the request does not name) is charged the steps
// of the models the request did not name. Each other model's item is made
// by a copy of the limit that
// names the model (compiledLimit.model); a request without other models
// makes none.

import (
	"slices"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/weighted"
)

// collectOthers adds to the reservation's items one of model-keyed limit
// l for each other model the request may run, after l's own.
func (r *Reservation) collectOthers(l *compiledLimit) {
	var seen []string
	for name := range r.req.Estimate.Usage.Steps.All() {
		m := r.st.est.Canonical(name)
		if m == r.model || slices.Contains(seen, m) {
			continue
		}
		seen = append(seen, m)
		o := *l
		o.model = m
		r.limits = append(r.limits, &o)
		cost := r.otherCost(&o, r.req.Estimate.Usage, 0)
		if r.req.Open {
			cost = max(cost, 1)
		}
		r.items = append(r.items, weighted.Item{Limit: o.limit, Key: o.key(r), Cost: cost})
	}
}

// otherCost is what usage u costs on o, a limit's item of another model
// (o.model): the usage of u's steps of that model (see ranFor), each
// priced at its model's price, in o's unit (requests: the request's, once
// that model ran). A model no step of u names costs nothing. A u that
// names no step's model (an answer that did not say which model ran what)
// costs what all of it costs at o's model, at most reserved, what o's
// item reserved: the other model may have run any of it.
func (r *Reservation) otherCost(o *compiledLimit, u costmodel.Usage, reserved int64) int64 {
	if u.Steps == nil {
		return min(reserved, o.costOf(r.req.Requests, u, r.st.est.Cost(o.model, u)))
	}
	var su costmodel.Usage
	var cost costmodel.NanoUSD
	ran := false
	for name, s := range u.Steps.All() {
		if !r.ranFor(o, r.st.est.Canonical(name)) {
			continue
		}
		s.ServiceTier, s.InferenceGeo, s.Speed = u.ServiceTier, u.InferenceGeo, u.Speed
		su, cost, ran = addUsage(su, s), costmodel.AddSat(cost, r.st.est.Cost(name, s)), true
	}
	if !ran {
		return 0
	}
	return o.costOf(r.req.Requests, su, cost)
}

// ranFor tells whether the steps of model m (canonical) count on o, a
// limit's item of another model: m is o's model; or o's is
// costmodel.DefaultFallbacks and m is a model the request did not name
// (not its own, nor another model's of o's limit), one the model's own
// fallbacks chose.
func (r *Reservation) ranFor(o *compiledLimit, m string) bool {
	switch {
	case m == o.model:
		return true
	case o.model != costmodel.DefaultFallbacks || m == r.model:
		return false
	}
	for _, l := range r.limits {
		if l.model == m && l.limit.Name == o.limit.Name {
			return false
		}
	}
	return true
}
