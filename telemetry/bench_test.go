package telemetry

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkRequest measures the instrumentation of one request as the proxy
// does it: one Decision, eight Stage calls, one StoreOp and one Usage, over a
// realistic spread of tenants, policies and outcomes. BenchmarkRequestOff is
// the same loop with the recording calls left out, in the same run, so the
// difference is the instrumentation's cost per request.
//
// BenchmarkRequest/sdk is the same sequence of recordings made through the
// OpenTelemetry SDK's own synchronous instruments with pre-built attribute
// sets, the design this package replaced with its own cells (see cells.go).
func BenchmarkRequest(b *testing.B) {
	b.Run("on", func(b *testing.B) { benchRequest(b, true) })
	b.Run("off", func(b *testing.B) { benchRequest(b, false) })
	b.Run("sdk", benchRequestSDK)
}

// benchWork stands in for the request's own work so that the "off" loop is
// not empty; it is identical in both variants.
var benchSink atomic.Int64

// reportCPU resets the timer and returns a function that reports the
// process's CPU time (user and system) per operation since then, as
// cpu-ns/op. On a shared machine ns/op (wall time) includes the time the
// benchmark's goroutines waited for a CPU; cpu-ns/op does not.
func reportCPU(b *testing.B) func() {
	var before syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &before); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	return func() {
		b.StopTimer()
		var after syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &after); err != nil {
			b.Fatal(err)
		}
		cpu := time.Duration(after.Utime.Nano() - before.Utime.Nano() + after.Stime.Nano() - before.Stime.Nano())
		b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
	}
}

func benchRequest(b *testing.B, on bool) {
	tm, err := New(context.Background(), Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer tm.Shutdown(context.Background())
	const nTenants = 50
	decisions := make([]Decision, 0, nTenants*4)
	for i := range nTenants {
		tenant := "tenant-" + strconv.Itoa(i)
		decisions = append(decisions,
			Decision{Tenant: tenant, Route: "chat", Model: "gpt-4o-mini", Policy: "plans", Outcome: "allow", Status: 200},
			Decision{Tenant: tenant, Route: "chat", Model: "gpt-4o-mini", Policy: "plans", Outcome: "allow", Status: 200},
			Decision{Tenant: tenant, Route: "chat", Model: "gpt-4o", Policy: "budget", Limit: "tokens-per-min", Dimension: "tenant", Outcome: "soft", Status: 200, Key: "tpm:" + tenant},
			Decision{Tenant: tenant, Route: "chat", Model: "gpt-4o", Policy: "plans", Limit: "req-per-min", Dimension: "tenant", Outcome: "hard", Status: 429, Key: "rpm:" + tenant},
		)
	}
	stages := []string{StageIdentify, StageEstimate, StageDebit, StagePolicy, StageLedger, StageUpstream, StageSettle, StageTotal}
	storeErr := errors.New("boom")
	ctx := context.Background()
	var seq atomic.Int64
	b.ReportAllocs()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1) * 7919)
		for pb.Next() {
			i++
			d := decisions[i%len(decisions)]
			var err error
			if i%100 == 0 {
				err = storeErr
			}
			dur := time.Duration(i%1000) * time.Microsecond
			if on {
				tm.Decision(ctx, d)
				for _, s := range stages {
					tm.Stage(s, dur)
				}
				tm.StoreOp(StoreDebit, dur, err)
				tm.Usage(d.Tenant, d.Model, 512, 128, 1234)
			} else if err != nil && dur < 0 {
				benchSink.Add(1) // never taken; keeps the loop's loads live
			}
		}
	})
}

func benchRequestSDK(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	m := mp.Meter("bench")
	requests, _ := m.Int64Counter("requests")
	blocked, _ := m.Int64Counter("blocked")
	spend, _ := m.Int64Counter("spend")
	tokens, _ := m.Int64Counter("tokens")
	stageDur, _ := m.Float64Histogram("stage", metric.WithExplicitBucketBoundaries(durationBounds...))
	storeDur, _ := m.Float64Histogram("store", metric.WithExplicitBucketBoundaries(durationBounds...))
	usage, _ := m.Int64Histogram("usage", metric.WithExplicitBucketBoundaries(tokenBounds...))
	opt := func(kv ...attribute.KeyValue) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
	}
	rec := func(kv ...attribute.KeyValue) []metric.RecordOption {
		return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
	}
	type tenantOpts struct{ req, block, spend, in, out []metric.AddOption }
	const nTenants = 50
	tenants := make([]tenantOpts, nTenants)
	for i := range tenants {
		tn := attribute.String("tenant", "tenant-"+strconv.Itoa(i))
		tenants[i] = tenantOpts{
			req:   opt(attribute.String("policy", "plans"), attribute.String("outcome", "allow")),
			block: opt(attribute.String("policy", "plans"), attribute.String("limit", "rpm")),
			spend: opt(tn),
			in:    opt(tn, attribute.String("type", "input")),
			out:   opt(tn, attribute.String("type", "output")),
		}
	}
	var stages [8][]metric.RecordOption
	for i := range stages {
		stages[i] = rec(attribute.Int("stage", i))
	}
	storeOpt := rec(attribute.String("op", "debit"))
	usageIn := rec(attribute.String("type", "input"))
	usageOut := rec(attribute.String("type", "output"))
	ctx := context.Background()
	var seq atomic.Int64
	b.ReportAllocs()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1) * 7919)
		for pb.Next() {
			i++
			tn := &tenants[(i/4)%nTenants]
			dur := (time.Duration(i%1000) * time.Microsecond).Seconds()
			requests.Add(ctx, 1, tn.req...)
			if i%4 == 3 {
				blocked.Add(ctx, 1, tn.block...)
			}
			for _, s := range stages {
				stageDur.Record(ctx, dur, s...)
			}
			storeDur.Record(ctx, dur, storeOpt...)
			usage.Record(ctx, 512, usageIn...)
			usage.Record(ctx, 128, usageOut...)
			tokens.Add(ctx, 512, tn.in...)
			tokens.Add(ctx, 128, tn.out...)
			spend.Add(ctx, 1234, tn.spend...)
		}
	})
}

// BenchmarkSpans measures the tracing the proxy adds per request (a request
// span and a child per stage, seven, with Decision's attributes) with no
// exporter configured (the no-op tracer, the default) and with an exporter
// (every span sampled, or 1% of requests sampled, and batched to an exporter
// that drops them).
func BenchmarkSpans(b *testing.B) {
	b.Run("noop", func(b *testing.B) { benchSpans(b, Config{}) })
	b.Run("exported", func(b *testing.B) { benchSpans(b, Config{SpanExporter: discardSpans{}}) })
	b.Run("exported-1pct", func(b *testing.B) {
		b.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
		b.Setenv("OTEL_TRACES_SAMPLER_ARG", "0.01")
		benchSpans(b, Config{SpanExporter: discardSpans{}})
	})
}

type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

func benchSpans(b *testing.B, cfg Config) {
	tm, err := New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer tm.Shutdown(context.Background())
	stages := []string{StageIdentify, StageEstimate, StageDebit, StagePolicy, StageLedger, StageUpstream, StageSettle}
	tr := tm.Tracer()
	d := Decision{Tenant: "acme", Route: "chat", Model: "gpt-4o-mini", Policy: "plans", Outcome: "allow", Status: 200}
	b.ReportAllocs()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, span := tr.Start(context.Background(), "request")
			for _, s := range stages {
				_, child := tr.Start(ctx, s)
				child.End()
			}
			tm.Decision(ctx, d)
			span.End()
		}
	})
}
