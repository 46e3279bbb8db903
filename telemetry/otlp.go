package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The OTLP exporters are the official ones; each reads the rest of its
// configuration (endpoint, headers, TLS, timeout, compression) from the
// standard OTEL_EXPORTER_OTLP_* variables itself. This file only decides
// whether a signal is exported and over which protocol, and refuses what the
// exporters would otherwise ignore silently.

// The signals, as they appear in the names of the OTEL_* variables.
const (
	signalMetrics = "METRICS"
	signalTraces  = "TRACES"
)

// The OTLP protocols, as OTEL_EXPORTER_OTLP_PROTOCOL spells them.
const (
	protocolHTTP = "http/protobuf"
	protocolGRPC = "grpc"
)

// otlpEnabled reports whether signal is exported over OTLP: an endpoint is
// set and neither OTEL_SDK_DISABLED nor OTEL_<signal>_EXPORTER=none says no.
func otlpEnabled(signal string) bool {
	if os.Getenv("OTEL_SDK_DISABLED") == "true" || os.Getenv("OTEL_"+signal+"_EXPORTER") == "none" {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// otlpSetting returns the value of the signal's own variable
// OTEL_EXPORTER_OTLP_<signal>_<name> if it is set, else that of the general
// OTEL_EXPORTER_OTLP_<name>, with the name of the variable it came from.
func otlpSetting(signal, name string) (value, from string) {
	from = "OTEL_EXPORTER_OTLP_" + signal + "_" + name
	if v := os.Getenv(from); v != "" {
		return v, from
	}
	from = "OTEL_EXPORTER_OTLP_" + name
	return os.Getenv(from), from
}

// otlpProtocol returns the OTLP protocol of signal: http/protobuf unless the
// signal's protocol variable (or, when that is unset, the general one) says
// grpc. Anything else, http/json included, is an error.
func otlpProtocol(signal string) (string, error) {
	p, from := otlpSetting(signal, "PROTOCOL")
	switch p {
	case "", protocolHTTP:
		return protocolHTTP, nil
	case protocolGRPC:
		return protocolGRPC, nil
	}
	return "", fmt.Errorf("telemetry: %s=%q: OTLP protocol not supported for %s; use %s or %s",
		from, p, strings.ToLower(signal), protocolHTTP, protocolGRPC)
}

// checkEndpoint refuses an endpoint the exporters cannot parse as a URL
// (127.0.0.1:4317, for one): they would log it and send to their default,
// localhost, instead.
func checkEndpoint(signal string) error {
	e, from := otlpSetting(signal, "ENDPOINT")
	if _, err := url.Parse(e); err != nil {
		return fmt.Errorf("telemetry: %s=%q: not a URL; write http://host:port (plaintext) or https://host:port (TLS): %w", from, e, err)
	}
	return nil
}

// newMetricExporter returns the OTLP metric exporter of the configured
// protocol.
func newMetricExporter(ctx context.Context) (sdkmetric.Exporter, error) {
	p, err := otlpProtocol(signalMetrics)
	if err != nil {
		return nil, err
	}
	if err := checkEndpoint(signalMetrics); err != nil {
		return nil, err
	}
	var exp sdkmetric.Exporter
	if p == protocolGRPC {
		exp, err = otlpmetricgrpc.New(ctx)
	} else {
		exp, err = otlpmetrichttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: otlp metric exporter (%s): %w", p, err)
	}
	return exp, nil
}

// newSpanExporter returns the OTLP span exporter of the configured protocol.
func newSpanExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	p, err := otlpProtocol(signalTraces)
	if err != nil {
		return nil, err
	}
	if err := checkEndpoint(signalTraces); err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if p == protocolGRPC {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: otlp trace exporter (%s): %w", p, err)
	}
	return exp, nil
}
