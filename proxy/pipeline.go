package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/trace"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// exchange is the state of one request as it moves through the stages.
// It is owned by the request's goroutine (the reverse proxy's hooks run on
// it too) until the answer is sent, then by the goroutine that settles it,
// which only reads it.
type exchange struct {
	s  *Server
	st *state // the configuration the request started with
	id string
	// resID names the request's reservation in the limiter: its id, or,
	// after a shadow limit's denial, another one for the second debit (on
	// Redis Cluster a denial's compensation closes the first id).
	resID    string
	start    time.Time
	path     string
	kind     costmodel.Kind
	caller   *caller
	upstream *upstream
	ip       string
	est      costmodel.Estimate

	limits []*compiledLimit // the limits that apply, parallel to items
	items  []weighted.Item
	// Room for the limits and items of most requests, in the exchange's
	// own allocation.
	limitsBuf [4]*compiledLimit
	itemsBuf  [4]weighted.Item
	result    weighted.Result
	decision  policies.Decision
	friction  string // the Costgate-Friction value, if any

	status      int   // the upstream's status, or costgate's on an upstream failure
	upstreamErr error // set when the upstream gave no answer
	body        *meteredBody

	injectedUsage bool            // costgate asked the upstream for a stream usage report
	rule          *costmodel.Rule // a generic upstream's cost rule; nil for LLM routes
	subpath       string          // a generic request's path after /u/NAME, read once (see genericPath)
	respHeader    http.Header     // the upstream's response header
	page          int64           // the result page a paginated generic request asks for; 0: none
	degraded      bool            // the store failed; the reservation is in the local fallback fb
	fb            *freshStore     // the local fallback that holds the reservation, when degraded
	model         string          // the canonical model, which model limits are keyed by
	leased        bool            // registered with the renewer (see renewer.remove)
	settled       bool            // fin is worked out (see final)
	fin           settlement
	ledgerSettled bool // the ledger entry is final
	earlyTried    bool // settleEarly ran

	ctx     context.Context // carries the request's span
	span    trace.Span
	outcome telemetry.Outcome // for telemetry; OutcomeNone: no decision was made
	answer  int               // the status costgate answered with itself (blocked, failed closed)
	blocked *compiledLimit    // the limit that refused the request, if one did
}

// stageTimer times one stage of a request, as a metric and a child span.
type stageTimer struct {
	x     *exchange
	name  string
	start time.Time
	span  trace.Span
}

func (x *exchange) begin(name string) stageTimer {
	_, sp := x.s.tel.Tracer().Start(x.ctx, name)
	return stageTimer{x: x, name: name, start: time.Now(), span: sp}
}

func (t stageTimer) end() {
	t.span.End()
	t.x.s.tel.Stage(t.name, time.Since(t.start))
}

// record reports the request's decision to telemetry and logs it: a
// refused request at info level, a served one at debug level.
func (x *exchange) record() {
	if x.outcome == telemetry.OutcomeNone {
		return
	}
	d := telemetry.Decision{Tenant: x.caller.tenant, Route: x.path, Model: x.est.Model, Policy: x.decision.Policy, Outcome: x.outcome}
	d.Status = x.answer
	if d.Status == 0 {
		d.Status = x.status
	}
	if x.blocked != nil {
		d.Limit = x.blocked.limit.Name
		d.Dimension = x.blocked.dimension
		d.Key = x.blocked.key(x)
	} else if i := x.result.Decider; i >= 0 && i < len(x.limits) {
		d.Limit = x.limits[i].limit.Name
		d.Dimension = x.limits[i].dimension
	}
	x.s.tel.Decision(x.ctx, d)
	x.s.refusals.record(d, x.blocked)
	if x.outcome == telemetry.OutcomeHard {
		x.s.log.Info("request refused", "request_id", x.id, "tenant", x.caller.tenant, "user", x.caller.user,
			"route", x.path, "model", x.est.Model, "status", d.Status, "limit", d.Limit, "dimension", d.Dimension, "policy", d.Policy)
	} else if x.s.log.Enabled(x.ctx, slog.LevelDebug) {
		x.s.log.Debug("request served", "request_id", x.id, "tenant", x.caller.tenant, "route", x.path, "model", x.est.Model,
			"status", d.Status, "outcome", x.outcome, "limit", d.Limit, "policy", d.Policy)
	}
}

type ctxKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(ctxKey{}).(*exchange)
	return x
}

// newRequestID returns "req_" and 128 bits in hex: 48 bits of Unix
// milliseconds, then 80 random bits. The time prefix keeps ids in the order
// requests arrived, so that the ledger, which keys entries by id, appends
// to its index instead of writing all over it.
func newRequestID() string {
	var b [16]byte
	ms := uint64(time.Now().UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (8 * (5 - i)))
	}
	r1, r2 := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		b[6+i] = byte(r1 >> (8 * i))
	}
	b[14], b[15] = byte(r2), byte(r2>>8)
	return "req_" + hex.EncodeToString(b[:])
}

// identify maps the request's API key to its caller.
func (st *state) identify(r *http.Request) *caller {
	key := r.Header.Get("X-Api-Key")
	if key == "" {
		auth := r.Header.Get("Authorization")
		if len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
			key = strings.TrimSpace(auth[7:])
		}
	}
	if key == "" {
		return nil
	}
	return st.keys[sha256.Sum256([]byte(key))]
}

func (x *exchange) dimension(d string) string {
	switch d {
	case "tenant":
		return x.caller.tenant
	case "user":
		return x.caller.user
	case "api_key":
		return x.caller.keyID
	case "ip":
		return x.ip
	case "model":
		return x.model
	case "route":
		return x.path
	case "upstream":
		return x.upstream.name
	case "region":
		return x.st.cfg.Region
	}
	return ""
}

// serveLLM returns the handler of one priced API path.
func (s *Server) serveLLM(path string, kind costmodel.Kind) gin.HandlerFunc {
	return func(c *gin.Context) {
		s.serve(c.Writer, c.Request, path, kind, "")
	}
}

// serveGeneric serves /u/{upstream}/..., priced by the upstream's cost rule.
func (s *Server) serveGeneric(c *gin.Context) {
	s.serve(c.Writer, c.Request, "/u/"+c.Param("upstream"), costmodel.Generic, c.Param("upstream"))
}

// serve runs the pipeline. path is the route's name (the API path, or
// /u/NAME for a generic upstream); generic names the generic upstream.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, path string, kind costmodel.Kind, generic string) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1) // the first deferred, so the last to run: after settle
	x := &exchange{s: s, st: s.state.Load(), id: newRequestID(), start: time.Now(), path: path, kind: kind}
	x.resID = x.id
	w.Header().Set("X-Request-Id", x.id)
	x.ctx, x.span = s.tel.Tracer().Start(r.Context(), "costgate "+path, trace.WithSpanKind(trace.SpanKindServer))
	defer func() {
		x.span.End()
		s.tel.Stage(telemetry.StageTotal, time.Since(x.start))
	}()

	// 1. Identify.
	t := x.begin(telemetry.StageIdentify)
	x.caller = x.st.identify(r)
	t.end()
	if x.caller == nil {
		writeError(w, path, http.StatusUnauthorized, apiError{
			Type: "authentication_error", Code: "invalid_api_key",
			Message: "missing or unknown API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
		})
		return
	}
	if generic != "" {
		if u := x.st.upstreams[generic]; u != nil && u.kind == "generic" {
			x.upstream = u
		}
	} else {
		x.upstream = x.st.routes[path]
	}
	if x.upstream == nil {
		writeError(w, path, http.StatusNotFound, apiError{
			Type: "invalid_request_error", Code: "no_upstream",
			Message: "no upstream is configured for " + path,
		})
		return
	}
	if generic != "" {
		var ref *refusal
		if x.subpath, ref = x.upstream.admit(r); ref != nil {
			ref.write(w, path)
			return
		}
		x.rule = x.upstream.rule(x.subpath)
	}
	defer x.record()
	x.ip, _, _ = net.SplitHostPort(r.RemoteAddr)
	// A caller whose request-count limit is known to be spent is refused
	// before its body is read and estimated.
	if s.refuseEarly(w, x) {
		return
	}
	// A client that sends its body slowly holds the request no longer than
	// bodyReadTimeout (the server bounds only the header's read).
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(x.start.Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, x.st.cfg.MaxBodyBytes))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The deadline stays, and the connection closes: the server would
		// otherwise wait for the rest of the body before it answers.
		w.Header().Set("Connection", "close")
		writeError(w, path, http.StatusRequestTimeout, apiError{
			Type: "invalid_request_error", Code: "body_timeout",
			Message: fmt.Sprintf("the request body did not arrive within %s", bodyReadTimeout),
		})
		return
	}
	rc.SetReadDeadline(time.Time{})
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, path, http.StatusRequestEntityTooLarge, apiError{
				Type: "invalid_request_error", Code: "body_too_large",
				Message: fmt.Sprintf("request body is larger than the limit of %d bytes", tooBig.Limit),
			})
			return
		}
		writeError(w, path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "unreadable_body", Message: "reading the request body: " + err.Error(),
		})
		return
	}

	// 2. Estimate.
	t = x.begin(telemetry.StageEstimate)
	if x.rule != nil {
		q := r.URL.Query()
		x.est, err = x.rule.Estimate(costmodel.GenericRequest{
			Method: r.Method, Path: x.subpath,
			Query: q, Header: r.Header, Body: body,
		})
		x.page = requestPage(x.rule, q)
	} else {
		x.est, err = x.st.est.Estimate(kind, body)
	}
	t.end()
	if errors.Is(err, costmodel.ErrCostOverflow) {
		writeError(w, path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "cost_exceeds_limit",
			Message: "this request's cost cannot be represented: " + err.Error() + "; lower max_tokens, n or the prompt",
		})
		return
	}
	if err != nil {
		writeError(w, path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "invalid_body", Message: err.Error(),
		})
		return
	}
	// Model limits are keyed by the model's canonical name, so that its
	// dated aliases share one allowance.
	x.model = x.st.est.Canonical(x.est.Model)

	// 3. Debit every applicable limit, all or nothing.
	x.outcome = telemetry.OutcomeAllow
	t = x.begin(telemetry.StageDebit)
	ok := s.debit(w, r.Context(), x)
	t.end()
	if !ok {
		return
	}
	// A concurrency limit's lease is renewed until settlement starts (see
	// renewer), or until the request ends otherwise.
	s.renewer.add(x)
	defer s.renewer.remove(x)

	// 4. Decide.
	if x.st.policy != nil {
		t = x.begin(telemetry.StagePolicy)
		ok := s.decide(w, r.Context(), x, &body)
		t.end()
		if !ok {
			return
		}
	}

	// 5. Record the reservation durably before forwarding.
	t = x.begin(telemetry.StageLedger)
	err = s.ledger.Reserve(r.Context(), x.entry(ledger.StatusReserved))
	t.end()
	if errors.Is(err, ledger.ErrInvalid) {
		// Text the ledger cannot store (a NUL in the model name, a field
		// over its size): the request itself is at fault.
		x.outcome, x.answer = telemetry.OutcomeNone, http.StatusBadRequest
		s.cancel(x)
		writeError(w, path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "invalid_body", Message: err.Error(),
		})
		return
	}
	if err != nil {
		x.outcome, x.answer = telemetry.OutcomeHard, http.StatusServiceUnavailable
		s.cancel(x)
		s.log.Error("ledger reserve failed", "request_id", x.id, "err", err)
		writeError(w, path, http.StatusServiceUnavailable, apiError{
			Type: "service_unavailable", Code: "ledger_unavailable",
			Message: "costgate cannot record the request in its ledger; try again",
		})
		return
	}

	// 7. Settle, also when the copy to the client is aborted (the reverse
	// proxy then panics with http.ErrAbortHandler). It runs on a goroutine
	// of the server's, so that the client's connection is free for its
	// next request at once; WaitIdle and Close wait for it.
	defer s.settleLater(x)

	// 6. Forward.
	if x.est.Stream && !x.est.StreamUsage && (kind == costmodel.ChatCompletions || kind == costmodel.Completions) {
		if b, err := withStreamUsage(body); err == nil {
			body, x.injectedUsage = b, true
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Del("Content-Length")
	t = x.begin(telemetry.StageUpstream)
	ctx, cancel := s.upstreamContext(x)
	defer cancel() // deferred, as the copy may end in a panic (see above)
	defer t.end()
	x.upstream.rp.ServeHTTP(w, r.WithContext(ctx))
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// upstreamContext is the context of the upstream exchange. It carries the
// request's span and exchange but not its cancellation: a client that
// disconnects does not stop costgate from reading the rest of the
// upstream's answer, which the upstream bills whether or not the client
// reads it (see meteredBody.Close). It ends at the upstream's timeout, or
// when the server closes.
func (s *Server) upstreamContext(x *exchange) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(x.ctx), ctxKey{}, x), x.upstream.timeout)
	stop := context.AfterFunc(s.stopping, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// withStreamUsage asks an OpenAI stream for its usage report, keeping the
// client's other stream options.
func withStreamUsage(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := m["stream_options"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &opts); err != nil {
			return nil, err
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	raw, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	m["stream_options"] = raw
	return json.Marshal(m)
}

// bodyReadTimeout bounds the read of a request's body.
var bodyReadTimeout = 30 * time.Second

// debit reserves the estimate on every limit that applies. It answers the
// client and returns false when the request may not go on.
func (s *Server) debit(w http.ResponseWriter, ctx context.Context, x *exchange) bool {
	x.limits, x.items = x.limitsBuf[:0], x.itemsBuf[:0]
	for _, l := range x.st.limits {
		if !l.appliesTo(x.caller.plan) {
			continue
		}
		x.limits = append(x.limits, l)
		x.items = append(x.items, weighted.Item{Limit: l.limit, Key: l.key(x), Cost: l.cost(x.est.Usage, x.est.Cost)})
	}
	return s.debitItems(w, ctx, x)
}

// debitItems debits x.items, all or nothing. A denial by shadow limits
// alone is recorded and not enforced: the others are debited again alone.
func (s *Server) debitItems(w http.ResponseWriter, ctx context.Context, x *exchange) bool {
	if len(x.items) == 0 {
		return true
	}
	res, err := s.store.Debit(ctx, x.resID, x.items)
	var tooBig *weighted.CostError
	switch {
	case errors.As(err, &tooBig):
		x.outcome, x.answer = telemetry.OutcomeNone, http.StatusBadRequest
		writeError(w, x.path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "cost_exceeds_limit",
			Message: fmt.Sprintf("this request's estimated cost (%d %s) is larger than limit %q can ever admit (%d); lower max_tokens or shorten the prompt",
				tooBig.Cost, x.limitFor(tooBig.Limit).unit, tooBig.Limit, tooBig.Capacity),
		})
		return false
	case errors.Is(err, weighted.ErrOverloaded), errors.Is(err, weighted.ErrStale):
		// A busy store, or one whose counters could not be brought up to
		// the ledger: no decision can be taken, and admitting past a limit
		// is not an answer. The request is shed, and may come back.
		x.outcome, x.answer = telemetry.OutcomeHard, http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
		writeError(w, x.path, http.StatusServiceUnavailable, apiError{
			Type: "service_unavailable", Code: "overloaded",
			Message: "costgate's limiter cannot take a decision now; retry in 1 s",
		})
		return false
	case err != nil:
		return s.storeFailed(w, ctx, x, err)
	}
	x.result = res
	if res.Allowed {
		return true
	}
	if x.deniedOnlyByShadow() {
		for i, st := range res.Items {
			if !st.Allowed {
				s.tel.ShadowWouldBlock("", x.limits[i].limit.Name, x.caller.tenant)
				s.log.Info("shadow limit would block", "request_id", x.id, "limit", x.limits[i].limit.Name, "tenant", x.caller.tenant)
			}
		}
		x.dropShadow()
		// On Redis Cluster the denial's compensation closed the first
		// reservation id: the second debit reserves under another.
		x.resID = x.id + ":2"
		return s.debitItems(w, ctx, x)
	}
	s.deny(w, x)
	s.remember(x)
	return false
}

func (x *exchange) limitFor(name string) *compiledLimit {
	for _, l := range x.limits {
		if l.limit.Name == name {
			return l
		}
	}
	return &compiledLimit{}
}

// deniedOnlyByShadow tells whether every limit that denied the debit is a
// shadow limit, and at least one did.
func (x *exchange) deniedOnlyByShadow() bool {
	shadow := false
	for i, st := range x.result.Items {
		if !st.Allowed && !x.limits[i].shadow {
			return false
		}
		shadow = shadow || !st.Allowed
	}
	return shadow
}

func (x *exchange) dropShadow() {
	limits, items := x.limits[:0], x.items[:0]
	for i, l := range x.limits {
		if !l.shadow {
			limits = append(limits, l)
			items = append(items, x.items[i])
		}
	}
	x.limits, x.items = limits, items
}

// storeFailed applies the limits' posture when the store cannot answer: a
// fail-closed limit refuses with 503; otherwise the request goes on
// unlimited and says so.
func (s *Server) storeFailed(w http.ResponseWriter, ctx context.Context, x *exchange, err error) bool {
	if !errors.Is(err, errBreakerOpen) {
		s.log.Warn("limiter store failed", "request_id", x.id, "err", err)
	}
	for _, l := range x.limits {
		if l.failClosed && !l.shadow { // a shadow limit never refuses
			x.outcome, x.answer, x.blocked = telemetry.OutcomeHard, http.StatusServiceUnavailable, l
			w.Header().Set("Retry-After", "1")
			writeError(w, x.path, http.StatusServiceUnavailable, apiError{
				Type: "service_unavailable", Code: l.limit.Name,
				Message: "the limiter store is unavailable and limit " + l.limit.Name + " fails closed",
			})
			return false
		}
	}
	// Fail open, within the local fallback budget: the enforced limits,
	// scaled down to this replica's share, in process memory.
	w.Header().Set("Costgate-Degraded", "fail-open")
	x.dropShadow()
	for _, l := range x.limits {
		s.tel.FailOpen(l.limit.Name)
	}
	x.degraded, x.fb = true, s.fallbackStore()
	x.items = fallbackItems(x.items, x.st.cfg.Store.FallbackReplicas)
	res, err := x.fb.Debit(ctx, x.resID, x.items)
	if err != nil && !errors.As(err, new(*weighted.CostError)) {
		// The fallback could not be brought up to the ledger's spend.
		x.outcome, x.answer = telemetry.OutcomeHard, http.StatusServiceUnavailable
		x.items = x.items[:0]
		w.Header().Set("Retry-After", "1")
		writeError(w, x.path, http.StatusServiceUnavailable, apiError{
			Type: "service_unavailable", Code: "limiter_unavailable",
			Message: "the limiter store is unavailable and the local budgets cannot be restored; retry in 1 s",
		})
		return false
	}
	if err != nil {
		// A cost larger than the fallback's capacity: the request cannot
		// fit this replica's share while the store is out.
		x.result = weighted.Result{Decider: 0, Items: make([]weighted.ItemState, len(x.items)), RetryAfter: time.Second}
		for i := range x.items {
			x.result.Items[i] = weighted.ItemState{Capacity: x.items[i].Limit.Capacity()}
		}
		s.deny(w, x)
		return false
	}
	x.result = res
	if !res.Allowed {
		s.deny(w, x)
		return false
	}
	return true
}

// store is where the request's reservation lives: the limiter store, or
// the local fallback when the store failed.
func (x *exchange) store() weighted.Store {
	if x.degraded {
		return x.fb
	}
	return x.s.store
}

// deny answers a denied debit: 402 when a budget decided, else 429.
func (s *Server) deny(w http.ResponseWriter, x *exchange) {
	res := x.result
	l := x.limits[res.Decider]
	retry := retryAfterSeconds(res.RetryAfter)
	x.setRetryAfter(w.Header(), retry)
	status, typ := http.StatusTooManyRequests, "rate_limit_exceeded"
	msg := fmt.Sprintf("limit %q is exhausted for this %s; retry in %d s", l.limit.Name, l.dimension, retry)
	if l.budget {
		status, typ = http.StatusPaymentRequired, "budget_exceeded"
		msg = fmt.Sprintf("budget %q is spent for this period; it resets in %d s", l.limit.Name, retry)
	}
	x.outcome, x.answer, x.blocked = telemetry.OutcomeHard, status, l
	writeError(w, x.path, status, apiError{
		Type: typ, Code: l.limit.Name, Message: msg, Policy: l.limit.Name,
		RetryAfterMS: res.RetryAfter.Milliseconds(),
	})
}

// policyRetryAfter is the Retry-After, in seconds, of a policy's 429 or
// 402: a policy states no time at which it would decide otherwise.
const policyRetryAfter = 60

func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// decide evaluates the policies. It answers the client and returns false on
// a hard decision; on a soft one it applies the friction to the body.
func (s *Server) decide(w http.ResponseWriter, ctx context.Context, x *exchange, body *[]byte) bool {
	in := x.policyInput()
	d, err := x.st.policy.Decide(ctx, in)
	if err != nil {
		// A broken policy must not take the API down: allow, loudly.
		s.log.Error("policy evaluation failed; allowing", "request_id", x.id, "err", err)
		return true
	}
	x.decision = d
	for _, sh := range d.Shadow {
		if sh.Outcome != policies.Allow {
			s.tel.ShadowWouldBlock(sh.Policy, "", x.caller.tenant)
			s.log.Info("shadow policy would act", "request_id", x.id, "tenant", x.caller.tenant, "policy", sh.Policy, "outcome", sh.Outcome, "status", sh.Status)
		}
	}
	switch d.Outcome {
	case policies.Hard:
		s.cancel(x)
		status := d.Status
		typ := "rate_limit_exceeded"
		switch status {
		case http.StatusPaymentRequired:
			typ = "budget_exceeded"
		case http.StatusForbidden:
			typ = "permission_denied"
		case http.StatusTooManyRequests:
		default:
			status = http.StatusForbidden
			typ = "permission_denied"
		}
		x.outcome, x.answer = telemetry.OutcomeHard, status
		if status == http.StatusForbidden {
			x.setRateLimitHeaders(w.Header())
		} else {
			x.setRetryAfter(w.Header(), policyRetryAfter)
		}
		writeError(w, x.path, status, apiError{Type: typ, Code: d.Policy, Message: d.Reason, Policy: d.Policy})
		return false
	case policies.Soft:
		x.outcome = telemetry.OutcomeSoft
		return s.applyFriction(w, ctx, x, body)
	}
	return true
}

func (x *exchange) policyInput() *policies.Input {
	now := time.Now().UTC()
	in := &policies.Input{
		Caller: policies.Caller{Tenant: x.caller.tenant, User: x.caller.user, KeyID: x.caller.keyID, Plan: x.caller.plan, IP: x.ip, Region: x.st.cfg.Region},
		Request: policies.Request{Route: x.path, Upstream: x.upstream.name, Model: x.est.Model, Stream: x.est.Stream,
			MaxOutputTokens: x.est.MaxOutputTokens, Page: x.page},
		Estimate: policies.Estimate{InputTokens: x.est.Usage.InputTokens, OutputTokens: x.est.Usage.OutputTokens, CostNanoUSD: int64(x.est.Cost)},
		Time:     policies.Time{Unix: now.Unix(), Hour: now.Hour(), Weekday: int(now.Weekday())},
	}
	// The limiter has already taken this request's cost (one round trip
	// instead of two); the policy sees each limit as it was before.
	for i, l := range x.limits {
		st := x.result.Items[i]
		st.Remaining = min(st.Remaining+x.items[i].Cost, st.Capacity)
		if l.budget {
			scope := l.dims[0]
			if scope == "api_key" {
				scope = "key"
			}
			in.Spend = append(in.Spend, policies.Spend{Scope: scope, Period: l.period,
				SpentNanoUSD: st.Capacity - st.Remaining, BudgetNanoUSD: st.Capacity})
			continue
		}
		in.Limits = append(in.Limits, policies.Limit{Name: l.limit.Name, Unit: l.unit, Limit: st.Capacity,
			Remaining: st.Remaining, ResetSeconds: int64(st.ResetAfter / time.Second)})
	}
	return in
}

// applyFriction delays, caps max_tokens or downgrades the model as the
// policies decided, and names what it did in Costgate-Friction.
func (s *Server) applyFriction(w http.ResponseWriter, ctx context.Context, x *exchange, body *[]byte) bool {
	f, src := x.decision.Friction, x.decision.Sources
	var applied []string
	did := func(action, policy string) {
		if policy == "" {
			policy = x.decision.Policy
		}
		applied = append(applied, action+"; policy="+strconv.Quote(policy))
	}
	if f.CapMaxTokens > 0 && (x.est.MaxOutputTokens == 0 || x.est.MaxOutputTokens > f.CapMaxTokens) {
		if b, err := capMaxTokens(*body, x.kind, f.CapMaxTokens); err == nil {
			*body = b
			did("cap_max_tokens", src.CapMaxTokens)
		}
	}
	if f.DowngradeModel != "" && f.DowngradeModel != x.est.Model {
		if b, err := setJSONField(*body, "model", f.DowngradeModel); err == nil {
			*body = b
			did("downgrade_model", src.DowngradeModel)
			x.est.Model = f.DowngradeModel
		}
	}
	if f.DelayMS > 0 {
		d := min(time.Duration(f.DelayMS)*time.Millisecond, 30*time.Second)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			s.cancel(x)
			return false
		}
		did("delay", src.DelayMS)
	}
	if f.Warning != "" {
		w.Header().Set("Costgate-Warning", f.Warning)
		if len(src.Warning) == 0 {
			did("warn", "")
		}
		for _, p := range src.Warning {
			did("warn", p)
		}
	}
	if len(applied) > 0 {
		x.friction = strings.Join(applied, ", ")
		w.Header().Set("Costgate-Friction", x.friction)
	}
	return true
}

// capMaxTokens lowers the output limit to n in the field the client used,
// or sets the API's own field when the client used none.
func capMaxTokens(body []byte, kind costmodel.Kind, n int64) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	raw, _ := json.Marshal(n)
	set := false
	for _, f := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		if _, ok := m[f]; ok {
			m[f], set = raw, true
		}
	}
	if !set {
		switch kind {
		case costmodel.ChatCompletions:
			m["max_completion_tokens"] = raw
		case costmodel.Responses:
			m["max_output_tokens"] = raw
		default:
			m["max_tokens"] = raw
		}
	}
	return json.Marshal(m)
}

// setJSONField sets one top-level field of a JSON object.
func setJSONField(body []byte, field string, v any) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	m[field] = raw
	return json.Marshal(m)
}

// cancel returns the request's whole reservation.
func (s *Server) cancel(x *exchange) {
	s.renewer.remove(x)
	if len(x.items) == 0 {
		return
	}
	if err := x.store().Cancel(context.Background(), x.resID, x.items); err != nil {
		s.log.Warn("limiter cancel failed", "request_id", x.id, "err", err)
	}
}

// settleLater settles the request on a goroutine of the server's. Its
// stage span starts here, on the request's goroutine, while the request's
// span still records: a span started after its parent ended would not be
// recorded (see telemetry's unsampledTracer), so settle would vanish from
// the trace. The settle span ends when settle returns, after the request's
// span, as its child.
func (s *Server) settleLater(x *exchange) {
	s.renewer.remove(x)
	s.inflight.Add(1)
	s.settles.Add(1)
	t := x.begin(telemetry.StageSettle)
	go func() {
		defer s.inflight.Add(-1)
		defer s.settles.Done()
		defer t.end()
		s.settle(x)
	}()
}

// settle prices what the upstream reported, charges or refunds the limits
// and finalizes the ledger entry.
func (s *Server) settle(x *exchange) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f := x.final()
	if len(x.items) > 0 {
		actual := make([]int64, len(x.items))
		reached := x.reachedUpstream()
		for i, l := range x.limits {
			actual[i] = l.cost(f.usage, f.cost)
			if l.unit == "requests" && !reached {
				actual[i] = 0
			}
		}
		if err := x.store().Settle(ctx, x.resID, x.items, actual); err != nil {
			s.log.Warn("limiter settle failed", "request_id", x.id, "err", err)
		}
	}
	s.tel.Usage(x.caller.tenant, f.model, f.usage.InputTokens, f.usage.OutputTokens, int64(f.cost))
	if !x.ledgerSettled {
		x.settleLedger(ctx, false)
	}
}

// settlement is what a request is charged.
type settlement struct {
	usage  costmodel.Usage
	cost   costmodel.NanoUSD
	status ledger.Status
	model  string // the model priced: the one the upstream says it served, else the one asked for
}

// final works out, once, what the request is charged; later calls return
// the same answer.
func (x *exchange) final() settlement {
	if x.settled {
		return x.fin
	}
	f := settlement{model: x.est.Model}
	var served string
	f.usage, served, f.status = x.actualUsage()
	if served != "" && x.rule == nil {
		f.model = served
	}
	f.cost = x.cost(f.model, f.usage)
	if f.status == ledger.StatusFailed && x.rule != nil {
		f.cost = 0 // a failed call to a generic API is not charged per call
	}
	x.fin, x.settled = f, true
	return f
}

// settleEarly records the request's settlement in the ledger as soon as
// the upstream's answer says what it costs: before the end of the answer
// reaches the client, so that a crash after a completed answer bills the
// upstream's usage, not the estimate. It runs on the request's goroutine.
func (x *exchange) settleEarly() {
	if x.earlyTried {
		return
	}
	x.earlyTried = true // once: a failing ledger is retried by settle, not by every chunk
	x.settleLedger(x.ctx, x.st.cfg.Ledger.DurableSettle)
}

// settleLedger finalizes the request's ledger entry; durable waits for the
// fsync that covers it.
func (x *exchange) settleLedger(ctx context.Context, durable bool) {
	f := x.final()
	e := x.entry(f.status)
	e.Model = f.model
	e.Actual, e.ActualCost = f.usage, f.cost
	e.SettledAt = time.Now()
	settle := x.s.ledger.Settle
	if durable {
		settle = x.s.ledger.SettleDurable
	}
	if err := settle(context.WithoutCancel(ctx), e); err != nil {
		x.s.log.Error("ledger settle failed", "request_id", x.id, "err", err)
		return
	}
	x.ledgerSettled = true
}

// reachedUpstream tells whether the request reached the upstream: it
// answered, whatever its status, or the exchange failed after the
// connection was made. A request unit is spent once the request reaches
// the upstream (a tenant must not flood a shared upstream key with
// requests it answers 404 or 429), and returned only when it never did.
func (x *exchange) reachedUpstream() bool {
	if x.upstreamErr == nil {
		return x.status != 0
	}
	var op *net.OpError
	return !errors.As(x.upstreamErr, &op) || op.Op != "dial"
}

// cost prices usage: by the model's price, or by a generic route's rule.
func (x *exchange) cost(model string, u costmodel.Usage) costmodel.NanoUSD {
	if x.rule != nil {
		return x.rule.Price().Cost(u)
	}
	return x.st.est.Cost(model, u)
}

// actualUsage is the usage to charge and the model the upstream says it
// served (empty when it said none): what the upstream reported; what a
// cut stream produced, but never less than the reservation when the
// request holds what costgate cannot count (hidden reasoning, audio,
// files, images); nothing for an upstream that gave no answer; and the
// estimate for a success whose usage cannot be read.
func (x *exchange) actualUsage() (costmodel.Usage, string, ledger.Status) {
	if x.upstreamErr != nil || x.body == nil {
		return costmodel.Usage{}, "", ledger.StatusFailed
	}
	if x.rule != nil {
		// A generic upstream reports units where its rule says, if
		// anywhere; otherwise the estimate is the price. An upstream error
		// is not charged.
		if x.status >= 400 {
			return costmodel.Usage{}, "", ledger.StatusFailed
		}
		u := x.est.Usage
		if au, ok, err := x.rule.Settle(x.respHeader, x.body.whole()); err == nil && ok {
			u = au
		}
		return u, "", ledger.StatusSettled
	}
	u, model, reported, ok := x.body.usage()
	switch {
	case ok && !reported && x.est.Uncounted && x.status < 400:
		u = atLeast(u, x.est.Usage)
	case ok:
	case x.status >= 400:
		u = costmodel.Usage{}
	default:
		x.s.log.Warn("upstream reported no usage; charging the estimate", "request_id", x.id)
		u = x.est.Usage
	}
	if x.status >= 400 {
		return u, model, ledger.StatusFailed
	}
	return u, model, ledger.StatusSettled
}

// atLeast is u with each count raised to floor's where it is lower.
func atLeast(u, floor costmodel.Usage) costmodel.Usage {
	u.InputTokens = max(u.InputTokens, floor.InputTokens)
	u.OutputTokens = max(u.OutputTokens, floor.OutputTokens)
	u.CacheWriteTokens = max(u.CacheWriteTokens, floor.CacheWriteTokens)
	u.CacheWrite1hTokens = max(u.CacheWrite1hTokens, floor.CacheWrite1hTokens)
	u.ReasoningTokens = max(u.ReasoningTokens, floor.ReasoningTokens)
	u.AudioInputTokens = max(u.AudioInputTokens, floor.AudioInputTokens)
	u.AudioOutputTokens = max(u.AudioOutputTokens, floor.AudioOutputTokens)
	u.WebSearchRequests = max(u.WebSearchRequests, floor.WebSearchRequests)
	if u.ServiceTier == "" {
		u.ServiceTier = floor.ServiceTier
	}
	return u
}

func (x *exchange) entry(status ledger.Status) ledger.Entry {
	decision := "allow"
	if x.decision.Outcome != "" {
		decision = string(x.decision.Outcome)
	}
	return ledger.Entry{
		RequestID: x.id, Tenant: x.caller.tenant, User: x.caller.user, KeyID: x.caller.keyID,
		Route: x.path, Upstream: x.upstream.name, Model: x.est.Model, Region: x.st.cfg.Region,
		Decision: decision, Policy: x.decision.Policy, Friction: x.friction,
		Status: status, HTTPStatus: x.status,
		Estimated: x.est.Usage, EstimatedCost: x.est.Cost,
		CreatedAt: x.start,
	}
}

func (s *Server) serveModels(c *gin.Context) {
	st := s.state.Load()
	if st.identify(c.Request) == nil {
		writeError(c.Writer, "/v1/models", http.StatusUnauthorized, apiError{
			Type: "authentication_error", Code: "invalid_api_key", Message: "missing or unknown API key",
		})
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list"}
	for _, m := range st.models {
		out.Data = append(out.Data, model{ID: m, Object: "model", OwnedBy: "costgate"})
	}
	c.JSON(http.StatusOK, out)
}

// requestPage is the 1-based result page a generic request asks for, from
// the query parameters its rule's complexity names (page, or offset and
// page size); 0 when the rule has no pagination or the request sets none.
func requestPage(r *costmodel.Rule, q url.Values) int64 {
	c := r.Complexity
	if c == nil {
		return 0
	}
	num := func(name string) int64 {
		if name == "" {
			return 0
		}
		n, err := strconv.ParseInt(q.Get(name), 10, 64)
		if err != nil || n < 0 {
			return 0
		}
		return n
	}
	if p := num(c.Page.Query); p > 0 {
		return p
	}
	size := num(c.PageSize.Query)
	if size == 0 {
		size = max(c.PageSize.Default, 1)
	}
	if off := num(c.Offset.Query); off > 0 {
		return off/size + 1
	}
	return 0
}
