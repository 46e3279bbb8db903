package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config holds the knobs of a Telemetry. The zero value is usable: every
// field has a default.
type Config struct {
	// ServiceName is the service.name resource attribute. Default "costgate";
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it.
	ServiceName string
	// MaxTenants is the number of distinct tenant label values on metrics,
	// series and shadow counts; tenants seen after that many are folded into
	// "other". Default 100.
	MaxTenants int
	// MaxModels bounds the gen_ai.request.model values the same way. The
	// gate labels a model the price table knows by its canonical name and
	// any other as "unpriced", so the values are the table's; the bound
	// backs that up. Default 512.
	MaxModels int
	// MaxLabelValues bounds each of the configuration-derived labels: policy,
	// limit, route, dimension. Default 128.
	MaxLabelValues int
	// TopKCapacity is the number of counters in each top-throttled summary.
	// A reported count overestimates by at most N/TopKCapacity for N
	// throttled decisions in the report's window. Default 1000.
	TopKCapacity int
	// Window is the top-throttled window (reports cover the last one to two
	// windows) and the "recent" span of shadow counts (rounded up to whole
	// minutes). Between 1 minute and 60 minutes; default 5 minutes.
	Window time.Duration
	// SpanExporter, if set, receives every span in addition to the OTLP
	// exporter (in batches; Shutdown flushes). For tests and debugging.
	SpanExporter sdktrace.SpanExporter
	// Now is the clock for series, shadow and top-K windows. Default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.ServiceName == "" {
		c.ServiceName = "costgate"
	}
	if c.MaxTenants == 0 {
		c.MaxTenants = 100
	}
	if c.MaxModels == 0 {
		c.MaxModels = 512
	}
	if c.MaxLabelValues == 0 {
		c.MaxLabelValues = 128
	}
	if c.TopKCapacity == 0 {
		c.TopKCapacity = 1000
	}
	if c.Window == 0 {
		c.Window = 5 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports whether c, after defaults, is usable.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.MaxTenants < 1 {
		errs = append(errs, fmt.Errorf("MaxTenants %d: must be positive", c.MaxTenants))
	}
	if c.MaxModels < 1 {
		errs = append(errs, fmt.Errorf("MaxModels %d: must be positive", c.MaxModels))
	}
	if c.MaxLabelValues < 1 {
		errs = append(errs, fmt.Errorf("MaxLabelValues %d: must be positive", c.MaxLabelValues))
	}
	if c.TopKCapacity < 1 {
		errs = append(errs, fmt.Errorf("TopKCapacity %d: must be positive", c.TopKCapacity))
	}
	if c.Window < time.Minute || c.Window > time.Hour {
		errs = append(errs, fmt.Errorf("Window %s: must be between 1m and 1h", c.Window))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: invalid config: %w", err)
	}
	return nil
}

// Telemetry is costgate's metrics, traces and operator state. Create it with
// New; all recording and query methods are safe for concurrent use, and the
// recording methods allocate nothing once a label combination (and, for
// the top-throttled summary, a limit key) has been seen. The zero value is
// not usable.
type Telemetry struct {
	cfg Config
	now func() time.Time

	registry *prometheus.Registry
	meters   *sdkmetric.MeterProvider
	tracers  *sdktrace.TracerProvider // nil when no span exporter is configured
	tracer   trace.Tracer

	// Label interning.
	tenants, models, policies, limits, routes, dims *labelSet

	// Cells of the counters and histograms (see cells.go), by label ids.
	reqCells    *cache[reqKey, *sumCell]
	blockCells  *cache[blockKey, *sumCell]
	allowCells  *cache[allowKey, *sumCell]
	shadowCells *cache[shadowAttrKey, *sumCell]
	failCells   *lazy[sumCell]     // by limit id
	tenantCells *lazy[tenantCells] // by tenant id
	modelCells  *lazy[modelCells]  // by model id
	stageCells  [numStages]*histCell
	storeCells  [numStoreOps][numStoreResults]*histCell
	reloadCells [2]*sumCell // failure, success
	// by trigger (scheduled, stale), then failure, success
	reconcileCells [len(reconcileTriggers)][2]*sumCell
	reloadOK       metric.Int64Gauge

	failOpenTotal atomic.Int64

	ledgerFn  atomic.Pointer[func() (float64, int64)]
	breakerFn atomic.Pointer[func() BreakerState]
	storeFn   atomic.Pointer[func() StoreStats]

	budgetMu sync.Mutex
	budgets  map[budgetKey]float64 // costgate.budget.remaining

	top            *topK
	shadow         *shadowState
	series         *series
	tenantRequests []atomic.Int64 // enforced decisions since start, by tenant id
}

// New builds a Telemetry: a meter provider exporting to its own Prometheus
// registry (and over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set), and a tracer provider
// exporting over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (or to cfg.SpanExporter). With no
// span exporter, Tracer returns a no-op tracer that still carries the incoming
// span context. OTEL_METRICS_EXPORTER=none or OTEL_TRACES_EXPORTER=none turn
// the OTLP side off; OTEL_SDK_DISABLED=true turns every exporter but the
// Prometheus one off. The OTLP protocol of each signal is http/protobuf
// (the default) or grpc, per OTEL_EXPORTER_OTLP_PROTOCOL and the
// signal's own variable, which wins (see the package doc); any other
// protocol, or an endpoint that is not a URL, is an error.
//
// The caller owns the result and must call Shutdown.
func New(ctx context.Context, cfg Config) (*Telemetry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	t := &Telemetry{
		cfg:            cfg,
		now:            cfg.Now,
		registry:       prometheus.NewRegistry(),
		tenants:        newLabelSet(cfg.MaxTenants),
		models:         newLabelSet(cfg.MaxModels),
		policies:       newLabelSet(cfg.MaxLabelValues),
		limits:         newLabelSet(cfg.MaxLabelValues),
		routes:         newLabelSet(cfg.MaxLabelValues),
		dims:           newLabelSet(cfg.MaxLabelValues),
		top:            newTopK(cfg.TopKCapacity, cfg.Window),
		shadow:         newShadowState(cfg.Window),
		series:         newSeries(cfg.MaxTenants+1, cfg.MaxLabelValues+1),
		tenantRequests: make([]atomic.Int64, cfg.MaxTenants+1),
		budgets:        map[budgetKey]float64{},
	}
	ok := false
	defer func() {
		if !ok {
			_ = t.Shutdown(context.WithoutCancel(ctx))
		}
	}()

	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", cfg.ServiceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME win
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	prod := &producer{start: time.Now()}
	t.cells(prod)
	t.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	prom, err := otelprom.New(otelprom.WithRegisterer(t.registry), otelprom.WithoutScopeInfo(), otelprom.WithProducer(prod))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	if otlpEnabled(signalMetrics) {
		exp, err := newMetricExporter(ctx)
		if err != nil {
			return nil, err
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithProducer(prod))))
	}
	t.meters = sdkmetric.NewMeterProvider(mopts...)

	var topts []sdktrace.TracerProviderOption
	if otlpEnabled(signalTraces) {
		exp, err := newSpanExporter(ctx)
		if err != nil {
			return nil, err
		}
		topts = append(topts, sdktrace.WithBatcher(exp))
	}
	if cfg.SpanExporter != nil {
		topts = append(topts, sdktrace.WithBatcher(cfg.SpanExporter))
	}
	if len(topts) > 0 {
		// The sampler comes from OTEL_TRACES_SAMPLER (default parent-based
		// always-on).
		t.tracers = sdktrace.NewTracerProvider(append(topts, sdktrace.WithResource(res))...)
		t.tracer = unsampledTracer{sdk: t.tracers.Tracer(scope)}
	} else {
		t.tracer = newQuietTracer()
	}

	if err := t.gauges(); err != nil {
		return nil, err
	}
	ok = true
	return t, nil
}

const scope = "github.com/costgate/costgate/telemetry"

// Shutdown flushes and stops the exporters. It is safe to call after a
// partial New and more than once; recording after Shutdown is a no-op.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.meters != nil {
		if err := t.meters.Shutdown(ctx); err != nil && !errors.Is(err, sdkmetric.ErrReaderShutdown) {
			errs = append(errs, fmt.Errorf("meter provider: %w", err))
		}
	}
	if t.tracers != nil {
		if err := t.tracers.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("tracer provider: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: shutdown: %w", err)
	}
	return nil
}

// MetricsHandler serves the Prometheus text exposition of the metrics (see
// the package doc for the names), plus the Go runtime and process
// collectors, from the Telemetry's own registry.
func (t *Telemetry) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{})
}

// Tracer returns the tracer the proxy makes its spans with: one span per
// request and a child span per stage. Decision adds the deciding policy and
// limit to the span in its context.
func (t *Telemetry) Tracer() trace.Tracer { return t.tracer }

// Meter returns a meter of the Telemetry's meter provider, for instruments
// of other packages that should be exported beside these (on MetricsHandler
// and over OTLP). SDK instruments cost more per call than this package's
// recording methods; keep them off the per-request path.
func (t *Telemetry) Meter(name string) metric.Meter { return t.meters.Meter(name) }

// Propagator returns the W3C trace-context and baggage propagator, for
// extracting the client's traceparent and injecting it upstream.
func (t *Telemetry) Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}
