package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Decision is one decision on one request, as the proxy reports it.
type Decision struct {
	Tenant    string // tenant id; folded into "other" past Config.MaxTenants
	Route     string // route name from the config
	Model     string // requested model (span attribute only)
	Policy    string // the deciding policy, "" when none decided
	Limit     string // the deciding (most constraining) limit, "" when none
	Dimension string // the limit's key dimension that fired (tenant, user, ip, ...)
	Outcome   Outcome
	Status    int    // HTTP status answered: 200, 429, 402, 403, 503 (fail-closed store outage), ...
	Key       string // the limit key that throttled, for TopThrottled (cut at MaxKeyLen bytes); never a metric label
	// Shadow marks the verdict of a shadow-mode limit or policy: it was not
	// enforced. A shadow Decision with an Outcome other than "allow" counts
	// as a would-block (as ShadowWouldBlock does) and is not counted as a
	// request, a block or a throttled key; a shadow "allow" records nothing.
	Shadow bool
}

// Stages of a request, for Stage.
const (
	StageIdentify = "identify"
	StageEstimate = "estimate"
	StageDebit    = "debit"
	StagePolicy   = "policy"
	StageLedger   = "ledger"
	StageUpstream = "upstream"
	StageSettle   = "settle"
	StageTotal    = "total"
)

var stageNames = [...]string{StageIdentify, StageEstimate, StageDebit, StagePolicy, StageLedger, StageUpstream, StageSettle, StageTotal, Other}

const numStages = len(stageNames)

func stageID(s string) int {
	switch s {
	case StageIdentify:
		return 0
	case StageEstimate:
		return 1
	case StageDebit:
		return 2
	case StagePolicy:
		return 3
	case StageLedger:
		return 4
	case StageUpstream:
		return 5
	case StageSettle:
		return 6
	case StageTotal:
		return 7
	}
	return numStages - 1
}

// StoreOp is a limiter store operation, the op label of
// costgate.store.duration. The set is closed: any other value is recorded
// as "other".
type StoreOp string

// Limiter store operations, for Telemetry.StoreOp.
const (
	StoreDebit   StoreOp = "debit"   // reserve a request's estimate
	StoreSettle  StoreOp = "settle"  // charge or refund the actual cost
	StoreCancel  StoreOp = "cancel"  // return a whole reservation
	StorePeek    StoreOp = "peek"    // read limits without debiting
	StoreRenew   StoreOp = "renew"   // extend a concurrency lease
	StoreReset   StoreOp = "reset"   // empty limits (an operator's reset)
	StoreRestore StoreOp = "restore" // bring budget counters up to the ledger
)

var storeOps = [...]StoreOp{StoreDebit, StoreSettle, StoreCancel, StorePeek, StoreRenew, StoreReset, StoreRestore, Other}

const numStoreOps = len(storeOps)

func storeOpID(op StoreOp) int {
	for i, o := range storeOps[:numStoreOps-1] {
		if o == op {
			return i
		}
	}
	return numStoreOps - 1
}

var storeResultNames = [...]string{"ok", "error", "timeout"}

const numStoreResults = len(storeResultNames)

// BreakerState is the state of the limiter store's circuit breaker, the
// state label of costgate.store.breaker.state.
type BreakerState string

// Breaker states, for ObserveBreaker.
const (
	BreakerClosed   BreakerState = "closed"    // calls go through
	BreakerOpen     BreakerState = "open"      // calls fail at once
	BreakerHalfOpen BreakerState = "half_open" // one probe call at a time
)

var breakerStates = [...]BreakerState{BreakerClosed, BreakerOpen, BreakerHalfOpen}

// ReconcileTrigger is why a tenant's budget counters were brought up to
// the ledger, the trigger label of costgate.budget.reconcile.
type ReconcileTrigger string

// Reconcile triggers, for Reconcile.
const (
	// ReconcileScheduled is the proxy's reconciliation: at start, every
	// store.reconcile_interval and when the store's breaker closes.
	ReconcileScheduled ReconcileTrigger = "reconcile"
	// ReconcileStale is a restore of counters the store found stale (a
	// Redis that lost its data, a new local fallback).
	ReconcileStale ReconcileTrigger = "stale"
)

var reconcileTriggers = [...]ReconcileTrigger{ReconcileScheduled, ReconcileStale}

// StoreStats are the limiter store's own counts of calls that got no
// decision, since it started (see weighted.RedisStats).
type StoreStats struct {
	Overloaded      int64 // calls not sent: they waited their queue's timeout
	UnknownOutcomes int64 // calls sent whose callers left without a reply
	LateCancels     int64 // of those, debits admitted late and then cancelled
	LateLost        int64 // of those, calls that never got a reply
}

type budgetKey struct{ limit, tenant int }

type reqKey struct{ policy, outcome, status, route int }
type blockKey struct{ policy, limit, dim, status int }
type allowKey struct{ policy, limit, dim, outcome int }
type shadowAttrKey struct{ policy, limit, tenant int }

// Attribute keys.
const (
	attrTenant    = attribute.Key("tenant")
	attrPolicy    = attribute.Key("policy")
	attrLimit     = attribute.Key("limit")
	attrDimension = attribute.Key("dimension")
	attrOutcome   = attribute.Key("outcome")
	attrStatus    = attribute.Key("status")
	attrRoute     = attribute.Key("route")
	attrStage     = attribute.Key("stage")
	attrOp        = attribute.Key("op")
	attrResult    = attribute.Key("result")
	attrState     = attribute.Key("state")
	attrTrigger   = attribute.Key("trigger")
	attrTokenType = attribute.Key("gen_ai.token.type")
	attrModel     = attribute.Key("gen_ai.request.model")
)

// Histogram bucket bounds. Durations are in seconds, from 5 µs (an in-memory
// debit) to 60 s (a long streamed completion).
var (
	durationBounds = []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// tokenBounds are the OpenTelemetry GenAI semantic conventions' advice
	// for gen_ai.client.token.usage.
	tokenBounds = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

type tenantCells struct{ spend, tokensIn, tokensOut *sumCell }
type modelCells struct{ in, out *histCell }

// cells creates the counter and histogram families, served by p (see
// cells.go), and the caches of their cells.
func (t *Telemetry) cells(p *producer) {
	sum := func(name, unit, desc string) *sumFamily {
		f := &sumFamily{name: name, unit: unit, desc: desc}
		p.sums = append(p.sums, f)
		return f
	}
	hist := func(name, unit, desc string, bounds []float64, scale float64) *histFamily {
		f := newHistFamily(name, unit, desc, bounds, scale)
		p.hists = append(p.hists, f)
		return f
	}
	requests := sum("costgate.requests", "{request}", "Enforced decisions, by policy, outcome, HTTP status and route.")
	blocked := sum("costgate.decisions.blocked", "{request}", "Requests refused (outcome hard), by deciding policy, limit, key dimension and status.")
	allowed := sum("costgate.decisions.allowed", "{request}", "Requests admitted (outcome allow or soft), by deciding policy, most constraining limit, its key dimension and outcome.")
	failOpen := sum("costgate.failopen", "{request}", "Decisions admitted without the limiter store because a fail-open limit could not reach it, by limit.")
	shadow := sum("costgate.shadow.would_block", "{request}", "Decisions a shadow-mode policy or limit would have refused or slowed, by policy, limit and tenant.")
	spend := sum("costgate.spend", "nano_usd", "Spend settled, in nano-US-dollars, by tenant.")
	tokens := sum("costgate.tokens", "{token}", "Tokens settled, by tenant and gen_ai.token.type.")
	reloads := sum("costgate.config.reloads", "{reload}", "Configuration reload attempts, by result.")
	reconciles := sum("costgate.budget.reconcile", "{reconcile}", "Restores of a tenant's budget counters from the ledger, by trigger and result.")
	usage := hist("gen_ai.client.token.usage", "{token}", "Number of input and output tokens used per request.", tokenBounds, 1)
	decisionDur := hist("costgate.decision.duration", "s", "Time spent in each stage of a request; total is the whole request, upstream included.", durationBounds, 1e-9)
	storeDur := hist("costgate.store.duration", "s", "Limiter store operation latency, by op and result.", durationBounds, 1e-9)

	t.reqCells = newCache(func(k reqKey) *sumCell {
		return requests.cell(attrPolicy.String(t.policies.name(k.policy)), attrOutcome.String(outcomeNames[k.outcome]),
			attrStatus.String(statusName(k.status)), attrRoute.String(t.routes.name(k.route)))
	})
	t.blockCells = newCache(func(k blockKey) *sumCell {
		return blocked.cell(attrPolicy.String(t.policies.name(k.policy)), attrLimit.String(t.limits.name(k.limit)),
			attrDimension.String(t.dims.name(k.dim)), attrStatus.String(statusName(k.status)))
	})
	t.allowCells = newCache(func(k allowKey) *sumCell {
		return allowed.cell(attrPolicy.String(t.policies.name(k.policy)), attrLimit.String(t.limits.name(k.limit)),
			attrDimension.String(t.dims.name(k.dim)), attrOutcome.String(outcomeNames[k.outcome]))
	})
	t.shadowCells = newCache(func(k shadowAttrKey) *sumCell {
		return shadow.cell(attrPolicy.String(t.policies.name(k.policy)), attrLimit.String(t.limits.name(k.limit)),
			attrTenant.String(t.tenants.name(k.tenant)))
	})
	t.failCells = newLazy(t.cfg.MaxLabelValues+1, func(limit int) *sumCell {
		return failOpen.cell(attrLimit.String(t.limits.name(limit)))
	})
	t.tenantCells = newLazy(t.cfg.MaxTenants+1, func(id int) *tenantCells {
		tenant := attrTenant.String(t.tenants.name(id))
		return &tenantCells{
			spend:     spend.cell(tenant),
			tokensIn:  tokens.cell(tenant, attrTokenType.String("input")),
			tokensOut: tokens.cell(tenant, attrTokenType.String("output")),
		}
	})
	t.modelCells = newLazy(t.cfg.MaxModels+1, func(id int) *modelCells {
		model := attrModel.String(t.models.name(id))
		return &modelCells{
			in:  usage.cell(attrTokenType.String("input"), model),
			out: usage.cell(attrTokenType.String("output"), model),
		}
	})
	for i, s := range stageNames {
		t.stageCells[i] = decisionDur.cell(attrStage.String(s))
	}
	for i, op := range storeOps {
		for j, r := range storeResultNames {
			t.storeCells[i][j] = storeDur.cell(attrOp.String(string(op)), attrResult.String(r))
		}
	}
	// Every combination exists from the start, at 0, so that an alert on
	// failures has a series to watch before the first one.
	for i, tr := range reconcileTriggers {
		t.reconcileCells[i][0] = reconciles.cell(attrTrigger.String(string(tr)), attrResult.String("failure"))
		t.reconcileCells[i][1] = reconciles.cell(attrTrigger.String(string(tr)), attrResult.String("success"))
	}
	t.reloadCells[0] = reloads.cell(attrResult.String("failure"))
	t.reloadCells[1] = reloads.cell(attrResult.String("success"))
}

// gauges creates the SDK gauges and registers their callback.
func (t *Telemetry) gauges() error {
	m := t.meters.Meter(scope)
	var errs []error
	var err error
	t.reloadOK, err = m.Int64Gauge("costgate.config.last_reload_success", // no unit: the exporter would add _ratio
		metric.WithDescription("1 if the last configuration reload succeeded, 0 if it failed (the previous configuration stays active)."))
	errs = append(errs, err)
	lag, err := m.Float64ObservableGauge("costgate.ledger.lag", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest ledger entry not yet written to the ledger store."))
	errs = append(errs, err)
	spool, err := m.Int64ObservableGauge("costgate.ledger.spool.size", metric.WithUnit("By"),
		metric.WithDescription("Bytes in the ledger spool waiting to be written to the ledger store."))
	errs = append(errs, err)
	breaker, err := m.Int64ObservableGauge("costgate.store.breaker.state", // no unit: the exporter would add _ratio
		metric.WithDescription("1 for the limiter store circuit breaker's current state, 0 for the others."))
	errs = append(errs, err)
	remaining, err := m.Float64ObservableGauge("costgate.budget.remaining", // no unit: the exporter would add _ratio
		metric.WithDescription("Share of each budget left for each tenant (its most spent key), from the ledger's spend at the last reconciliation: 1 unspent, 0 spent."))
	errs = append(errs, err)
	storeCounters := make([]metric.Int64ObservableCounter, 4)
	for i, c := range []struct{ name, desc string }{
		{"costgate.store.overloaded", "Limiter store calls not sent because they waited their queue's timeout (no decision)."},
		{"costgate.store.unknown_outcomes", "Limiter store calls sent whose callers left without a reply (no decision)."},
		{"costgate.store.late_cancels", "Of the calls without a reply, debits whose late reply admitted them, then cancelled."},
		{"costgate.store.late_lost", "Of the calls without a reply, those that never got one: a debit among them holds its reservation until it refills."},
	} {
		storeCounters[i], err = m.Int64ObservableCounter(c.name, metric.WithUnit("{call}"), metric.WithDescription(c.desc))
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: instruments: %w", err)
	}
	var breakerAttrs [len(breakerStates)]metric.ObserveOption
	for i, s := range breakerStates {
		breakerAttrs[i] = metric.WithAttributeSet(attribute.NewSet(attrState.String(string(s))))
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if f := t.ledgerFn.Load(); f != nil {
			l, b := (*f)()
			o.ObserveFloat64(lag, l)
			o.ObserveInt64(spool, b)
		}
		if f := t.breakerFn.Load(); f != nil {
			state := (*f)()
			for i, s := range breakerStates {
				var v int64
				if s == state {
					v = 1
				}
				o.ObserveInt64(breaker, v, breakerAttrs[i])
			}
		}
		t.budgetMu.Lock()
		for k, v := range t.budgets {
			o.ObserveFloat64(remaining, v, metric.WithAttributeSet(attribute.NewSet(
				attrLimit.String(t.limits.name(k.limit)), attrTenant.String(t.tenants.name(k.tenant)))))
		}
		t.budgetMu.Unlock()
		if f := t.storeFn.Load(); f != nil {
			st := (*f)()
			for i, v := range []int64{st.Overloaded, st.UnknownOutcomes, st.LateCancels, st.LateLost} {
				o.ObserveInt64(storeCounters[i], v)
			}
		}
		return nil
	}, append([]metric.Observable{lag, spool, breaker, remaining}, observables(storeCounters)...)...)
	if err != nil {
		return fmt.Errorf("telemetry: register callback: %w", err)
	}
	return nil
}

// Decision records one decision. An enforced one (Shadow false) counts in
// costgate.requests and the dashboard series; when its Outcome is "allow" or
// "soft" it also counts in costgate.decisions.allowed, under its Limit (the
// most constraining one) and Dimension; when it is "hard" it also counts in
// costgate.decisions.blocked and, if Key is set, in the top-throttled
// keys, unless its Status is 503: a fail-closed refusal
// because the limiter store is unreachable is an outage, not throttling, and
// shows as costgate.requests{outcome="hard",status="503"} only. A shadow
// Decision counts as ShadowWouldBlock does. When ctx holds a recording span,
// the decision's attributes are set on it.
func (t *Telemetry) Decision(ctx context.Context, d Decision) {
	outcome := outcomeID(d.Outcome)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		// Cleaned as labels are: OTLP cannot carry invalid UTF-8.
		span.SetAttributes(
			attribute.String("costgate.tenant", cleanLabel(d.Tenant)),
			attribute.String("costgate.route", cleanLabel(d.Route)),
			attribute.String("gen_ai.request.model", cleanLabel(d.Model)),
			attribute.String("costgate.policy", cleanLabel(d.Policy)),
			attribute.String("costgate.limit", cleanLabel(d.Limit)),
			attribute.String("costgate.dimension", cleanLabel(d.Dimension)),
			attribute.String("costgate.outcome", cleanLabel(string(d.Outcome))),
			attribute.Bool("costgate.shadow", d.Shadow),
			attribute.Int("http.response.status_code", d.Status),
		)
	}
	if d.Shadow {
		if outcome != outcomeAllow {
			t.ShadowWouldBlock(d.Policy, d.Limit, d.Tenant)
		}
		return
	}
	now := t.now()
	tenant := t.tenants.id(d.Tenant)
	policy := t.policies.id(d.Policy)
	t.reqCells.get(reqKey{policy, outcome, statusID(d.Status), t.routes.id(d.Route)}).add(1)
	t.tenantRequests[tenant].Add(1)
	t.series.decision(now, tenant, policy, outcome)
	switch {
	case outcome == outcomeAllow || outcome == outcomeSoft:
		t.allowCells.get(allowKey{policy, t.limits.id(d.Limit), t.dims.id(d.Dimension), outcome}).add(1)
	case outcome == outcomeHard && d.Status != http.StatusServiceUnavailable:
		limit := t.limits.id(d.Limit)
		t.blockCells.get(blockKey{policy, limit, t.dims.id(d.Dimension), statusID(d.Status)}).add(1)
		if d.Key != "" {
			t.top.add(now, t.limits.name(limit), d.Key, d.Tenant)
		}
	}
}

// Stage records the time d spent in one stage of a request (see the Stage*
// constants; any other name is recorded as "other").
// A negative d is recorded as 0.
func (t *Telemetry) Stage(stage string, d time.Duration) {
	t.stageCells[stageID(stage)].record(int64(max(d, 0)))
}

// StoreOp records the latency of one limiter store operation (see the
// Store* constants) and its result: ok when err is nil, timeout when err is
// or wraps context.DeadlineExceeded or os.ErrDeadlineExceeded, else error. A
// negative d is recorded as 0.
func (t *Telemetry) StoreOp(op StoreOp, d time.Duration, err error) {
	result := 0
	if err != nil {
		result = 1
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
			result = 2
		}
	}
	t.storeCells[storeOpID(op)][result].record(int64(max(d, 0)))
}

// FailOpen counts one decision admitted by a fail-open limit whose store was
// unreachable.
func (t *Telemetry) FailOpen(limit string) {
	t.failCells.get(t.limits.id(limit)).add(1)
	t.failOpenTotal.Add(1)
}

// ShadowWouldBlock counts one decision that the shadow-mode policy or limit
// would have refused or slowed for tenant.
func (t *Telemetry) ShadowWouldBlock(policy, limit, tenant string) {
	p, l, tn := t.policies.id(policy), t.limits.id(limit), t.tenants.id(tenant)
	t.shadowCells.get(shadowAttrKey{p, l, tn}).add(1)
	now := t.now()
	t.shadow.add(now, p, l, tn)
	t.series.shadow(now, p)
}

// Usage records what one request used, as settled: token counts (negative
// and zero counts are not recorded) into gen_ai.client.token.usage and
// costgate.tokens, and the cost in nano-US-dollars (negative is ignored) into
// costgate.spend and the dashboard series.
func (t *Telemetry) Usage(tenant, model string, inputTokens, outputTokens int64, costNanoUSD int64) {
	tn := t.tenants.id(tenant)
	tc := t.tenantCells.get(tn)
	mc := t.modelCells.get(t.models.id(model))
	if inputTokens > 0 {
		mc.in.record(inputTokens)
		tc.tokensIn.add(inputTokens)
	}
	if outputTokens > 0 {
		mc.out.record(outputTokens)
		tc.tokensOut.add(outputTokens)
	}
	if costNanoUSD > 0 {
		tc.spend.add(costNanoUSD)
		t.series.spendAdd(t.now(), tn, costNanoUSD)
	}
}

// Reload counts one configuration reload attempt and sets
// costgate.config.last_reload_success to 1 (ok) or 0. The gauge is absent
// until the first call, so the proxy should report its initial load too.
func (t *Telemetry) Reload(ok bool) {
	i, v := 0, int64(0)
	if ok {
		i, v = 1, 1
	}
	t.reloadCells[i].add(1)
	t.reloadOK.Record(context.Background(), v)
}

// ObserveLedger sets the function read at each collection for
// costgate.ledger.lag (seconds) and costgate.ledger.spool.size (bytes),
// replacing any earlier one. f must be safe for concurrent use and fast; nil
// stops the observations.
func (t *Telemetry) ObserveLedger(f func() (lagSeconds float64, spoolBytes int64)) {
	if f == nil {
		t.ledgerFn.Store(nil)
		return
	}
	t.ledgerFn.Store(&f)
}

// ObserveBreaker sets the function read at each collection for
// costgate.store.breaker.state: 1 for the state it returns, 0 for the
// others (a value outside the Breaker* constants reports 0 for all three).
// It replaces any earlier function; nil stops the observations.
func (t *Telemetry) ObserveBreaker(f func() BreakerState) {
	if f == nil {
		t.breakerFn.Store(nil)
		return
	}
	t.breakerFn.Store(&f)
}

// Reconcile counts one restore of a tenant's budget counters from the
// ledger, or one reconciliation that could not start (the ledger failing),
// as a success when err is nil and a failure otherwise.
func (t *Telemetry) Reconcile(trigger ReconcileTrigger, err error) {
	i := 0
	if trigger == ReconcileStale {
		i = 1
	}
	ok := 0
	if err == nil {
		ok = 1
	}
	t.reconcileCells[i][ok].add(1)
}

// BudgetRemaining sets costgate.budget.remaining for budget and tenant:
// the share of the budget left, clamped to [0, 1]. Both names come from
// the configuration, so the series are at most the budgets times the
// tenants (each set bounded as the labels are); a series stays until the
// process ends.
func (t *Telemetry) BudgetRemaining(budget, tenant string, ratio float64) {
	k := budgetKey{t.limits.id(budget), t.tenants.id(tenant)}
	t.budgetMu.Lock()
	t.budgets[k] = min(max(ratio, 0), 1)
	t.budgetMu.Unlock()
}

// ObserveStore sets the function read at each collection for the limiter
// store's own counters (costgate.store.overloaded, .unknown_outcomes,
// .late_cancels and .late_lost), replacing any earlier one. f must be safe
// for concurrent use, fast, and return counts that never decrease; nil
// stops the observations.
func (t *Telemetry) ObserveStore(f func() StoreStats) {
	if f == nil {
		t.storeFn.Store(nil)
		return
	}
	t.storeFn.Store(&f)
}

func observables(cs []metric.Int64ObservableCounter) []metric.Observable {
	out := make([]metric.Observable, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}

// FailOpenTotal returns the number of FailOpen calls since New, over all
// limits, for the dashboard's store health.
func (t *Telemetry) FailOpenTotal() int64 { return t.failOpenTotal.Load() }

// TopThrottled returns up to n limit keys with the most throttled (hard,
// refused) decisions over the last one to two windows (Config.Window), by
// descending count. Counts are upper bounds; see Throttled. n <= 0 returns
// an empty slice.
func (t *Telemetry) TopThrottled(n int) []Throttled { return t.top.top(t.now(), n) }

// Shadow returns the would-block counts of every shadow policy and limit
// seen, ordered by policy then limit.
func (t *Telemetry) Shadow() []ShadowCount { return t.shadowSnapshot(t.now()) }

// Series returns the last hour in one-minute buckets.
func (t *Telemetry) Series() Series { return t.series.snapshot(t.now(), t.tenants, t.policies) }
