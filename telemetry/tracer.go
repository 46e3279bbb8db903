package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// quietTracer is the tracer when no span exporter is configured. It behaves
// as the no-op tracer of go.opentelemetry.io/otel/trace/noop, whose Start
// returns the context's span when that span does not record (a remote
// parent from the client's traceparent, or none) and wraps it in a new
// context; quietTracer returns the caller's context unchanged in that case,
// since it already holds that span, which saves a context allocation per
// span (eight per request).
type quietTracer struct {
	embedded.Tracer
	noop trace.Tracer
}

func newQuietTracer() quietTracer {
	return quietTracer{noop: noop.NewTracerProvider().Tracer(scope)}
}

func (t quietTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if span := trace.SpanFromContext(ctx); !span.IsRecording() {
		return ctx, span
	}
	// A recording span from another tracer provider: let the no-op tracer
	// decide, as it would without this shortcut.
	return t.noop.Start(ctx, name, opts...)
}

// unsampledTracer wraps the SDK tracer. A child of a local span that the
// sampler dropped is dropped too, without asking the SDK, which would
// allocate a non-recording span and a context for it (about 250 ns each):
// Start returns the caller's context and its span. This is what the SDK
// decides anyway for every standard sampler (always_on never drops a span;
// always_off, traceidratio and the parentbased_* samplers drop the local
// children of a dropped span), but not necessarily for a custom sampler.
// Remote parents (the client's traceparent) still go to the SDK, so
// always_on and the parentbased_*_remote_* choices apply to them.
type unsampledTracer struct {
	embedded.Tracer
	sdk trace.Tracer
}

func (t unsampledTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	span := trace.SpanFromContext(ctx)
	if sc := span.SpanContext(); sc.IsValid() && !sc.IsRemote() && !span.IsRecording() {
		return ctx, span
	}
	return t.sdk.Start(ctx, name, opts...)
}
