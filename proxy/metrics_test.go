package proxy_test

import (
	"context"
	"io"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
)

// metric reads one sample of the server's /metrics exposition: the value
// of the line that starts with series; -1 when there is none.
func metric(t *testing.T, s *stack, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	s.srv.Telemetry().MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestReconcileMetrics: the reconciliation at start counts one success
// per tenant and reports each budget's share left; after a request has
// spent some of it, the next reconciliation reports less, and an admitted
// request counts under its deciding limit.
func TestReconcileMetrics(t *testing.T) {
	ctx := context.Background()
	s := newStackWith(t, stackOptions{policies: allowAll, extra: `
budgets:
  - name: acme-budget
    scope: tenant
    period: day
    amount: "1"
`})
	const ok = `costgate_budget_reconcile_total{result="success",trigger="reconcile"}`
	const left = `costgate_budget_remaining{limit="acme-budget",tenant="acme"}`
	if got := metric(t, s, ok); got != 2 { // acme and globex
		t.Errorf("%s = %v after start, want 2", ok, got)
	}
	if got := metric(t, s, `costgate_budget_reconcile_total{result="failure",trigger="reconcile"}`); got != 0 {
		t.Errorf("reconcile failures = %v, want 0 (present at 0)", got)
	}
	if got := metric(t, s, left); got != 1 {
		t.Errorf("%s = %v at start, want 1", left, got)
	}
	if _, err := s.client("cg-test-acme").Chat.Completions.New(ctx, chatParams("Hello there", 50)); err != nil {
		t.Fatal(err)
	}
	if err := s.srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.srv.Gate().ReconcileBudgets(ctx); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, s, ok); got != 4 {
		t.Errorf("%s = %v after a second reconciliation, want 4", ok, got)
	}
	if got := metric(t, s, left); got <= 0 || got >= 1 {
		t.Errorf("%s = %v after a request was charged, want between 0 and 1", left, got)
	}
	allowed := `costgate_decisions_allowed_total{dimension="tenant",limit="acme-budget",outcome="allow",policy="none"}`
	if got := metric(t, s, allowed); got != 1 {
		t.Errorf("%s = %v, want 1", allowed, got)
	}
}
