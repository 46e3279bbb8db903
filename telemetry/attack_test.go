package telemetry

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// labelSetBytes is the number of bytes of label values a labelSet's map and
// names keep.
func labelSetBytes(l *labelSet) int {
	n := 0
	for k := range *l.ids.Load() {
		n += len(k)
	}
	for _, v := range *l.names.Load() {
		n += len(v)
	}
	return n
}

// TestTelemetryAttackLongModelNamesNotRetained: model names are
// client-controlled (Config.MaxModels). Whatever the length of the values
// Usage is given, the model labelSet keeps at most its values and aliases
// times MaxLabelLen*4 bytes: a handful of multi-megabyte names must not stay
// in memory for the life of the process.
func TestTelemetryAttackLongModelNamesNotRetained(t *testing.T) {
	tm := newTelemetry(t, Config{})
	const valueLen = 1 << 20
	for i := range tm.cfg.MaxModels {
		model := fmt.Sprintf("m%03d-", i) + strings.Repeat("x", valueLen)
		tm.Usage("tenant-a", model, 10, 10, 1000)
	}
	// Every value and alias is at most MaxLabelLen*4 bytes when kept.
	bound := (tm.cfg.MaxModels + 1 + aliasBudget) * MaxLabelLen * 4
	if got := labelSetBytes(tm.models); got > bound {
		t.Errorf("model labels keep %d bytes after %d distinct %d-byte models, want at most %d",
			got, tm.cfg.MaxModels, valueLen, bound)
	}
}

// TestTelemetryAttackSeriesBounded: however many distinct tenants, models,
// policies, limits, routes and dimensions the decisions carry, each metric
// family has at most the number of series its label bounds allow, and the
// limit keys never become labels.
func TestTelemetryAttackSeriesBounded(t *testing.T) {
	cfg := Config{MaxTenants: 5, MaxModels: 4, MaxLabelValues: 3}
	tm := newTelemetry(t, cfg)
	ctx := context.Background()
	for i := range 3000 {
		v := fmt.Sprint(i)
		tm.Decision(ctx, Decision{Tenant: "t" + v, Route: "/r" + v, Model: "m" + v, Policy: "p" + v,
			Limit: "l" + v, Dimension: "d" + v, Outcome: []Outcome{OutcomeAllow, OutcomeSoft, OutcomeHard}[i%3],
			Status: []int{200, 429, 402}[i%3], Key: "user-" + v})
		tm.Decision(ctx, Decision{Tenant: "t" + v, Policy: "p" + v, Limit: "l" + v, Outcome: OutcomeHard, Shadow: true})
		tm.Usage("t"+v, "m"+v, 1, 1, 1)
		tm.FailOpen("l" + v)
		tm.BudgetRemaining("l"+v, "t"+v, 0.5)
	}
	fams := scrape(t, tm)
	tenants, models, labels := cfg.MaxTenants+1, cfg.MaxModels+1, cfg.MaxLabelValues+1
	want := map[string]int{
		"costgate_requests_total":            labels * 3 * 3 * labels, // policy, outcome, status, route
		"costgate_decisions_blocked_total":   labels * labels * labels * 3,
		"costgate_decisions_allowed_total":   labels * labels * labels * 2,
		"costgate_shadow_would_block_total":  labels * labels * tenants,
		"costgate_spend_nano_usd_total":      tenants,
		"costgate_tokens_total":              tenants * 2,
		"costgate_failopen_total":            labels,
		"costgate_budget_remaining":          labels * tenants,
		"costgate_decision_duration_seconds": numStages,
		"costgate_store_duration_seconds":    numStoreOps * numStoreResults,
		"costgate_config_reloads_total":      2,
		"costgate_budget_reconcile_total":    4,
		"gen_ai_client_token_usage":          models * 2,
	}
	for name, f := range fams {
		if !strings.HasPrefix(name, "costgate_") && !strings.HasPrefix(name, "gen_ai_") {
			continue
		}
		bound, ok := want[name]
		if !ok {
			t.Errorf("family %s (%d series) has no stated bound", name, len(f.GetMetric()))
			continue
		}
		if n := len(f.GetMetric()); n > bound {
			t.Errorf("family %s has %d series, want at most %d", name, n, bound)
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.HasPrefix(lp.GetValue(), "user-") {
					t.Errorf("family %s carries the limit key %q as label %s", name, lp.GetValue(), lp.GetName())
				}
			}
		}
	}
	if got := tm.TopThrottled(1 << 20); len(got) > 2*tm.cfg.TopKCapacity {
		t.Errorf("top throttled keeps %d keys, want at most %d", len(got), 2*tm.cfg.TopKCapacity)
	}
}
