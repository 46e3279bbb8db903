package gate

import (
	"maps"

	"github.com/costgate/costgate/policies"
)

// policies is the set the pipeline decides with: the configured policies
// with the promotions applied.
func (st *state) policies() *policies.Set {
	if p := st.promoted.Load(); p != nil {
		return p
	}
	return st.policy
}

// SetPromotions enforces the shadow policies of promoted (policy id to
// the SHA-256 of the source it was promoted for, see
// policies.PolicyInfo.SourceSHA256) from now on and after every Apply,
// while the loaded source has that digest; a policy whose source differs
// stays in shadow, and is logged. The control plane calls it with what
// its database holds. Safe for concurrent use.
func (g *Gate) SetPromotions(promoted map[string]string) {
	g.promoMu.Lock()
	defer g.promoMu.Unlock()
	if maps.Equal(promoted, g.promotion) {
		return
	}
	g.promotion = maps.Clone(promoted)
	g.promote(g.state.Load())
}

// promote applies g.promotion to st. The caller holds promoMu.
func (g *Gate) promote(st *state) {
	if st.policy == nil {
		if len(g.promotion) > 0 {
			g.log.Warn("policies promoted, but no policy is configured", "promoted", len(g.promotion))
		}
		return
	}
	for _, id := range st.policy.Drifted(g.promotion) {
		g.log.Warn("policy promoted for another source: it stays as its files declare it",
			"policy", id, "promoted_sha256", g.promotion[id])
	}
	if len(g.promotion) == 0 {
		st.promoted.Store(nil)
		return
	}
	st.promoted.Store(st.policy.Promote(g.promotion))
}

// Policies is the active policy set, promotions applied; nil when no
// policy is configured. It must not be modified.
func (g *Gate) Policies() *policies.Set { return g.state.Load().policies() }
