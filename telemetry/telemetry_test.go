package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

type L = map[string]string

func TestMetricsScrape(t *testing.T) {
	tm := newTelemetry(t, Config{Now: newFakeClock().Now})
	ctx := context.Background()
	for range 3 {
		tm.Decision(ctx, Decision{Tenant: "acme", Route: "chat", Policy: "plans", Outcome: "allow", Status: 200})
	}
	tm.Decision(ctx, Decision{Tenant: "acme", Route: "chat", Policy: "plans", Limit: "rpm", Dimension: "tenant", Outcome: "hard", Status: 429, Key: "rpm:acme"})
	tm.Decision(ctx, Decision{Tenant: "acme", Route: "chat", Policy: "budget", Limit: "daily", Dimension: "tenant", Outcome: "hard", Status: 402, Key: "usd:acme"})
	tm.Decision(ctx, Decision{Tenant: "beta", Route: "chat", Policy: "plans", Limit: "tpm", Dimension: "user", Outcome: "soft", Status: 200, Key: "tpm:beta:u1"})
	// A fail-closed limit whose store is down: an outage, not a block.
	tm.Decision(ctx, Decision{Tenant: "beta", Route: "chat", Policy: "plans", Limit: "rpm", Dimension: "tenant", Outcome: "hard", Status: 503, Key: "rpm:beta"})
	tm.Decision(ctx, Decision{Tenant: "beta", Policy: "abuse", Limit: "per-ip", Outcome: "hard", Status: 429, Shadow: true})
	tm.Decision(ctx, Decision{Tenant: "beta", Policy: "abuse", Limit: "per-ip", Outcome: "allow", Status: 200, Shadow: true})
	tm.ShadowWouldBlock("abuse", "per-ip", "beta")
	tm.Stage(StageDebit, 40*time.Microsecond)
	tm.Stage(StageDebit, 3*time.Millisecond)
	tm.Stage(StageTotal, 2*time.Second)
	tm.Stage("bogus", time.Millisecond)
	tm.Stage(StageTotal, -time.Second) // a clock step: recorded as 0
	tm.StoreOp(StoreDebit, time.Millisecond, nil)
	tm.StoreOp(StoreDebit, 5*time.Millisecond, fmt.Errorf("redis: %w", context.DeadlineExceeded))
	tm.StoreOp(StoreSettle, time.Millisecond, errors.New("connection refused"))
	tm.StoreOp(StoreRenew, time.Millisecond, nil)
	tm.StoreOp(StoreReset, time.Millisecond, nil)
	tm.StoreOp(StoreRestore, time.Millisecond, nil)
	tm.StoreOp("bogus", time.Millisecond, nil)
	tm.FailOpen("rpm")
	tm.FailOpen("rpm")
	tm.Usage("acme", "gpt-4o", 1000, 200, 3_500_000)
	tm.Usage("acme", "gpt-4o", 10, 0, 0)
	tm.Usage("beta", "claude-sonnet", 50, 70, 1_000)
	tm.Reload(true)
	tm.Reload(false)
	tm.ObserveLedger(func() (float64, int64) { return 0.25, 4096 })
	tm.ObserveBreaker(func() BreakerState { return BreakerHalfOpen })
	tm.Reconcile(ReconcileScheduled, nil)
	tm.Reconcile(ReconcileScheduled, nil)
	tm.Reconcile(ReconcileStale, errors.New("ledger down"))
	tm.BudgetRemaining("daily", "acme", 0.25)
	tm.BudgetRemaining("daily", "acme", 0.125) // the last value wins
	tm.BudgetRemaining("daily", "beta", 1.5)   // clamped
	tm.ObserveStore(func() StoreStats { return StoreStats{Overloaded: 3, UnknownOutcomes: 2, LateCancels: 1, LateLost: 1} })

	if got := tm.FailOpenTotal(); got != 2 {
		t.Errorf("FailOpenTotal() = %d, want 2", got)
	}
	fams := scrape(t, tm)
	tests := []struct {
		name   string
		labels L
		want   float64
	}{
		{"costgate_requests_total", L{"policy": "plans", "outcome": "allow", "status": "200", "route": "chat"}, 3},
		{"costgate_requests_total", L{"policy": "plans", "outcome": "hard", "status": "429", "route": "chat"}, 1},
		{"costgate_requests_total", L{"policy": "budget", "outcome": "hard", "status": "402", "route": "chat"}, 1},
		{"costgate_requests_total", L{"policy": "plans", "outcome": "soft", "status": "200", "route": "chat"}, 1},
		{"costgate_requests_total", L{"policy": "plans", "outcome": "hard", "status": "503", "route": "chat"}, 1},
		{"costgate_decisions_blocked_total", L{"policy": "plans", "limit": "rpm", "dimension": "tenant", "status": "429"}, 1},
		{"costgate_decisions_blocked_total", L{"policy": "budget", "limit": "daily", "dimension": "tenant", "status": "402"}, 1},
		{"costgate_decisions_allowed_total", L{"policy": "plans", "limit": "none", "dimension": "none", "outcome": "allow"}, 3},
		{"costgate_decisions_allowed_total", L{"policy": "plans", "limit": "tpm", "dimension": "user", "outcome": "soft"}, 1},
		{"costgate_shadow_would_block_total", L{"policy": "abuse", "limit": "per-ip", "tenant": "beta"}, 2},
		{"costgate_decision_duration_seconds", L{"stage": "debit"}, 2},
		{"costgate_decision_duration_seconds", L{"stage": "total"}, 2},
		{"costgate_decision_duration_seconds", L{"stage": "other"}, 1},
		{"costgate_store_duration_seconds", L{"op": "debit", "result": "ok"}, 1},
		{"costgate_store_duration_seconds", L{"op": "debit", "result": "timeout"}, 1},
		{"costgate_store_duration_seconds", L{"op": "settle", "result": "error"}, 1},
		{"costgate_store_duration_seconds", L{"op": "renew", "result": "ok"}, 1},
		{"costgate_store_duration_seconds", L{"op": "reset", "result": "ok"}, 1},
		{"costgate_store_duration_seconds", L{"op": "restore", "result": "ok"}, 1},
		{"costgate_store_duration_seconds", L{"op": "other", "result": "ok"}, 1},
		{"costgate_failopen_total", L{"limit": "rpm"}, 2},
		{"gen_ai_client_token_usage", L{"gen_ai_token_type": "input", "gen_ai_request_model": "gpt-4o"}, 2},
		{"gen_ai_client_token_usage", L{"gen_ai_token_type": "output", "gen_ai_request_model": "gpt-4o"}, 1},
		{"costgate_tokens_total", L{"tenant": "acme", "gen_ai_token_type": "input"}, 1010},
		{"costgate_tokens_total", L{"tenant": "acme", "gen_ai_token_type": "output"}, 200},
		{"costgate_tokens_total", L{"tenant": "beta", "gen_ai_token_type": "output"}, 70},
		{"costgate_spend_nano_usd_total", L{"tenant": "acme"}, 3_500_000},
		{"costgate_spend_nano_usd_total", L{"tenant": "beta"}, 1_000},
		{"costgate_config_reloads_total", L{"result": "success"}, 1},
		{"costgate_config_reloads_total", L{"result": "failure"}, 1},
		{"costgate_config_last_reload_success", L{}, 0},
		{"costgate_ledger_lag_seconds", L{}, 0.25},
		{"costgate_ledger_spool_size_bytes", L{}, 4096},
		{"costgate_store_breaker_state", L{"state": "half_open"}, 1},
		{"costgate_store_breaker_state", L{"state": "open"}, 0},
		{"costgate_store_breaker_state", L{"state": "closed"}, 0},
		{"costgate_budget_reconcile_total", L{"trigger": "reconcile", "result": "success"}, 2},
		{"costgate_budget_reconcile_total", L{"trigger": "reconcile", "result": "failure"}, 0},
		{"costgate_budget_reconcile_total", L{"trigger": "stale", "result": "failure"}, 1},
		{"costgate_budget_reconcile_total", L{"trigger": "stale", "result": "success"}, 0},
		{"costgate_budget_remaining", L{"limit": "daily", "tenant": "acme"}, 0.125},
		{"costgate_budget_remaining", L{"limit": "daily", "tenant": "beta"}, 1},
		{"costgate_store_overloaded_total", L{}, 3},
		{"costgate_store_unknown_outcomes_total", L{}, 2},
		{"costgate_store_late_cancels_total", L{}, 1},
		{"costgate_store_late_lost_total", L{}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name+describeLabels(tc.labels), func(t *testing.T) {
			if got := value(t, fams, tc.name, tc.labels); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}

	// Histogram contents: the bucket boundaries are in seconds and the sum
	// is exact.
	h := findSeries(fams, "costgate_decision_duration_seconds", L{"stage": "debit"}).GetHistogram()
	if got, want := h.GetSampleSum(), 0.003040; abs(got-want) > 1e-12 {
		t.Errorf("debit duration sum = %v, want %v", got, want)
	}
	cum := map[float64]uint64{}
	for _, b := range h.GetBucket() {
		cum[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	if cum[2.5e-5] != 0 || cum[5e-5] != 1 || cum[2.5e-3] != 1 || cum[5e-3] != 2 {
		t.Errorf("debit duration buckets = %v", cum)
	}
	tok := findSeries(fams, "gen_ai_client_token_usage", L{"gen_ai_token_type": "input", "gen_ai_request_model": "gpt-4o"}).GetHistogram()
	if tok.GetSampleSum() != 1010 {
		t.Errorf("token usage sum = %v, want 1010", tok.GetSampleSum())
	}
	if got := findSeries(fams, "costgate_decision_duration_seconds", L{"stage": "total"}).GetHistogram().GetSampleSum(); got != 2 {
		t.Errorf("total duration sum = %v, want 2 (the negative duration counts as 0)", got)
	}
	if findSeries(fams, "costgate_decisions_blocked_total", L{"policy": "plans", "limit": "rpm", "dimension": "tenant", "status": "503"}) != nil {
		t.Error("a fail-closed 503 was counted as blocked")
	}
	if top := tm.TopThrottled(10); len(top) != 2 || top[0].Key == "rpm:beta" || top[1].Key == "rpm:beta" {
		t.Errorf("TopThrottled = %v, want rpm:acme and usd:acme only", top)
	}
	// Keys never become labels.
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "rpm:acme") {
					t.Errorf("%s carries the limit key as a label", name)
				}
			}
		}
	}
}

func describeLabels(l L) string {
	return fmt.Sprint(l)
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func TestGaugesAbsentUntilSet(t *testing.T) {
	tm := newTelemetry(t, Config{})
	fams := scrape(t, tm)
	for _, name := range []string{"costgate_config_last_reload_success", "costgate_ledger_lag_seconds", "costgate_store_breaker_state"} {
		if f := fams[name]; f != nil && len(f.GetMetric()) > 0 {
			t.Errorf("%s present before anything was reported: %s", name, describe(f))
		}
	}
	tm.ObserveBreaker(func() BreakerState { return BreakerClosed })
	tm.ObserveBreaker(nil)
	if f := scrape(t, tm)["costgate_store_breaker_state"]; f != nil && len(f.GetMetric()) > 0 {
		t.Errorf("breaker state still observed after ObserveBreaker(nil)")
	}
}

func TestTenantFolding(t *testing.T) {
	clock := newFakeClock()
	tm := newTelemetry(t, Config{MaxTenants: 3, MaxModels: 2, Now: clock.Now})
	ctx := context.Background()
	for i := range 10 {
		tenant := fmt.Sprintf("t%d", i)
		tm.Decision(ctx, Decision{Tenant: tenant, Policy: "p", Outcome: "allow", Status: 200})
		tm.Usage(tenant, fmt.Sprintf("m%d", i%4), 1, 1, int64(i+1))
	}
	tm.Usage("t0", "m0", 0, 0, 100)
	fams := scrape(t, tm)
	f := fams["costgate_spend_nano_usd_total"]
	if n := len(f.GetMetric()); n != 4 {
		t.Fatalf("spend has %d tenant series, want 3 + other: %s", n, describe(f))
	}
	for tenant, want := range map[string]float64{"t0": 101, "t1": 2, "t2": 3, Other: 4 + 5 + 6 + 7 + 8 + 9 + 10} {
		if got := value(t, fams, "costgate_spend_nano_usd_total", L{"tenant": tenant}); got != want {
			t.Errorf("spend{tenant=%s} = %v, want %v", tenant, got, want)
		}
	}
	if got := value(t, fams, "costgate_tokens_total", L{"tenant": Other, "gen_ai_token_type": "input"}); got != 7 {
		t.Errorf("tokens{tenant=other} = %v, want 7", got)
	}
	models := fams["gen_ai_client_token_usage"]
	if n := len(models.GetMetric()); n != 6 {
		t.Errorf("token usage has %d series, want (2 models + other) x 2 types: %s", n, describe(models))
	}
	if got := value(t, fams, "gen_ai_client_token_usage", L{"gen_ai_token_type": "input", "gen_ai_request_model": Other}); got != 4 {
		t.Errorf("token usage{model=other} count = %v, want 4 (m2 and m3, twice each)", got)
	}
	s := tm.Series()
	if len(s.SpendNanoUSD) != 4 || s.SpendNanoUSD[Other][SeriesMinutes-1] != 49 {
		t.Errorf("series spend = %v, want 3 tenants and other=49", s.SpendNanoUSD)
	}
	if len(s.RequestsByTenant) != 4 || s.RequestsByTenant[Other][SeriesMinutes-1] != 7 {
		t.Errorf("series requests = %v", s.RequestsByTenant)
	}
}

func TestConcurrentRecording(t *testing.T) {
	clock := newFakeClock()
	tm := newTelemetry(t, Config{MaxTenants: 5, Now: clock.Now})
	const workers, perWorker = 8, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := range perWorker {
				tenant := fmt.Sprintf("t%d", (w+i)%8)
				outcome := []Outcome{OutcomeAllow, OutcomeSoft, OutcomeHard}[i%3]
				tm.Decision(ctx, Decision{Tenant: tenant, Policy: fmt.Sprintf("p%d", i%2), Limit: "l", Outcome: outcome, Status: 200, Key: "k" + tenant})
				tm.Stage(StageTotal, time.Millisecond)
				tm.StoreOp(StoreDebit, time.Microsecond, nil)
				tm.Usage(tenant, "m", 2, 3, 7)
				tm.ShadowWouldBlock("s", "l", tenant)
				tm.FailOpen("l")
				if i%50 == 0 {
					tm.Reload(true)
					_ = tm.TopThrottled(5)
					_ = tm.Shadow()
					_ = tm.Series()
					if w == 0 {
						clock.Advance(10 * time.Second)
					}
				}
			}
		}()
	}
	// Scrape while recording.
	for range 3 {
		scrape(t, tm)
	}
	wg.Wait()
	const total = workers * perWorker
	fams := scrape(t, tm)
	sum := func(name string) float64 {
		var s float64
		for _, m := range fams[name].GetMetric() {
			switch {
			case m.Counter != nil:
				s += m.GetCounter().GetValue()
			case m.Histogram != nil:
				s += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return s
	}
	for name, want := range map[string]float64{
		"costgate_requests_total":            total,
		"costgate_decision_duration_seconds": total,
		"costgate_store_duration_seconds":    total,
		"costgate_spend_nano_usd_total":      7 * total,
		"costgate_tokens_total":              5 * total,
		"costgate_failopen_total":            total,
		"costgate_shadow_would_block_total":  total,
	} {
		if got := sum(name); got != want {
			t.Errorf("sum of %s = %v, want %v", name, got, want)
		}
	}
	if n := len(fams["costgate_spend_nano_usd_total"].GetMetric()); n != 6 {
		t.Errorf("spend has %d tenant series, want 5 + other", n)
	}
	var shadowTotal int64
	for _, sc := range tm.Shadow() {
		shadowTotal += sc.WouldBlock
	}
	if shadowTotal != total {
		t.Errorf("shadow total = %d, want %d", shadowTotal, total)
	}
	var seriesTotal int64
	for _, v := range tm.Series().Requests {
		seriesTotal += v
	}
	if seriesTotal != total {
		t.Errorf("series requests = %d, want %d", seriesTotal, total)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero value", Config{}, true},
		{"explicit", Config{ServiceName: "x", MaxTenants: 1, MaxModels: 1, MaxLabelValues: 1, TopKCapacity: 1, Window: time.Hour}, true},
		{"negative tenants", Config{MaxTenants: -1}, false},
		{"negative models", Config{MaxModels: -1}, false},
		{"negative labels", Config{MaxLabelValues: -5}, false},
		{"negative topk", Config{TopKCapacity: -1}, false},
		{"window too short", Config{Window: time.Second}, false},
		{"window too long", Config{Window: 2 * time.Hour}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			tm, err := New(context.Background(), tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New() error = %v, want ok=%v", err, tc.ok)
			}
			if tm != nil {
				if err := tm.Shutdown(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestSpans(t *testing.T) {
	exp := keepSpans{tracetest.NewInMemoryExporter()}
	tm, err := New(context.Background(), Config{SpanExporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := tm.Tracer().Start(context.Background(), "request")
	_, child := tm.Tracer().Start(ctx, "debit")
	child.End()
	tm.Decision(ctx, Decision{Tenant: "acme", Route: "chat", Model: "gpt-4o", Policy: "plans", Limit: "rpm", Dimension: "tenant", Outcome: "hard", Status: 429})
	span.End()
	if err := tm.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tm.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("got %d spans, want 2", len(spans))
	}
	req := spans[1]
	if req.Name != "request" || spans[0].Parent.SpanID() != req.SpanContext.SpanID() {
		t.Fatalf("spans %q, %q: want debit as the child of request", spans[0].Name, req.Name)
	}
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range req.Attributes {
		got[kv.Key] = kv.Value
	}
	for k, want := range map[attribute.Key]string{
		"costgate.policy": "plans", "costgate.limit": "rpm", "costgate.dimension": "tenant",
		"costgate.outcome": "hard", "costgate.tenant": "acme", "gen_ai.request.model": "gpt-4o",
	} {
		if got[k].AsString() != want {
			t.Errorf("span attribute %s = %q, want %q", k, got[k].AsString(), want)
		}
	}
	if got["http.response.status_code"].AsInt64() != 429 {
		t.Errorf("span status attribute = %v", got["http.response.status_code"])
	}
	var res string
	for _, kv := range req.Resource.Attributes() {
		if kv.Key == "service.name" {
			res = kv.Value.AsString()
		}
	}
	if res != "costgate" {
		t.Errorf("service.name = %q, want costgate", res)
	}
}

// keepSpans keeps the exported spans past Shutdown, which the in-memory
// exporter would otherwise clear.
type keepSpans struct{ *tracetest.InMemoryExporter }

func (keepSpans) Shutdown(context.Context) error { return nil }

func TestNoExporterTracerIsNoop(t *testing.T) {
	tm := newTelemetry(t, Config{})
	tr := tm.Tracer()

	ctx := context.Background()
	got, span := tr.Start(ctx, "request")
	if span.IsRecording() || span.SpanContext().IsValid() || got != ctx {
		t.Errorf("no parent: span recording=%v valid=%v, context replaced=%v", span.IsRecording(), span.SpanContext().IsValid(), got != ctx)
	}

	// The client's traceparent carries through to the children, as with the
	// no-op tracer, so the proxy can still propagate it upstream.
	carrier := propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	remote := tm.Propagator().Extract(context.Background(), carrier)
	child, span := tr.Start(remote, "debit")
	if span.IsRecording() || span.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("remote parent: span %v recording=%v", span.SpanContext(), span.IsRecording())
	}
	out := propagation.MapCarrier{}
	tm.Propagator().Inject(child, out)
	if out["traceparent"] != carrier["traceparent"] {
		t.Errorf("injected traceparent %q, want %q", out["traceparent"], carrier["traceparent"])
	}

	// A recording span of another provider is not continued.
	other := sdktrace.NewTracerProvider()
	defer other.Shutdown(context.Background())
	octx, ospan := other.Tracer("other").Start(context.Background(), "outer")
	defer ospan.End()
	if _, span := tr.Start(octx, "inner"); span.IsRecording() {
		t.Error("span under another provider's recording span records")
	}
}

// TestDocTable checks the package doc's metric table against a scrape in
// which every metric has a value, both ways.
func TestDocTable(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, line := range strings.Split(string(src), "\n") {
		f := strings.Fields(strings.TrimPrefix(line, "//"))
		if len(f) < 3 || !strings.HasPrefix(line, "//\t") || f[0] == "OpenTelemetry" {
			continue
		}
		for _, w := range f[1:3] { // the Prometheus name is the second or third field (the unit may be empty)
			if (strings.HasPrefix(w, "costgate_") || strings.HasPrefix(w, "gen_ai_")) && !strings.Contains(w, ".") {
				documented[w] = true
				break
			}
		}
	}
	tm := newTelemetry(t, Config{})
	ctx := context.Background()
	tm.Decision(ctx, Decision{Tenant: "a", Policy: "p", Limit: "l", Outcome: "hard", Status: 429})
	tm.Decision(ctx, Decision{Tenant: "a", Policy: "p", Limit: "l", Outcome: "allow", Status: 200})
	tm.Stage(StageTotal, time.Millisecond)
	tm.StoreOp(StoreDebit, time.Millisecond, nil)
	tm.FailOpen("l")
	tm.ShadowWouldBlock("p", "l", "a")
	tm.Usage("a", "m", 1, 1, 1)
	tm.Reload(true)
	tm.ObserveLedger(func() (float64, int64) { return 1, 1 })
	tm.ObserveBreaker(func() BreakerState { return BreakerClosed })
	tm.BudgetRemaining("b", "a", 1)
	tm.ObserveStore(func() StoreStats { return StoreStats{} })
	scraped := map[string]bool{}
	for name, f := range scrape(t, tm) {
		if !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && name != "target_info" && len(f.GetMetric()) > 0 {
			scraped[name] = true
		}
	}
	for name := range documented {
		if !scraped[name] {
			t.Errorf("documented %s is not scraped", name)
		}
	}
	for name := range scraped {
		if !documented[name] {
			t.Errorf("scraped %s is not in the doc table", name)
		}
	}
	if len(documented) != 21 {
		t.Errorf("parsed %d documented names, want 21: %v", len(documented), documented)
	}
}

func TestLabelFolding(t *testing.T) {
	tm := newTelemetry(t, Config{MaxLabelValues: 2})
	ctx := context.Background()
	for _, p := range []string{"p1", "p2", "p3", "p4", ""} {
		tm.Decision(ctx, Decision{Policy: p, Route: p, Limit: p, Dimension: "tenant", Outcome: "hard", Status: 429})
	}
	tm.Decision(ctx, Decision{Policy: "p1", Route: "p1", Outcome: "maybe", Status: 999})
	tm.FailOpen("p9")
	fams := scrape(t, tm)
	for labels, want := range map[string]float64{
		"p1": 1, "p2": 1, Other: 3, // p3, p4 and the empty policy ("none", third value)
	} {
		if got := value(t, fams, "costgate_requests_total", L{"policy": labels, "route": labels, "outcome": "hard", "status": "429"}); got != want {
			t.Errorf("requests{policy=%s} = %v, want %v", labels, got, want)
		}
		if got := value(t, fams, "costgate_decisions_blocked_total", L{"policy": labels, "limit": labels, "dimension": "tenant", "status": "429"}); got != want {
			t.Errorf("blocked{policy=%s} = %v, want %v", labels, got, want)
		}
	}
	if got := value(t, fams, "costgate_requests_total", L{"policy": "p1", "route": "p1", "outcome": Other, "status": Other}); got != 1 {
		t.Errorf("requests with an unknown outcome and status = %v, want 1", got)
	}
	if got := value(t, fams, "costgate_failopen_total", L{"limit": Other}); got != 1 {
		t.Errorf("failopen{limit=other} = %v, want 1", got)
	}
}

func TestMeterSharesTheEndpoint(t *testing.T) {
	tm := newTelemetry(t, Config{})
	c, err := tm.Meter("github.com/costgate/costgate/proxy").Int64Counter("costgate.proxy.connections")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 3)
	if got := value(t, scrape(t, tm), "costgate_proxy_connections_total", L{}); got != 3 {
		t.Errorf("costgate_proxy_connections_total = %v, want 3", got)
	}
}

// TestRecordingDoesNotAllocate checks the hot-path promise: once a label
// combination has been seen, recording allocates nothing.
func TestRecordingDoesNotAllocate(t *testing.T) {
	clock := newFakeClock()
	tm := newTelemetry(t, Config{Now: clock.Now})
	ctx := context.Background()
	allow := Decision{Tenant: "acme", Route: "chat", Model: "m", Policy: "plans", Outcome: "allow", Status: 200}
	hard := Decision{Tenant: "acme", Route: "chat", Model: "m", Policy: "plans", Limit: "rpm", Dimension: "tenant", Outcome: "hard", Status: 429, Key: "rpm:acme"}
	shadow := Decision{Tenant: "acme", Policy: "abuse", Limit: "per-ip", Outcome: "hard", Status: 429, Shadow: true}
	storeErr := errors.New("down")
	calls := []struct {
		name string
		f    func()
	}{
		{"Decision allow", func() { tm.Decision(ctx, allow) }},
		{"Decision hard", func() { tm.Decision(ctx, hard) }},
		{"Decision shadow", func() { tm.Decision(ctx, shadow) }},
		{"Stage", func() { tm.Stage(StageDebit, time.Millisecond) }},
		{"StoreOp", func() { tm.StoreOp(StoreDebit, time.Millisecond, storeErr) }},
		{"Usage", func() { tm.Usage("acme", "m", 10, 20, 30) }},
		{"FailOpen", func() { tm.FailOpen("rpm") }},
		{"ShadowWouldBlock", func() { tm.ShadowWouldBlock("abuse", "per-ip", "acme") }},
		{"Reload", func() { tm.Reload(true) }},
	}
	for _, c := range calls {
		c.f() // first sighting builds the cells
		if n := testing.AllocsPerRun(100, c.f); n != 0 {
			t.Errorf("%s: %v allocations per call", c.name, n)
		}
	}
}

// TestUnsampledChildren checks the tracer's shortcut for the children of a
// dropped span against what the SDK's sampler would decide.
func TestUnsampledChildren(t *testing.T) {
	const sampledParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const droppedParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	tests := []struct {
		name, sampler, arg, parent string
		wantSpans                  int // of request + 3 children
	}{
		{"always_off drops all", "always_off", "", "", 0},
		{"ratio 0 drops all", "traceidratio", "0", "", 0},
		{"parent-based follows a sampled remote parent", "parentbased_traceidratio", "0", sampledParent, 4},
		{"parent-based follows a dropped remote parent", "parentbased_always_on", "", droppedParent, 0},
		{"always_on records under a dropped remote parent", "always_on", "", droppedParent, 4},
		{"always_on records all", "always_on", "", "", 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_SAMPLER", tc.sampler)
			t.Setenv("OTEL_TRACES_SAMPLER_ARG", tc.arg)
			exp := keepSpans{tracetest.NewInMemoryExporter()}
			tm, err := New(context.Background(), Config{SpanExporter: exp})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tc.parent != "" {
				ctx = tm.Propagator().Extract(ctx, propagation.MapCarrier{"traceparent": tc.parent})
			}
			rctx, req := tm.Tracer().Start(ctx, "request")
			for _, s := range []string{StageEstimate, StageDebit, StageUpstream} {
				cctx, child := tm.Tracer().Start(rctx, s)
				if !req.IsRecording() && (!child.SpanContext().Equal(req.SpanContext()) || cctx != rctx) {
					t.Errorf("%s: child of a dropped span was not short-cut", s)
				}
				if child.SpanContext().TraceID() != req.SpanContext().TraceID() {
					t.Errorf("%s: child in another trace", s)
				}
				child.End()
			}
			req.End()
			if err := tm.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := len(exp.GetSpans()); got != tc.wantSpans {
				t.Errorf("exported %d spans, want %d", got, tc.wantSpans)
			}
		})
	}
}
