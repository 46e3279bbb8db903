package telemetry

import (
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// otlpSink records what an OTLP receiver was sent: metric names, span names,
// the service.name of the resource and, for OTLP/HTTP, the request paths.
type otlpSink struct {
	mu      sync.Mutex
	metrics map[string]bool
	spans   []string
	service string
	paths   map[string]bool
}

func newOTLPSink() *otlpSink {
	return &otlpSink{metrics: map[string]bool{}, paths: map[string]bool{}}
}

func (s *otlpSink) addMetrics(req *colmetricpb.ExportMetricsServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, kv := range rm.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				s.service = kv.GetValue().GetStringValue()
			}
		}
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				s.metrics[m.GetName()] = true
			}
		}
	}
}

func (s *otlpSink) addSpans(req *coltracepb.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s.spans = append(s.spans, sp.GetName())
			}
		}
	}
}

// exportedMetrics are metrics recordRequest makes: cells (counters and
// histograms) and an SDK gauge.
var exportedMetrics = []string{"costgate.requests", "costgate.spend", "gen_ai.client.token.usage", "costgate.decision.duration", "costgate.config.last_reload_success"}

// checkMetrics reports whether s received every one of exportedMetrics.
func (s *otlpSink) checkMetrics(t *testing.T, via string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range exportedMetrics {
		if !s.metrics[name] {
			t.Errorf("%s receiver's metrics lack %s; got %v", via, name, slices.Sorted(maps.Keys(s.metrics)))
		}
	}
}

// checkSpans reports whether s received exactly the span "request".
func (s *otlpSink) checkSpans(t *testing.T, via string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.spans) != 1 || s.spans[0] != "request" {
		t.Errorf("%s receiver's spans = %v, want [request]", via, s.spans)
	}
}

// checkEmpty reports whether s received nothing.
func (s *otlpSink) checkEmpty(t *testing.T, via string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.metrics) > 0 || len(s.spans) > 0 {
		t.Errorf("%s receiver got metrics %v and spans %v, want nothing", via, slices.Sorted(maps.Keys(s.metrics)), s.spans)
	}
}

// startHTTPReceiver serves OTLP/HTTP (protobuf) on loopback; it accepts any
// path that ends in /v1/metrics or /v1/traces and records the path.
func startHTTPReceiver(t *testing.T) (baseURL string, sink *otlpSink) {
	t.Helper()
	sink = newOTLPSink()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read %s: %v", r.URL.Path, err)
		}
		sink.mu.Lock()
		sink.paths[r.URL.Path] = true
		sink.mu.Unlock()
		switch {
		case strings.HasSuffix(r.URL.Path, "/v1/metrics"):
			var req colmetricpb.ExportMetricsServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				t.Errorf("decode metrics: %v", err)
			}
			sink.addMetrics(&req)
		case strings.HasSuffix(r.URL.Path, "/v1/traces"):
			var req coltracepb.ExportTraceServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				t.Errorf("decode traces: %v", err)
			}
			sink.addSpans(&req)
		default:
			t.Errorf("unexpected OTLP path %s", r.URL.Path)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, sink
}

// grpcMetrics and grpcTraces are the collector's two OTLP/gRPC services,
// writing to one sink.
type grpcMetrics struct {
	colmetricpb.UnimplementedMetricsServiceServer
	sink *otlpSink
}

func (g grpcMetrics) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	g.sink.addMetrics(req)
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

type grpcTraces struct {
	coltracepb.UnimplementedTraceServiceServer
	sink *otlpSink
}

func (g grpcTraces) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.sink.addSpans(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startGRPCReceiver serves OTLP/gRPC, without TLS, on a loopback port and
// returns the port.
func startGRPCReceiver(t *testing.T) (port string, sink *otlpSink) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sink = newOTLPSink()
	srv := grpc.NewServer()
	colmetricpb.RegisterMetricsServiceServer(srv, grpcMetrics{sink: sink})
	coltracepb.RegisterTraceServiceServer(srv, grpcTraces{sink: sink})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil {
			t.Errorf("grpc serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	_, port, err = net.SplitHostPort(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return port, sink
}

// recordRequest makes a Telemetry from the environment, records one
// request's metrics and its span "request" through the public API, and shuts
// it down, which flushes both exporters.
func recordRequest(t *testing.T) {
	t.Helper()
	tm, err := New(context.Background(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := tm.Tracer().Start(context.Background(), "request")
	tm.Decision(ctx, Decision{Tenant: "acme", Policy: "plans", Outcome: "allow", Status: 200})
	tm.Usage("acme", "gpt-4o", 5, 6, 7)
	tm.Stage(StageTotal, time.Millisecond)
	tm.Reload(true)
	span.End()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tm.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
}

// TestOTLPExport points the standard OTEL_* variables at an httptest server
// and checks that Shutdown delivers metrics (the cells and the SDK gauges)
// and traces to it over OTLP/HTTP, at the paths the endpoint variables
// give: the general endpoint is a base URL that /v1/metrics and /v1/traces
// are appended to, a signal's own endpoint is used as it is.
func TestOTLPExport(t *testing.T) {
	tests := []struct {
		name      string
		env       func(base string) map[string]string
		wantPaths []string
	}{
		{"base URL", func(base string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": base}
		}, []string{"/v1/metrics", "/v1/traces"}},
		{"base URL with a path", func(base string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": base + "/otlp"}
		}, []string{"/otlp/v1/metrics", "/otlp/v1/traces"}},
		{"signal URLs as they are", func(base string) map[string]string {
			return map[string]string{
				"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": base + "/m/v1/metrics",
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":  base + "/t/v1/traces",
			}
		}, []string{"/m/v1/metrics", "/t/v1/traces"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base, sink := startHTTPReceiver(t)
			for k, v := range tc.env(base) {
				t.Setenv(k, v)
			}
			t.Setenv("OTEL_SERVICE_NAME", "costgate-test")
			recordRequest(t)
			sink.checkMetrics(t, "http")
			sink.checkSpans(t, "http")
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if got := slices.Sorted(maps.Keys(sink.paths)); !slices.Equal(got, tc.wantPaths) {
				t.Errorf("paths = %v, want %v", got, tc.wantPaths)
			}
			if sink.service != "costgate-test" {
				t.Errorf("service.name = %q, want OTEL_SERVICE_NAME's costgate-test", sink.service)
			}
		})
	}
}

// TestOTLPGRPCExport sets the protocol to grpc and checks that Shutdown
// delivers metrics and traces to a gRPC receiver, for each form of the
// endpoint: a URL, whose http scheme means plaintext and whose path gRPC
// ignores, or a host:port with OTEL_EXPORTER_OTLP_INSECURE.
func TestOTLPGRPCExport(t *testing.T) {
	tests := []struct {
		name string
		env  func(port string) map[string]string
	}{
		{"http URL", func(port string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:" + port}
		}},
		{"URL path ignored", func(port string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:" + port + "/otlp"}
		}},
		{"host:port insecure", func(port string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:" + port, "OTEL_EXPORTER_OTLP_INSECURE": "true"}
		}},
		{"signal endpoints", func(port string) map[string]string {
			return map[string]string{
				"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:" + port,
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":  "http://127.0.0.1:" + port,
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			port, sink := startGRPCReceiver(t)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
			for k, v := range tc.env(port) {
				t.Setenv(k, v)
			}
			t.Setenv("OTEL_SERVICE_NAME", "costgate-test")
			recordRequest(t)
			sink.checkMetrics(t, "grpc")
			sink.checkSpans(t, "grpc")
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if sink.service != "costgate-test" {
				t.Errorf("service.name = %q, want OTEL_SERVICE_NAME's costgate-test", sink.service)
			}
		})
	}
}

// TestOTLPProtocolPerSignal checks that a signal's own protocol variable
// wins over OTEL_EXPORTER_OTLP_PROTOCOL, both ways, with a gRPC and an HTTP
// receiver side by side; each signal's endpoint points at the receiver of
// the protocol it should use.
func TestOTLPProtocolPerSignal(t *testing.T) {
	tests := []struct {
		name                     string
		general, metrics, traces string // protocol variables; "" leaves one unset
		metricsGRPC, tracesGRPC  bool
	}{
		{"general grpc", "grpc", "", "", true, true},
		{"traces http/protobuf over general grpc", "grpc", "", "http/protobuf", true, false},
		{"metrics grpc over general http/protobuf", "http/protobuf", "grpc", "", true, false},
		{"metrics grpc over default", "", "grpc", "", true, false},
		{"signals over an unsupported general", "http/json", "grpc", "grpc", true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			port, gsink := startGRPCReceiver(t)
			base, hsink := startHTTPReceiver(t)
			for k, v := range map[string]string{
				"OTEL_EXPORTER_OTLP_PROTOCOL":         tc.general,
				"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": tc.metrics,
				"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL":  tc.traces,
			} {
				if v != "" {
					t.Setenv(k, v)
				}
			}
			msink, tsink := hsink, hsink
			t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", base+"/v1/metrics")
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", base+"/v1/traces")
			if tc.metricsGRPC {
				msink = gsink
				t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:"+port)
			}
			if tc.tracesGRPC {
				tsink = gsink
				t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:"+port)
			}
			recordRequest(t)
			msink.checkMetrics(t, "metrics")
			tsink.checkSpans(t, "traces")
			if !tc.metricsGRPC && !tc.tracesGRPC {
				gsink.checkEmpty(t, "grpc")
			}
			if tc.metricsGRPC && tc.tracesGRPC {
				hsink.checkEmpty(t, "http")
			}
		})
	}
}

// TestOTLPConfigRejected checks that an OTLP protocol other than grpc and
// http/protobuf, and an endpoint that is not a URL, make New fail with an
// error that names the variable and what to write instead.
func TestOTLPConfigRejected(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"http/json", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			[]string{`OTEL_EXPORTER_OTLP_PROTOCOL="http/json"`, "metrics", "http/protobuf", "grpc"}},
		// The metric exporter is up when the trace one fails: New must shut
		// it down.
		{"traces only", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
			[]string{`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/json"`, "traces", "http/protobuf", "grpc"}},
		{"signal's own over a supported general", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http"},
			[]string{`OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="http"`, "http/protobuf", "grpc"}},
		{"grpc endpoint not a URL", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4317"},
			[]string{`OTEL_EXPORTER_OTLP_ENDPOINT="127.0.0.1:4317"`, "not a URL", "http://host:port"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tm, err := New(context.Background(), Config{})
			if err == nil {
				tm.Shutdown(context.Background())
				t.Fatalf("New accepted %v", tc.env)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %s", err, w)
				}
			}
		})
	}
}
