package proxy_test

import (
	"context"
	"slices"
	"testing"
	"testing/fstest"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/costgate/costgate/telemetry"
)

// keptSpans is an in-memory exporter whose spans outlive its Shutdown
// (tracetest's own Shutdown drops them).
type keptSpans struct{ *tracetest.InMemoryExporter }

func (keptSpans) Shutdown(context.Context) error { return nil }

// TestOneSpanPerStage drives one request through a costgate on loopback
// and reads its trace from an in-memory exporter: a server span for the
// request naming the deciding limit and policy, and one child per stage,
// settle included, although settle ends on another goroutine after the
// request's span.
func TestOneSpanPerStage(t *testing.T) {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tel, err := telemetry.New(ctx, telemetry.Config{SpanExporter: keptSpans{exp}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	pols := fstest.MapFS{"pace.rego": {Data: []byte(`package costgate.policies.pace

decision := {"outcome": "soft", "reason": "pace", "friction": {"warning": "slow down"}}
`)}}
	s := newStackWith(t, stackOptions{telemetry: tel, policies: pols, extra: `
limits:
  - name: acme-tokens
    dimensions: [tenant]
    unit: tokens
    rate: 100000
    period: 1m
`})
	if _, err := s.client("cg-test-acme").Chat.Completions.New(ctx, chatParams("Hello", 20)); err != nil {
		t.Fatal(err)
	}
	if err := s.srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	// Shutdown flushes the batcher: every ended span is exported.
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	spans := exp.GetSpans()
	i := slices.IndexFunc(spans, func(s tracetest.SpanStub) bool { return s.Name == "costgate /v1/chat/completions" })
	if i < 0 {
		t.Fatalf("no request span among %d spans", len(spans))
	}
	req := spans[i]
	attrs := map[attribute.Key]string{}
	for _, kv := range req.Attributes {
		attrs[kv.Key] = kv.Value.Emit()
	}
	for k, want := range map[attribute.Key]string{
		"costgate.limit": "acme-tokens", "costgate.dimension": "tenant", "costgate.policy": "pace",
		"costgate.outcome": "soft", "costgate.tenant": "acme",
	} {
		if attrs[k] != want {
			t.Errorf("request span %s = %q, want %q", k, attrs[k], want)
		}
	}

	count := map[string]int{}
	for _, sp := range spans {
		if sp.Name == req.Name {
			continue
		}
		count[sp.Name]++
		if sp.Parent.SpanID() != req.SpanContext.SpanID() || sp.SpanContext.TraceID() != req.SpanContext.TraceID() {
			t.Errorf("span %s is not a child of the request span", sp.Name)
		}
		if sp.EndTime.Before(sp.StartTime) || sp.EndTime.IsZero() {
			t.Errorf("span %s did not end", sp.Name)
		}
	}
	stages := []string{telemetry.StageIdentify, telemetry.StageEstimate, telemetry.StageDebit, telemetry.StagePolicy,
		telemetry.StageLedger, telemetry.StageUpstream, telemetry.StageSettle}
	for _, st := range stages {
		if count[st] != 1 {
			t.Errorf("%d spans named %s, want 1", count[st], st)
		}
	}
	if len(spans) != len(stages)+1 {
		t.Errorf("%d spans, want %d: %v", len(spans), len(stages)+1, count)
	}
}
