// Package telemetry is costgate's metrics, traces and the in-process
// operator state that the admin API and the dashboard read.
//
// The proxy calls it on every request, so recording is built for the hot
// path: instruments are created once in New, label values are interned into
// bounded sets (tenants past Config.MaxTenants, models past Config.MaxModels
// and policies, limits, routes and dimensions past Config.MaxLabelValues
// fold into "other"; every value is cut at MaxLabelLen bytes and made valid
// UTF-8), and the attribute set of each label combination is
// built on first use and cached, so a recording call allocates nothing.
// Limit keys (which can be per user or per IP) are never metric labels; they
// go only to the bounded top-throttled summary.
//
// # Metrics
//
// Metrics are OpenTelemetry metrics: the gauges are SDK instruments, and the
// counters and histograms, which the proxy updates on every request, are
// atomic cells that a metric Producer hands to the SDK's readers at each
// collection (see cells.go for why). MetricsHandler serves them in the
// Prometheus text format from the Telemetry's own registry (not the global
// one); the exporter turns dots into underscores and appends the unit and,
// for counters, _total. When OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT) is set they are also pushed over
// OTLP (see below) every OTEL_METRIC_EXPORT_INTERVAL, with the standard OTEL_*
// variables applying, except that counters and histograms are always
// cumulative (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta
// applies to the gauges only). Other packages can add instruments to the
// same endpoint through Meter.
//
//	OpenTelemetry name                   unit       Prometheus name                            attributes
//	costgate.requests                    {request}  costgate_requests_total                    policy, outcome, status, route
//	costgate.decisions.blocked           {request}  costgate_decisions_blocked_total           policy, limit, dimension, status
//	costgate.decisions.allowed           {request}  costgate_decisions_allowed_total           policy, limit, dimension, outcome (allow, soft)
//	costgate.decision.duration           s          costgate_decision_duration_seconds         stage
//	costgate.store.duration              s          costgate_store_duration_seconds            op, result (ok, error, timeout)
//	costgate.failopen                    {request}  costgate_failopen_total                    limit
//	costgate.shadow.would_block          {request}  costgate_shadow_would_block_total          policy, limit, tenant
//	costgate.spend                       nano_usd   costgate_spend_nano_usd_total              tenant
//	costgate.tokens                      {token}    costgate_tokens_total                      tenant, gen_ai.token.type
//	gen_ai.client.token.usage            {token}    gen_ai_client_token_usage (histogram)      gen_ai.token.type, gen_ai.request.model
//	costgate.ledger.lag                  s          costgate_ledger_lag_seconds                (gauge)
//	costgate.ledger.spool.size           By         costgate_ledger_spool_size_bytes           (gauge)
//	costgate.store.breaker.state                    costgate_store_breaker_state               state (closed, open, half_open); 1 for the current state
//	costgate.config.reloads              {reload}   costgate_config_reloads_total              result (success, failure)
//	costgate.config.last_reload_success             costgate_config_last_reload_success        (gauge, 1 or 0)
//	costgate.budget.reconcile            {reconcile} costgate_budget_reconcile_total          trigger (reconcile, stale), result (success, failure)
//	costgate.budget.remaining                       costgate_budget_remaining                  limit, tenant (gauge, 0 to 1)
//	costgate.store.overloaded            {call}     costgate_store_overloaded_total            (observed from the Redis store)
//	costgate.store.unknown_outcomes      {call}     costgate_store_unknown_outcomes_total      (observed from the Redis store)
//	costgate.store.late_cancels          {call}     costgate_store_late_cancels_total          (observed from the Redis store)
//	costgate.store.late_lost             {call}     costgate_store_late_lost_total             (observed from the Redis store)
//
// The decision counters are bounded by the configuration, not by traffic:
// policy, limit, route and dimension values are names from the config file
// (a policy's package, a limit's or budget's name, a route path, a limit's
// dimensions joined by "+"), never values taken from a request, and each is
// capped at MaxLabelValues; outcome and status are small closed sets.
// costgate.decisions.allowed and .blocked name the limit that decided (for
// an admitted request the most constraining one, "none" when no limit
// applies) and that limit's dimension, so their series are at most the
// policies times the limits, by outcome or status. Tenant is a label only
// on the per-tenant series (shadow would-blocks, spend, tokens), capped at
// MaxTenants; a limit's key (a user, an IP) is never a label.
//
// costgate.budget.reconcile counts each tenant's restore of its budget
// counters from the ledger (trigger reconcile: the proxy's periodic
// reconciliation; stale: counters the store found stale), and a
// reconciliation that could not start as one failure; every series exists
// from the start at 0. costgate.budget.remaining is each budget's share
// left for each configured tenant, for the tenant's most spent key, as the
// ledger said at the last reconciliation (so up to
// store.reconcile_interval old); budget and tenant names come from the
// configuration. The costgate.store.* counters are weighted.RedisStats,
// present only with a Redis store: calls that got no decision.
//
// Histograms have the buckets _bucket{le=...}, _sum and _count. Durations
// are in seconds with buckets from 5 µs to 60 s; token usage uses the
// buckets advised by the OpenTelemetry GenAI semantic conventions (1, 4,
// 16, ... 67108864). Attribute names become label names the same way
// (gen_ai.token.type is gen_ai_token_type). The registry also carries the
// standard go_* and process_* collectors and target_info with the resource
// (service.name is Config.ServiceName unless OTEL_SERVICE_NAME is set).
//
// Outcomes (the Outcome constants) are "allow", "soft" (served with
// friction) and "hard" (refused;
// costgate.decisions.blocked and the top-throttled keys leave out hard
// decisions answered 503, which are store outages, not throttling);
// stages are identify, estimate, debit, policy, ledger, upstream, settle and
// total; store ops (the StoreOp constants) are debit, settle, cancel, peek,
// renew (a concurrency lease), reset and restore (budget counters brought
// up to the ledger); breaker states are the BreakerState constants. Unknown
// values of
// these closed sets are recorded as "other", an empty label value as "none".
//
// # Traces
//
// Tracer returns the tracer for the proxy's spans (one per request, a child
// per stage; the settle stage's child starts before the request's span ends
// and ends after it, once the request is settled on another goroutine). Decision sets the deciding tenant, route, model, policy,
// limit, dimension, outcome and status on the span in its context. Spans
// are exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, sampled per
// OTEL_TRACES_SAMPLER; otherwise Tracer is a no-op that still propagates the
// caller's span context. Recording every span is expensive next to a
// request (about 9 to 13 µs of CPU for a request span and seven stage spans,
// bench/README.md), so in production sample: OTEL_TRACES_SAMPLER=
// parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG=0.01 costs about
// 0.7 µs, since the children of a dropped span skip the SDK.
//
// # OTLP
//
// Each signal is exported over OTLP/HTTP with protobuf bodies (the default)
// or OTLP/gRPC: OTEL_EXPORTER_OTLP_METRICS_PROTOCOL and
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL choose, for their signal, between
// http/protobuf and grpc, and OTEL_EXPORTER_OTLP_PROTOCOL chooses for a
// signal whose own variable is unset. Any other value (http/json among them)
// makes New fail with an error naming the variable. The exporters are the
// official ones and read the other OTEL_EXPORTER_OTLP_* variables (headers,
// TLS, timeout, compression, with the signal's own variable winning)
// themselves. The endpoint means what the specification says for each
// protocol:
//
//   - http/protobuf: OTEL_EXPORTER_OTLP_ENDPOINT is a base URL that
//     /v1/metrics and /v1/traces are appended to (http://collector:4318
//     sends to http://collector:4318/v1/traces); a signal's own endpoint
//     variable is the full URL, used as it is.
//   - grpc: the endpoint is the collector's address as a URL,
//     http://collector:4317 for plaintext or https://collector:4317 for TLS;
//     a path is ignored. A bare host:port (collector:4317) works with
//     OTEL_EXPORTER_OTLP_INSECURE=true for plaintext.
//
// An endpoint that does not parse as a URL (127.0.0.1:4317: a bare address
// whose host is an IP) is an error rather than what the exporters would do
// with it, which is to log it and send to localhost.
//
// # Operator state
//
// TopThrottled, Shadow and Series are the admin API's and the dashboard's
// views: the most throttled limit keys (a Space-Saving summary with a
// stated error bound, over a tumbling window), the would-block counts of
// shadow-mode policies and limits (since start and over the recent window,
// with each tenant's request count beside them), and per-minute series of
// the last hour. They live in memory, per process: each replica reports its
// own traffic.
package telemetry
