package control

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/costgate/costgate/gate"
)

// checkPlan refuses a tenant's plan that the running configuration (its
// last reload included) does not know while it applies limits or budgets
// by plan: the tenant would get none of them. The plan must be the
// configuration's byte for byte: another case, spaces around it or a
// look-alike letter would be another plan to the gate.
func (p *Plane) checkPlan(plan string) error {
	known, scoped := p.gate.Config().Plans()
	if !scoped || slices.Contains(known, plan) {
		return nil
	}
	list := strings.Join(known, ", ")
	if plan == "" {
		return invalid("plan is required: the configured limits and budgets apply by plan (the configuration's plans: %s)", list)
	}
	hint := ""
	for _, k := range known {
		if strings.EqualFold(strings.TrimSpace(plan), k) {
			hint = fmt.Sprintf("; did you mean %q?", k)
			break
		}
	}
	quoted := fmt.Sprintf("%q", plan)
	if !isASCII(plan) {
		quoted = fmt.Sprintf("%+q", plan) // a look-alike letter shows as \uXXXX
	}
	return invalid("plan %s is not a plan of the configuration, whose limits and budgets apply by plan: a tenant on it would get none of them (the configuration's plans: %s)%s", quoted, list, hint)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// warnUnknownPlans logs, once per tenant and plan, each control-plane
// tenant on a plan the running configuration does not know while it
// applies limits or budgets by plan: created before the API checked
// plans, or by a replica whose configuration knows the plan (a rolling
// update). A reload cannot leave one (gate.PlanClash). Such a tenant's
// requests are refused (403 plan_unknown: served, they would get none of
// a plan's limits and budgets) until a PATCH moves it. It runs on the
// poll, and looks again only when the configuration or the directory
// changed.
func (p *Plane) warnUnknownPlans() {
	cfg, v := p.gate.Config(), p.dir.Version()
	if cfg == p.planCfg && v == p.planVersion {
		return
	}
	p.planCfg, p.planVersion = cfg, v
	unknown := gate.UnknownPlans(cfg, p.dir)
	known, _ := cfg.Plans()
	for tenant := range p.planWarned {
		if _, ok := unknown[tenant]; !ok {
			delete(p.planWarned, tenant)
		}
	}
	for tenant, plan := range unknown {
		if w, ok := p.planWarned[tenant]; ok && w == plan {
			continue
		}
		p.planWarned[tenant] = plan
		p.log.Warn("control plane: a tenant is on a plan the configuration does not know, while it applies limits and budgets by plan: its requests are refused (403 plan_unknown); PATCH it onto a configured plan",
			"tenant", tenant, "plan", plan, "plans", known)
	}
}
