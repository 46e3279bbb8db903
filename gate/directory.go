package gate

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// Directory resolves the API keys the configuration file does not declare:
// the control plane's keys, managed through the admin API. Identify asks
// it for a key the configuration does not know, on the request path, so
// Lookup must answer from memory. Implementations must be safe for
// concurrent use.
type Directory interface {
	// Lookup returns the principal whose key hashes to sum and is usable
	// at now (active, not expired, not revoked, at every level), and
	// whether there is one.
	Lookup(sum [sha256.Size]byte, now time.Time) (Principal, bool)
	// Budgets returns every budget of the levels under tenant (the
	// tenant's own, its teams', users' and keys', usable or not), so that
	// the limiter store's counters of all of them are restored from the
	// ledger together.
	Budgets(tenant string) []LevelBudget
	// BudgetTenants returns the tenants that Budgets may answer for.
	BudgetTenants() []string
}

// LevelLimiter is a Directory that also returns every limit of the levels
// under a tenant, budgets and others, usable or not, as LevelBudgets: a
// held reservation that another of the tenant's keys settles on another
// replica is rebuilt with the limits of the key that made it, found there.
// A Directory without it has only the budgets of the key that reserved
// charged in that case.
type LevelLimiter interface {
	LevelLimits(tenant string) []LevelBudget
}

// LevelBudget is a level's budget with the ledger entries it counts.
type LevelBudget struct {
	Limit *LevelLimit
	// KeyIDs are the keys whose spend the budget counts (a key's own,
	// its user's or its team's keys); nil counts every entry of the
	// tenant (a tenant's budget).
	KeyIDs []string
}

// Principal is who a control-plane key belongs to, with the levels it
// falls under: its key, its user, its team and its tenant, each of which
// may carry budgets, limits and allowed models and routes.
type Principal struct {
	Tenant, Team, User, KeyID string
	// Plan is the tenant's plan: the configured limits of that plan apply
	// too. It is unset when ConfigTenant is.
	Plan string
	// ConfigTenant tells that the tenant is the config file's, not the
	// control plane's: its plan is the one the active configuration gives
	// it, and the key identifies nobody while the configuration does not
	// declare the tenant.
	ConfigTenant bool
	// Levels are the key's, the user's, the team's and the tenant's, in
	// that order; a nil entry is a level the key does not have.
	Levels [4]*Level
}

// Level is one entity's part of a request's limits (a key, a user, a team
// or a tenant of the control plane). It is immutable once built.
type Level struct {
	// Kind is key, user, team or tenant.
	Kind string
	// Name names the entity (a key's id, a user's, team's or tenant's
	// name).
	Name string
	// Models and Routes restrict what the level may use; empty allows
	// everything. A route matches itself and the paths under it.
	Models []string
	Routes []string
	// Limits are debited with the request's configured limits, in the
	// same atomic call.
	Limits []*LevelLimit

	// disabled refuses every request of the level's caller (403): a
	// control-plane tenant that is not active, named by a front door that
	// trusts its callers (Trusted).
	disabled bool
}

// LevelLimit is a budget or limit of a level, compiled for the request
// path by CompileLevelLimit.
type LevelLimit struct {
	// Entity is the id of the entity the limit belongs to, and ID the
	// limit's own id within it.
	Entity, ID string
	// Budget tells a spend cap (402 when spent) from a rate limit (429).
	Budget bool
	// SoftPercent is a budget's soft threshold (an alert), 0 for none.
	SoftPercent int
	// Period is a budget's period (day, week, month, or a rolling
	// duration such as 72h).
	Period string
	// Key is the limiter key, under the tenant's hash tag.
	Key string
	// Raised is a temporary amount in force until RaisedUntil, nil for
	// none.
	Raised      *LevelLimit
	RaisedUntil time.Time
	// Since is when a budget was last reset (its counter started anew),
	// zero for never: a restore from the ledger counts the spend from
	// then on.
	Since time.Time

	cl *compiledLimit
	// unrestored tells that the budget's counter has not counted its
	// period yet (see MarkUnrestored); safe for concurrent use.
	unrestored atomic.Bool
}

// MarkUnrestored tells that the budget's counter does not hold its
// period's spend: a budget new to a level that has spent (a budget
// renamed, added, reset, or given another period). The request that
// would debit it first brings its tenant's counters up to the ledger's
// spend (Gate.ReconcileTenant), and the requests behind it wait for that,
// so that no request is admitted on a counter that forgot the period.
// Mark a limit before the directory serves it.
func (l *LevelLimit) MarkUnrestored() {
	l.unrestored.Store(true)
	if l.Raised != nil {
		l.Raised.unrestored.Store(true)
	}
}

// Unrestored tells whether the budget's counter waits for a restore from
// the ledger (see MarkUnrestored).
func (l *LevelLimit) Unrestored() bool { return l.unrestored.Load() }

// restored clears MarkUnrestored once its counter holds the ledger's
// spend.
func (l *LevelLimit) restored() {
	l.unrestored.Store(false)
	if l.Raised != nil {
		l.Raised.unrestored.Store(false)
	}
}

// Name is the limit's name as refusals and the usage view show it:
// level/entity/limit ("team/research/day").
func (l *LevelLimit) Name() string { return l.cl.limit.Name }

// Capacity is what the limit holds: nano-dollars for a budget.
func (l *LevelLimit) Capacity() int64 { return l.cl.limit.Capacity() }

// Window is the limit's window that holds at now.
func (l *LevelLimit) Window(now time.Time) time.Duration { return l.cl.window(now) }

// WindowStart is the start of the window that holds at now: the period
// a budget alert belongs to.
func (l *LevelLimit) WindowStart(now time.Time) time.Time {
	now = now.UTC()
	if l.cl.limit.Calendar == weighted.Month {
		return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	p := l.cl.limit.Period
	return time.Unix(0, now.UnixNano()-now.UnixNano()%int64(p)).UTC()
}

// spendRange is the span of the ledger whose spend the budget's counter
// holds at now: its window (a rolling budget's last period), from its last
// reset on.
func (l *LevelLimit) spendRange(now time.Time) (from, to time.Time) {
	wl := l.cl.limit
	switch {
	case wl.Algorithm == weighted.SlidingWindow:
		from, to = now.Add(-wl.Period), now.Add(time.Nanosecond)
	case wl.Calendar == weighted.Month:
		from = l.WindowStart(now)
		to = from.AddDate(0, 1, 0)
	default:
		from = l.WindowStart(now)
		to = from.Add(wl.Period)
	}
	if l.Since.After(from) {
		from = l.Since
	}
	if !from.Before(to) { // a reset stamped ahead of this clock
		from = to.Add(-time.Nanosecond)
	}
	return from, to
}

// at is the limit in force at now.
func (l *LevelLimit) at(now time.Time) *LevelLimit {
	if l.Raised != nil && now.Before(l.RaisedUntil) {
		return l.Raised
	}
	return l
}

// LevelLimitSpec describes a level's budget or limit.
type LevelLimitSpec struct {
	// Name is level/entity/limit; it must not contain '{' or '}'.
	Name string
	// Tenant puts the limiter key under the tenant's hash tag, so that the
	// level's limits are debited with the tenant's others.
	Tenant string
	// Entity and ID name the entity and the limit (see LevelLimit).
	Entity, ID string
	// KeySuffix tells the level's counters apart (the entity, and a
	// generation that a reset advances).
	KeySuffix string
	// Budget: AmountNano per Period (day, week, month, or a Go duration
	// for a rolling window), counted from Since (its last reset; zero for
	// never).
	Budget      bool
	AmountNano  int64
	Period      string
	SoftPercent int
	Since       time.Time
	// Limit: as a configured limit (algorithm, unit, rate, period, burst).
	Limit config.LimitConfig
}

// budgetPeriods are the fixed periods of a budget; any other is a rolling
// duration.
var budgetPeriods = map[string]time.Duration{"day": 24 * time.Hour, "week": 7 * 24 * time.Hour}

// ParseBudgetPeriod checks a budget's period: day, week, month, or a
// rolling duration from 1m to weighted.MaxPeriod.
func ParseBudgetPeriod(p string) (period time.Duration, calendar bool, err error) {
	if p == "month" {
		return 0, true, nil
	}
	if d, ok := budgetPeriods[p]; ok {
		return d, false, nil
	}
	d, err := time.ParseDuration(p)
	if err != nil || d < time.Minute || d > weighted.MaxPeriod {
		return 0, false, fmt.Errorf("period %q: want day, week, month or a duration from 1m to %s", p, weighted.MaxPeriod)
	}
	return d, false, nil
}

// CompileLevelLimit builds a level's budget or limit for the request path.
// A budget of a fixed period is a fixed window in nano-dollars (a day from
// UTC midnight, a week of 7 days as the Unix epoch aligns them, a UTC
// calendar month); one of a rolling duration is a sliding window.
func CompileLevelLimit(s LevelLimitSpec) (*LevelLimit, error) {
	if strings.ContainsAny(s.Name, "{}") || strings.ContainsAny(s.KeySuffix, "{}") {
		return nil, fmt.Errorf("gate: level limit %q: '{' and '}' are not allowed", s.Name)
	}
	key := "{" + s.Tenant + "}:cg:" + s.KeySuffix
	if s.Budget {
		if s.AmountNano <= 0 {
			return nil, fmt.Errorf("gate: budget %q: the amount must be positive", s.Name)
		}
		period, calendar, err := ParseBudgetPeriod(s.Period)
		if err != nil {
			return nil, fmt.Errorf("gate: budget %q: %w", s.Name, err)
		}
		wl := weighted.Limit{Name: s.Name, Algorithm: weighted.FixedWindow, Rate: s.AmountNano, Period: period}
		switch {
		case calendar:
			wl.Calendar = weighted.Month
		case budgetPeriods[s.Period] == 0:
			wl.Algorithm = weighted.SlidingWindow
		}
		if err := wl.Validate(); err != nil {
			return nil, fmt.Errorf("gate: budget %q: %w", s.Name, err)
		}
		cl := &compiledLimit{limit: wl, unit: "usd", cost: config.Units["usd"], dimension: levelKind(s.Name),
			budget: true, period: s.Period, tagged: true, fixedKey: key}
		ll := &LevelLimit{Entity: s.Entity, ID: s.ID, Budget: true, SoftPercent: s.SoftPercent, Period: s.Period, Key: key,
			Since: s.Since, cl: cl}
		cl.level = ll
		return ll, nil
	}
	l := s.Limit
	l.Name = s.Name
	if l.Unit == "" {
		l.Unit = "requests"
	}
	cost, ok := config.Units[l.Unit]
	if !ok {
		return nil, fmt.Errorf("gate: limit %q: unknown unit %q", s.Name, l.Unit)
	}
	wl, err := l.Weighted()
	if err != nil {
		return nil, fmt.Errorf("gate: limit %q: %w", s.Name, err)
	}
	cl := &compiledLimit{limit: wl, unit: l.Unit, cost: cost, dimension: levelKind(s.Name),
		shadow: l.Mode == "shadow", failClosed: l.OnStoreFailure == "fail_closed", tagged: true, fixedKey: key}
	ll := &LevelLimit{Entity: s.Entity, ID: s.ID, Key: key, cl: cl}
	cl.level = ll
	return ll, nil
}

// levelKind is the level a limit's name starts with (key, user, team,
// tenant), which telemetry shows as its dimension.
func levelKind(name string) string {
	k, _, _ := strings.Cut(name, "/")
	return k
}

// BudgetUse is a level budget's state after a request's debit, for the
// budget alerts.
type BudgetUse struct {
	Tenant string
	Limit  *LevelLimit
	// Spent and Capacity are in nano-dollars; Spent includes the
	// estimates of requests in flight.
	Spent, Capacity int64
	// Refused tells that this budget refused the request.
	Refused bool
	At      time.Time
}

// TenantDirectory is a Directory that also holds tenants of its own (the
// control plane's, created through its API): a configuration that
// declares a tenant of the same name is refused (Apply), as the two would
// be one tenant to the ledger, the limiter and the usage API.
type TenantDirectory interface {
	Directory
	HasTenant(name string) bool
	// TenantPlan returns the plan of the control plane's tenant name, its
	// level (its budgets, limits and allowed models and routes; nil for
	// none), whether the control plane holds that tenant (known), and
	// whether the tenant is usable at now (active, not expired). It
	// answers from memory, on the request path.
	TenantPlan(name string, now time.Time) (plan string, level *Level, known, usable bool)
}

// KeyLister is a Directory that lists its keys of a tenant, so that a
// restore of the tenant's counters from the ledger (after the store lost
// them) counts every caller's budgets, not only the configuration's keys'.
type KeyLister interface {
	// TenantKeys returns every key of tenant the directory holds (revoked
	// and expired ones too: their spend counts on their user's budgets),
	// with its user and team.
	TenantKeys(tenant string) []Principal
}

// TenantClash tells which tenant of cfg d holds too, as an error naming
// the field; nil when none does.
func TenantClash(cfg *config.Config, d TenantDirectory) error {
	for i, t := range cfg.Tenants {
		if d.HasTenant(t.Name) {
			return fmt.Errorf("tenants[%d].name: tenant %q exists in the control plane (created through the admin API); a config tenant of that name would share its ledger, limits, budgets and usage: give it another name", i, t.Name)
		}
	}
	return nil
}

// PlanLister is a TenantDirectory that lists the plan of each of its
// tenants, so that a reload can be checked against them (PlanClash).
type PlanLister interface {
	TenantPlans() map[string]string
}

// PlanClash refuses a configuration that applies limits or budgets by
// plan but knows no plan some of d's tenants are on: their requests
// would be refused from the reload on (see planRefusal). It names up to
// ten of them, in order.
func PlanClash(cfg *config.Config, d PlanLister) error {
	unknown := UnknownPlans(cfg, d)
	if len(unknown) == 0 {
		return nil
	}
	var off []string
	for t, p := range unknown {
		off = append(off, fmt.Sprintf("%s (plan %q)", t, p))
	}
	slices.Sort(off)
	more := ""
	if len(off) > 10 {
		more = fmt.Sprintf(" and %d more", len(off)-10)
		off = off[:10]
	}
	known, _ := cfg.Plans()
	return fmt.Errorf("plans: the control plane's tenants %s%s are on plans this configuration does not know (its plans: %s), while it applies limits and budgets by plan: their requests would be refused; move them onto a configured plan first (PATCH /admin/v1/tenants/NAME), or keep their plans in the configuration",
		strings.Join(off, ", "), more, strings.Join(known, ", "))
}

// UnknownPlans returns d's tenants on a plan cfg does not know while it
// applies limits or budgets by plan (see planRefusal), with their plans;
// none when it does not.
func UnknownPlans(cfg *config.Config, d PlanLister) map[string]string {
	known, scoped := cfg.Plans()
	if !scoped {
		return nil
	}
	out := map[string]string{}
	for t, p := range d.TenantPlans() {
		if !slices.Contains(known, p) {
			out[t] = p
		}
	}
	return out
}

// directory holds the gate's Directory and budget observer.
type directory struct {
	dir     atomic.Pointer[Directory]
	observe atomic.Pointer[func(BudgetUse)]
}

// SetDirectory makes d resolve the keys the configuration does not
// declare; nil removes it.
func (g *Gate) SetDirectory(d Directory) {
	if d == nil {
		g.dir.dir.Store(nil)
		return
	}
	g.dir.dir.Store(&d)
}

// ObserveBudgets makes f see every level budget's state after each debit
// that includes it (f must not block); nil stops it.
func (g *Gate) ObserveBudgets(f func(BudgetUse)) {
	if f == nil {
		g.dir.observe.Store(nil)
		return
	}
	g.dir.observe.Store(&f)
}

// lookup resolves a key the configuration does not declare.
func (g *Gate) lookup(st *state, sum [sha256.Size]byte) *Caller {
	d := g.dir.dir.Load()
	if d == nil {
		return nil
	}
	p, ok := (*d).Lookup(sum, time.Now())
	if !ok {
		return nil
	}
	if p.ConfigTenant {
		plan, ok := st.tenants[p.Tenant]
		if !ok {
			return nil // the configuration no longer declares the tenant: it exists nowhere
		}
		p.Plan = plan
	}
	return &Caller{Tenant: p.Tenant, User: p.User, KeyID: p.KeyID, Plan: p.Plan, Team: p.Team, levels: p.Levels, st: st, controlPlan: !p.ConfigTenant}
}

// controlTenant gives c, a caller named by a trusted front door whose
// tenant the configuration does not declare, its control-plane tenant's
// plan and level (its budgets, limits and allowed models and routes); a
// tenant the control plane holds but that is not usable gets a level that
// refuses its every request, as its keys identify nobody.
// A tenant the control plane does not hold keeps c's plan.
func (g *Gate) controlTenant(c *Caller) {
	d := g.dir.dir.Load()
	if d == nil {
		return
	}
	td, ok := (*d).(TenantDirectory)
	if !ok {
		return
	}
	plan, level, known, usable := td.TenantPlan(c.Tenant, time.Now())
	if !known {
		return
	}
	c.Plan, c.controlPlan = plan, true
	if !usable {
		c.levels[3] = &Level{Kind: "tenant", Name: c.Tenant, disabled: true}
		return
	}
	// The tenant's own budgets, limits and lists hold whichever door its
	// requests come by, as they do for its keys.
	c.levels[3] = level
}

// Levels are the caller's control-plane levels (key, user, team, tenant;
// nil where it has none).
func (c *Caller) Levels() [4]*Level { return c.levels }

// levelRefusal refuses a request for a model or route one of its caller's
// levels does not allow (403).
func (r *Reservation) levelRefusal() (Decision, bool) {
	if d, refused := r.planRefusal(); refused {
		return d, true
	}
	for _, lv := range r.req.Caller.levels {
		if lv == nil {
			continue
		}
		if lv.disabled {
			return r.forbidden(fmt.Sprintf("the %s %q is not active", lv.Kind, lv.Name)), true
		}
		if m := r.req.Estimate.Model; len(lv.Models) > 0 && m != "" && !slices.Contains(lv.Models, m) && !slices.Contains(lv.Models, r.model) {
			return r.forbidden(fmt.Sprintf("the %s %q may not use model %q", lv.Kind, lv.Name, m)), true
		}
		if len(lv.Routes) > 0 && !slices.ContainsFunc(lv.Routes, func(p string) bool { return routeUnder(r.req.Route, p) }) {
			return r.forbidden(fmt.Sprintf("the %s %q may not use route %q", lv.Kind, lv.Name, r.req.Route)), true
		}
	}
	return Decision{}, false
}

// routeUnder tells whether route is prefix or a path under it.
func routeUnder(route, prefix string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	return route == prefix || strings.HasPrefix(route, prefix+"/")
}

// planRefusal refuses (403, plan_unknown) the request of a control-plane
// tenant whose plan the configuration does not know while it applies
// limits or budgets by plan: served, the tenant would get none of them,
// its spend bounded by nothing a plan sets. The admin API refuses such a
// plan and a reload that would leave a tenant on one (Gate.Apply), but a
// control plane's database written before, restored from a backup, or a
// Directory of one's own may still name one. A config tenant's plan is
// the configuration's own word, and never refused.
func (r *Reservation) planRefusal() (Decision, bool) {
	c := r.req.Caller
	if !c.controlPlan || r.st.plans == nil || r.st.plans[c.Plan] {
		return Decision{}, false
	}
	r.outcome, r.answer = telemetry.OutcomeHard, http.StatusForbidden
	return refusal(telemetry.OutcomeHard, http.StatusForbidden, Error{Type: "permission_denied", Code: "plan_unknown",
		Message: fmt.Sprintf("the tenant %q is on plan %q, which costgate's configuration does not know while it applies its limits and budgets by plan: its requests are refused rather than served with none of them; an operator moves the tenant onto a configured plan (PATCH /admin/v1/tenants/%s)", c.Tenant, c.Plan, c.Tenant)}), true
}

func (r *Reservation) forbidden(msg string) Decision {
	r.outcome, r.answer = telemetry.OutcomeHard, http.StatusForbidden
	return refusal(telemetry.OutcomeHard, http.StatusForbidden, Error{Type: "permission_denied", Code: "not_allowed", Message: msg})
}

// collectLevels adds the caller's level limits to the request's items.
func (r *Reservation) collectLevels() {
	if r.req.ExtraOnly {
		return
	}
	now := r.start
	for _, lv := range r.req.Caller.levels {
		if lv == nil {
			continue
		}
		for _, ll := range lv.Limits {
			l := ll.at(now).cl
			r.unrestored = r.unrestored || ll.unrestored.Load()
			r.limits = append(r.limits, l)
			r.items = append(r.items, weighted.Item{Limit: l.limit, Key: l.fixedKey, Cost: r.reserved(l)})
		}
	}
}

// observeLevels shows the level budgets' states after the debit to the
// budget observer.
func (r *Reservation) observeLevels(d Decision) {
	f := r.g.dir.observe.Load()
	if f == nil || len(r.result.Items) != len(r.limits) {
		return
	}
	for i, l := range r.limits {
		if l.level == nil || !l.budget {
			continue
		}
		st := r.result.Items[i]
		spent := st.Capacity - st.Remaining
		refused := !d.Allowed() && r.blocked == l
		if refused {
			spent = st.Capacity
		}
		(*f)(BudgetUse{Tenant: r.req.Caller.Tenant, Limit: l.level, Spent: spent, Capacity: st.Capacity, Refused: refused, At: r.start})
	}
}

// levelStates appends the caller's level limits to a usage view's items.
func (c *Caller) levelItems(now time.Time, items []weighted.Item, ls []*compiledLimit) ([]weighted.Item, []*compiledLimit) {
	for _, lv := range c.levels {
		if lv == nil {
			continue
		}
		for _, ll := range lv.Limits {
			l := ll.at(now).cl
			items = append(items, weighted.Item{Limit: l.limit, Key: l.fixedKey})
			ls = append(ls, l)
		}
	}
	return items, ls
}

// PeekLevel is the state of one level limit, changing nothing: for the
// admin API and the dashboard.
func (g *Gate) PeekLevel(ctx context.Context, lls []*LevelLimit) ([]LimitState, error) {
	if len(lls) == 0 {
		return nil, nil
	}
	now := time.Now()
	items := make([]weighted.Item, len(lls))
	for i, ll := range lls {
		l := ll.at(now).cl
		items[i] = weighted.Item{Limit: l.limit, Key: l.fixedKey}
	}
	res, err := g.store.Peek(ctx, items)
	if err != nil {
		return nil, err
	}
	out := make([]LimitState, len(lls))
	for i, ll := range lls {
		l := ll.at(now).cl
		it := res.Items[i]
		out[i] = LimitState{Name: l.limit.Name, Unit: l.unit, Dimension: l.dimension, Key: l.fixedKey,
			Allowed: it.Allowed, Capacity: it.Capacity, Remaining: it.Remaining, Window: l.window(now),
			ResetAfter: it.ResetAfter, Budget: l.budget, Shadow: l.shadow}
	}
	return out, nil
}
