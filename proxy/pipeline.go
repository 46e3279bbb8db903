package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/trace"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/telemetry"
)

// exchange is the state of one proxied request: what the front door reads
// from HTTP and the upstream's answer. The decisions are the gate's; the
// exchange holds its reservation. It is owned by the request's goroutine
// (the reverse proxy's hooks run on it too) until the answer is sent, then
// by the goroutine that settles it, which only reads it.
type exchange struct {
	s        *Server
	st       *state // the proxy's configuration the request started with
	id       string
	start    time.Time
	path     string
	kind     costmodel.Kind
	caller   *gate.Caller
	upstream *upstream
	ip       string
	est      costmodel.Estimate // the estimate the gate reserved; Model is the model served after a downgrade
	// served is the estimate of the body friction rewrote (a cap, a
	// downgrade), which settlement falls back on; nil when the body is
	// served as it was estimated.
	served *costmodel.Estimate

	client stallBound // the client's ResponseWriter, as the upstream's answer is copied to it

	res      *gate.Reservation // nil until the gate admits the request
	decision gate.Decision
	friction string // the Costgate-Friction value, if any

	status      int   // the upstream's status, or costgate's on an upstream failure
	upstreamErr error // set when the upstream gave no answer
	body        *meteredBody
	// wrote tells that the transport wrote the whole request to the
	// upstream (httptrace's WroteRequest without an error); set on the
	// transport's goroutine.
	wrote atomic.Bool

	injectedUsage bool            // costgate asked the upstream for a stream usage report
	rule          *costmodel.Rule // a generic upstream's cost rule; nil for LLM routes
	subpath       string          // a generic request's path after /u/NAME, read once (see genericPath)
	query         url.Values      // a generic request's query, read once
	respHeader    http.Header     // the upstream's response header
	page          int64           // the result page a paginated generic request asks for; 0: none
	settled       bool            // fin is worked out (see final)
	fin           settlement
	earlyTried    bool // settleEarly ran

	ctx  context.Context // carries the request's span
	span trace.Span
}

type ctxKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(ctxKey{}).(*exchange)
	return x
}

// apiKey is the key a request carries: x-api-key (Anthropic's SDKs) or a
// bearer token (OpenAI's).
func apiKey(r *http.Request) string {
	key := r.Header.Get("X-Api-Key")
	if key == "" {
		auth := r.Header.Get("Authorization")
		if len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
			key = strings.TrimSpace(auth[7:])
		}
	}
	return key
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

var errUnauthorized = apiError{
	Type: "authentication_error", Code: "invalid_api_key",
	Message: "missing or unknown API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
}

// serve is the proxy's front door on the gate. path is the route's name
// (the API path, or /u/NAME for a generic upstream); generic names the
// generic upstream.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, path string, kind costmodel.Kind, generic string) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1) // the first deferred, so the last to run: after settle
	x := &exchange{s: s, st: s.state.Load(), id: gate.NewID(), start: time.Now(), path: path, kind: kind}
	w.Header().Set("X-Request-Id", x.id)
	x.ctx, x.span = s.tel.Tracer().Start(r.Context(), "costgate "+path, trace.WithSpanKind(trace.SpanKindServer))
	defer func() {
		x.span.End()
		s.tel.Stage(telemetry.StageTotal, time.Since(x.start))
	}()

	// 1. Identify.
	t := x.begin(telemetry.StageIdentify)
	x.caller = s.gate.Identify(apiKey(r))
	t.end()
	if x.caller == nil {
		writeError(w, path, http.StatusUnauthorized, errUnauthorized)
		return
	}
	if !s.route(w, r, x, generic) {
		return
	}
	x.ip, _, _ = net.SplitHostPort(r.RemoteAddr)
	// A caller whose request-count limit is known to be spent is refused
	// before its body is read and estimated.
	req := x.request() // the gate's one view of the request; the estimate joins it below
	if d, refused := s.gate.Prefilter(req); refused {
		writeDecision(w, path, d)
		return
	}
	body, ok := readBody(w, r, x)
	if !ok {
		return
	}
	if generic != "" {
		// A method named in the query or the form would have the upstream
		// run another method than the one checked against its methods, as
		// a method-override header would (see upstream.admit).
		if p := methodOverrideParam(x.query, r.Header.Get("Content-Type"), body); p != "" {
			writeError(w, path, http.StatusBadRequest, apiError{
				Type: "invalid_request_error", Code: "method_override",
				Message: fmt.Sprintf("%s is not forwarded: send the request with its own method", p),
			})
			return
		}
	}

	// 2. Estimate.
	if !s.estimate(w, r, x, body) {
		return
	}

	// A stored answer the request continues must be the tenant's own.
	if x.est.PreviousResponseID != "" && !s.ownsPrevious(w, x) {
		return
	}

	// 3. Debit every applicable limit, all or nothing, and 4. decide.
	req.Estimate, req.Page = x.est, x.page
	res, d := s.gate.Reserve(x.ctx, req)
	x.decision = d
	if d.Degraded {
		w.Header().Set("Costgate-Degraded", "fail-open")
	}
	if res == nil {
		writeDecision(w, path, d)
		return
	}
	x.res = res
	defer func() { res.Report(x.status) }() // before the request's span ends
	if d.Outcome == telemetry.OutcomeSoft && !s.applyFriction(w, x.ctx, x, &body) {
		return
	}

	// 5. Record the reservation durably before forwarding.
	if d, ok := res.Record(x.ctx); !ok {
		writeDecision(w, path, d)
		return
	}

	// 7. Settle, also when the copy to the client is aborted (the reverse
	// proxy then panics with http.ErrAbortHandler). It runs on a goroutine
	// of the gate's, so that the client's connection is free for its next
	// request at once; WaitIdle and Close wait for it.
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
	stall := clientStall
	if t := x.upstream.timeout / 2; t > 0 && t < stall {
		stall = t
	}
	sw := &x.client
	*sw = stallBound{ResponseWriter: w, rc: *http.NewResponseController(w), stall: stall}
	defer sw.disarm()
	x.upstream.rp.ServeHTTP(sw, r.WithContext(ctx))
	sw.Flush()
}

// clientStall bounds how long one write of an answer may wait for a
// client that stopped reading (its TCP window closed), at most half the
// upstream's timeout: past it the client is taken as gone, and the rest of
// the answer is read and metered (see meteredBody.Close) while the
// upstream's exchange is still open.
const clientStall = 30 * time.Second

// stallBound is the client's ResponseWriter. Once armed (the answer goes
// to the client as it is read from the upstream: a stream, or a plain
// answer too large to read whole first, or one read whole of more than
// armWhole bytes), each write or flush has a deadline at least three
// quarters of stall away, moved when a quarter of it has passed. A
// smaller plain answer read whole fits in the connection's buffers, and a
// deadline costs a timer, which at one connection wakes the idle network
// poller: it has none.
type stallBound struct {
	http.ResponseWriter
	rc    http.ResponseController // held by value: no allocation of its own
	stall time.Duration
	armed bool
	set   time.Time // when the deadline was last moved; zero for never
}

// disarm clears the deadline the writes set, if any: the connection may
// serve the client's next request.
func (w *stallBound) disarm() {
	if !w.set.IsZero() {
		w.rc.SetWriteDeadline(time.Time{})
	}
}

func (w *stallBound) extend() {
	if !w.armed {
		return
	}
	if now := time.Now(); now.Sub(w.set) >= w.stall/4 {
		w.set = now
		w.rc.SetWriteDeadline(now.Add(w.stall))
	}
}

func (w *stallBound) Write(b []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(b)
}

func (w *stallBound) Flush() {
	w.extend()
	w.rc.Flush()
}

func (w *stallBound) Unwrap() http.ResponseWriter { return w.ResponseWriter }

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

// request is the gate's view of the exchange.
func (x *exchange) request() *gate.Request {
	return &gate.Request{ID: x.id, Caller: x.caller, Route: x.path, Upstream: x.upstream.name,
		Estimate: x.est, IP: x.ip, Page: x.page, Open: x.rule != nil && x.rule.Actual != nil}
}

// route picks the upstream of the request's route. It answers the client
// and returns false when there is none or the generic path is refused.
func (s *Server) route(w http.ResponseWriter, r *http.Request, x *exchange, generic string) bool {
	if generic != "" {
		if u := x.st.upstreams[generic]; u != nil && u.kind == "generic" {
			x.upstream = u
		}
	} else {
		x.upstream = x.st.routes[x.path]
	}
	if x.upstream == nil {
		writeError(w, x.path, http.StatusNotFound, apiError{
			Type: "invalid_request_error", Code: "no_upstream",
			Message: "no upstream is configured for " + x.path,
		})
		return false
	}
	if generic != "" {
		var ref *refusal
		if x.subpath, ref = x.upstream.admit(r); ref != nil {
			ref.write(w, x.path)
			return false
		}
		x.rule = x.upstream.rule(x.subpath)
		x.query = r.URL.Query()
	}
	return true
}

// readBody reads the request's body within the size and time bounds. It
// answers the client and returns false when it cannot, or when the body
// is declared in a content coding (see codedBody).
func readBody(w http.ResponseWriter, r *http.Request, x *exchange) ([]byte, bool) {
	if coding := codedBody(r.Header); coding != "" {
		w.Header().Set("Accept-Encoding", "identity")
		writeError(w, x.path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "unsupported_content_encoding",
			Message: "costgate prices a request body as it reads it and reads no content coding (" + coding + "): send the body uncompressed",
		})
		return nil, false
	}
	body, err := readBodyWithin(w, r, x.start, x.caller.Config().MaxBodyBytes)
	if err != nil {
		writeBodyError(w, x.path, err)
		return nil, false
	}
	return body, true
}

// codedBody returns the first content coding other than identity that h
// declares the body in, in any Content-Encoding field of any spelling a
// server reads as one (costmodel.HeaderIs: Content_Encoding is
// HTTP_CONTENT_ENCODING too), or "" for none. An upstream that decodes a
// request body (Elasticsearch, Apache's DEFLATE input filter, many
// frameworks' middleware) would read the body costgate never priced: a
// gzipped form body held no field costgate could see, so its rule read
// its default while the upstream served what the decoded body asked for.
func codedBody(h http.Header) string {
	if cs := costmodel.ContentCodings(h); len(cs) > 0 {
		return cs[0]
	}
	return ""
}

// errBodyTimeout is a body that did not arrive within bodyReadTimeout.
var errBodyTimeout = errors.New("the request body did not arrive in time")

// readBodyWithin reads r's body, of at most limit bytes, by
// bodyReadTimeout from start: a client that sends its body slowly holds
// the request no longer (the server bounds only the header's read). A
// body past the bound is an *http.MaxBytesError, one past the time
// errBodyTimeout, after which the connection closes: the server would
// otherwise wait for the rest of the body before it answers.
func readBodyWithin(w http.ResponseWriter, r *http.Request, start time.Time, limit int64) ([]byte, error) {
	return readBodyInto(w, r, start, limit, nil)
}

// readBodyInto is readBodyWithin that reads into buf's room when the
// declared length fits in it (see readAllInto).
func readBodyInto(w http.ResponseWriter, r *http.Request, start time.Time, limit int64, buf []byte) ([]byte, error) {
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(start.Add(bodyReadTimeout))
	body, err := readAllInto(buf, http.MaxBytesReader(w, r.Body, limit), r.ContentLength, limit)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		w.Header().Set("Connection", "close") // the deadline stays
		return nil, errBodyTimeout
	}
	rc.SetReadDeadline(time.Time{})
	return body, err
}

// writeBodyError answers a body readBodyWithin could not read.
func writeBodyError(w http.ResponseWriter, path string, err error) {
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, errBodyTimeout):
		writeError(w, path, http.StatusRequestTimeout, apiError{
			Type: "invalid_request_error", Code: "body_timeout",
			Message: fmt.Sprintf("the request body did not arrive within %s", bodyReadTimeout),
		})
	case errors.As(err, &tooBig):
		writeError(w, path, http.StatusRequestEntityTooLarge, apiError{
			Type: "invalid_request_error", Code: "body_too_large",
			Message: fmt.Sprintf("request body is larger than the limit of %d bytes", tooBig.Limit),
		})
	default:
		writeError(w, path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "unreadable_body", Message: "reading the request body: " + err.Error(),
		})
	}
}

// readAll is io.ReadAll that starts with room for the declared length n
// and a byte to see the end, so that a request is read in one allocation.
// The room made before any byte arrives is at most preallocMax: a client
// that declares a large body and sends none holds no more memory than
// that. Past it, and for an unknown length, the buffer grows as
// io.ReadAll's; rd bounds it.
func readAll(rd io.Reader, n, limit int64) ([]byte, error) {
	return readAllInto(nil, rd, n, limit)
}

// readAllInto is readAll that reads into buf (from its start) when the
// declared length and a byte fit in its capacity, and allocates as readAll
// does when they do not.
func readAllInto(buf []byte, rd io.Reader, n, limit int64) ([]byte, error) {
	if n <= 0 || n > limit {
		return io.ReadAll(rd)
	}
	b := buf[:0]
	if int64(cap(b)) < n+1 {
		b = make([]byte, 0, min(n+1, preallocMax))
	}
	for {
		m, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow, as io.ReadAll does
		}
	}
}

// estimate prices the request: by its upstream's cost rule, or by the
// model's price. It answers the client and returns false when the body
// cannot be priced.
func (s *Server) estimate(w http.ResponseWriter, r *http.Request, x *exchange, body []byte) bool {
	t := x.begin(telemetry.StageEstimate)
	var err error
	if x.rule != nil {
		greq := costmodel.GenericRequest{Method: r.Method, Path: x.subpath, Query: x.query, Header: r.Header, Body: body}
		x.est, err = x.rule.Estimate(greq)
		if err == nil {
			x.page = requestPage(x.rule, greq)
		}
	} else {
		x.est, err = x.caller.Estimator().Estimate(x.kind, body)
	}
	t.end()
	if errors.Is(err, costmodel.ErrCostOverflow) {
		writeError(w, x.path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "cost_exceeds_limit",
			Message: "this request's cost cannot be represented: " + err.Error() + "; lower max_tokens, n or the prompt",
		})
		return false
	}
	if err != nil {
		writeError(w, x.path, http.StatusBadRequest, apiError{
			Type: "invalid_request_error", Code: "invalid_body", Message: err.Error(),
		})
		return false
	}
	return true
}

// preallocMax bounds the room readAll makes for a body before it arrives.
const preallocMax = 64 << 10

// bodyReadTimeout bounds the read of a request's body.
var bodyReadTimeout = 30 * time.Second

// upstreamContext is the context of the upstream exchange. It carries the
// request's span and exchange, and a trace that marks the request written
// whole (exchange.wrote), but not its cancellation: a client that
// disconnects does not stop costgate from reading the rest of the
// upstream's answer, which the upstream bills whether or not the client
// reads it (see meteredBody.Close). It ends at the upstream's timeout, or
// when the server closes.
func (s *Server) upstreamContext(x *exchange) (context.Context, context.CancelFunc) {
	ctx := httptrace.WithClientTrace(context.WithValue(context.WithoutCancel(x.ctx), ctxKey{}, x), &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				x.wrote.Store(true)
			}
		},
	})
	ctx, cancel := context.WithTimeout(ctx, x.upstream.timeout)
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

// capMaxTokens lowers the output limit to n in every output-limit field
// the body holds, or sets the API's own field when it holds none. An
// Anthropic request with extended thinking is kept one the API accepts
// (max_tokens above thinking.budget_tokens, a budget of at least
// minThinkingBudget): a budget not below n is lowered to n-1 when n is
// above minThinkingBudget; otherwise thinking is disabled
// ({"type":"disabled"}), as no valid budget fits below n.
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
	if kind == costmodel.AnthropicMessages {
		if t, ok := m["thinking"]; ok {
			t, err := thinkingBelow(t, n)
			if err != nil {
				return nil, err
			}
			m["thinking"] = t
		}
	}
	return json.Marshal(m)
}

// minThinkingBudget is the smallest thinking.budget_tokens Anthropic
// accepts.
const minThinkingBudget = 1024

// thinkingBelow is an Anthropic thinking object that fits a max_tokens of
// n: raw itself unless it enables thinking with a budget of n or more;
// then the budget lowered to n-1 when n is above minThinkingBudget, else
// thinking disabled.
func thinkingBelow(raw json.RawMessage, n int64) (json.RawMessage, error) {
	var t map[string]json.RawMessage
	if json.Unmarshal(raw, &t) != nil {
		return raw, nil // not an object: the upstream judges it as sent
	}
	var typ string
	var budget int64
	if json.Unmarshal(t["type"], &typ) != nil || typ != "enabled" ||
		json.Unmarshal(t["budget_tokens"], &budget) != nil || budget < n {
		return raw, nil
	}
	if n <= minThinkingBudget {
		return json.RawMessage(`{"type":"disabled"}`), nil
	}
	t["budget_tokens"], _ = json.Marshal(n - 1)
	return json.Marshal(t)
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

// actualUsage is the usage to charge and the model the upstream says it
// served (empty when it said none): what the upstream reported; what a
// cut stream produced, but never less than the estimate of the body served
// (see servedEstimate) when the request holds what costgate cannot count
// (hidden reasoning, audio, files, images); nothing for an upstream that
// gave no answer; and that estimate with its output limit for a success
// whose usage cannot be read (too large to read whole, or without usage,
// as a background response).
func (x *exchange) actualUsage() (costmodel.Usage, string, ledger.Status) {
	est := x.servedEstimate()
	if x.unanswered() {
		// The upstream has the request and runs it to its end whether or
		// not its answer comes in time, or comes at all: it bills it.
		// Charged as an answer whose usage cannot be read: at the
		// request's output limit; a generic upstream's at the most its
		// rule lets it report.
		u := est.Usage
		if x.rule != nil {
			u.Units = x.rule.Unreported(u.Units)
			return u, "", ledger.StatusFailed
		}
		u.OutputTokens = max(u.OutputTokens, est.OutputCap)
		return u.Asked(est.Usage), "", ledger.StatusFailed
	}
	if x.upstreamErr != nil || x.body == nil {
		return costmodel.Usage{}, "", ledger.StatusFailed
	}
	if x.rule != nil {
		// A generic upstream reports units where its rule's actual says;
		// without an actual the estimate is the price. An upstream error
		// is not charged.
		if x.status >= 400 {
			return costmodel.Usage{}, "", ledger.StatusFailed
		}
		u := est.Usage
		units, reported, err := x.rule.Charge(x.answerFields(), x.body.whole(), u.Units)
		switch {
		case reported:
			u = costmodel.Usage{Units: units}
		case x.rule.Actual != nil:
			// The report is in an answer costgate did not keep whole (over
			// maxCapture, a stream, or cut before its end), one in a
			// content coding it did not decode (the transport decodes the
			// gzip it asks for and drops the header; an upstream that
			// compresses unasked), one it cannot read, or the answer
			// states none: charged the most the rule lets the upstream
			// report, as an LLM answer without usage is charged its
			// output limit.
			u.Units = units
			x.s.log.Warn("upstream units unreadable; charging the actual's max", "request_id", x.id, "units", u.Units, "error", err)
		}
		return u, "", ledger.StatusSettled
	}
	u, model, reported, ok := x.body.usage()
	switch {
	case ok && !reported && x.status < 400 && (x.body.skipped() || x.body.coded()):
		// An event the meter could not read went by (the client has
		// it), or the stream came in a content coding the meter does
		// not read, and no report was read: it may have been in it.
		// Charged as an answer whose usage cannot be read, and no less
		// than what the stream carried.
		x.s.log.Warn("stream usage report unreadable; charging the output limit", "request_id", x.id)
		u = atLeast(u, est.Usage)
		u.OutputTokens = max(u.OutputTokens, est.OutputCap)
	case ok && !reported && est.Uncounted && x.status < 400:
		u = atLeast(u, est.Usage)
		if x.body.cutShort() {
			// costgate closed the upstream before its report (the guard
			// stopped the stream, the upstream's timeout, the drain's
			// bound): what it generated and never showed (hidden
			// reasoning, thinking beyond its summary) is unknown, and
			// billed up to the output limit.
			u.OutputTokens = max(u.OutputTokens, est.OutputCap)
		}
	case ok && x.status < 400:
		u = withPrompt(u, est.Usage)
		if reported && est.Uncounted && x.body.outputUnstated() {
			// A stream whose report states no output is charged the
			// text it carried, which holds no hidden reasoning: such a
			// request is charged as one whose usage cannot be read.
			u.OutputTokens = max(u.OutputTokens, est.OutputCap)
		}
	case ok:
	case x.status >= 400:
		u = costmodel.Usage{}
	default:
		// An answer too large to read whole (many choices, logprobs), or
		// a success without usage (a Responses request run in the
		// background answers "queued" and bills its run later): its
		// output may be far above what was reserved, so it is charged the
		// request's output limit.
		x.s.log.Warn("upstream usage unreadable; charging the output limit", "request_id", x.id, "too_large", x.body.overflow)
		u = est.Usage
		u.OutputTokens = max(u.OutputTokens, est.OutputCap)
		if tu, ok := x.body.overflowUsage(); ok {
			// A large answer's report, read as it passed: never less
			// than it (the upstream's input may exceed what the
			// estimate reserved for search results or stored context).
			u = atLeast(u, tu)
		}
	}
	if x.status >= 400 {
		return u, model, ledger.StatusFailed
	}
	if x.kind == costmodel.ChatCompletions {
		// A chat completion's search is billed per request and never
		// reported: the one the request asked for is charged.
		u.WebSearchRequests = max(u.WebSearchRequests, est.Usage.WebSearchRequests)
	}
	return u.Asked(est.Usage), model, ledger.StatusSettled
}

// answerFields is the upstream's answer header with the trailers it sent
// after the answer (once read to its end), where a generic upstream may
// report the units a call cost: a field in both is one given twice, which
// a rule refuses to read (see costmodel.Rule.Settle).
func (x *exchange) answerFields() http.Header {
	var tr http.Header
	if x.body != nil && x.body.resp != nil {
		tr = x.body.resp.Trailer
	}
	if len(tr) == 0 {
		return x.respHeader
	}
	h := x.respHeader.Clone()
	if h == nil {
		h = http.Header{}
	}
	for k, vs := range tr {
		h[k] = append(h[k], vs...)
	}
	return h
}

// servedEstimate is the estimate of the body the upstream is sent: the
// one friction rewrote, else the one the gate reserved.
func (x *exchange) servedEstimate() *costmodel.Estimate {
	if x.served != nil {
		return x.served
	}
	return &x.est
}

// withPrompt is u, the usage an upstream's answer to a request reported,
// with the prompt's count in est (the request's estimate, less what it
// reserved for other models' steps) as its input when it reports none: a
// report without an input count (an Anthropic answer without
// input_tokens), or with 0 for a prompt costgate counted, says nothing of
// it.
func withPrompt(u, est costmodel.Usage) costmodel.Usage {
	if u.InputTokens == 0 {
		u.InputTokens = promptTokens(est)
	}
	return u
}

// promptTokens is the input tokens est, an estimate's usage, counted of
// the request's own prompt: its input less what its other models' steps
// reserved (an advisor's, a fallback's).
func promptTokens(est costmodel.Usage) int64 {
	n := est.InputTokens
	for _, su := range est.Steps.All() {
		n -= su.InputTokens
	}
	return max(n, 0)
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
	u.FileSearchCalls = max(u.FileSearchCalls, floor.FileSearchCalls)
	u.ContainerGB = max(u.ContainerGB, floor.ContainerGB)
	if u.ServiceTier == "" {
		u.ServiceTier = floor.ServiceTier
	}
	if u.InferenceGeo == "" {
		u.InferenceGeo = floor.InferenceGeo
	}
	if u.Speed == "" {
		u.Speed = floor.Speed
	}
	if u.Steps == nil {
		// The other models the floor reserved (an advisor's, a
		// fallback's) price its tokens when the answer named none.
		u.Steps = floor.Steps
	}
	return u
}

func (s *Server) serveModels(c *gin.Context) {
	st := s.state.Load()
	if s.gate.Identify(apiKey(c.Request)) == nil {
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

// requestPage is the 1-based result page a generic request asks for, read
// as its rule's complexity prices it (Complexity.ResultPage: the deeper of
// the offset's page and the page, wherever the rule reads them); 0 when
// the rule has no pagination or the request sets none.
func requestPage(r *costmodel.Rule, req costmodel.GenericRequest) int64 {
	if r.Complexity == nil {
		return 0
	}
	p, err := r.Complexity.ResultPage(req) // Estimate read the same places: no error
	if err != nil {
		return 0
	}
	return p
}

// timedOut tells whether the upstream has the request but gave no answer
// within its timeout: it runs the request to its end and bills it.
func (x *exchange) timedOut() bool {
	return x.upstreamErr != nil && errors.Is(x.upstreamErr, context.DeadlineExceeded) && x.reachedUpstream()
}

// unanswered tells whether the upstream had the request but gave no
// answer: it did not answer in time (timedOut), or the exchange broke
// after the whole request was written and before the answer's status
// line (a load balancer's idle timeout between them, the upstream's front
// end restarted). The upstream may run such a request to its end and
// bill it, as it bills one whose answer is cut a byte later. An unasked
// protocol switch is an answer, not a run; a kept-alive connection the
// upstream had closed while it was idle (net/http's "server closed idle
// connection", found once the request was written to it) never carried
// the request to it.
func (x *exchange) unanswered() bool {
	if x.timedOut() {
		return true
	}
	err := x.upstreamErr
	return err != nil && x.wrote.Load() && x.reachedUpstream() && !errors.Is(err, errUnaskedUpgrade) &&
		!strings.Contains(err.Error(), "server closed idle connection")
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

// applyFriction delays, caps the output limit or downgrades the model as
// the policies decided, and names what it did in Costgate-Friction. A cap
// or a downgrade rewrites only a request with output: not an embeddings
// request, nor a generic upstream's (see rewriteForFriction). A delay
// past the tenant's bound (see frictionDelay) is refused with 429.
func (s *Server) applyFriction(w http.ResponseWriter, ctx context.Context, x *exchange, body *[]byte) bool {
	f, src := x.decision.Friction, x.decision.Sources
	var applied []string
	did := func(action, policy string) { applied = append(applied, x.decision.FrictionNote(action, policy)) }
	if x.rule == nil && x.est.Outputs > 0 {
		x.rewriteForFriction(body, did)
	}
	if f.DelayMS > 0 {
		if err := s.frictionDelay(ctx, x.caller.Tenant, f.DelayMS); err != nil {
			x.res.Cancel(context.WithoutCancel(ctx))
			if errors.Is(err, errDelayBacklog) {
				x.status = http.StatusTooManyRequests
				writeDelayBacklog(w, x.path, f.DelayMS)
			}
			return false
		}
		did("delay", src.DelayMS)
	}
	if f.Warning != "" {
		w.Header().Set("Costgate-Warning", f.Warning)
		applied = x.decision.WarnNotes(applied, "warn")
	}
	if len(applied) > 0 {
		x.friction = strings.Join(applied, ", ")
		w.Header().Set("Costgate-Friction", x.friction)
	}
	downgraded := ""
	if x.est.Model != x.res.Request().Estimate.Model {
		downgraded = x.est.Model
	}
	x.res.Applied(x.friction, downgraded)
	return true
}

// rewriteForFriction applies the decision's cap and downgrade to body and
// names each with did. The cap applies when it is below each completion's
// output limit (the request's own, else the model's maximum; always, for
// an unknown model without a limit of its own). A downgrade to a model
// whose maximum output is above the output limit reserved sets that limit
// in the body, named cap_max_tokens by the downgrade's policy: the
// upstream may write no more than was reserved. A downgrade whose body
// would cost more than was reserved, in dollars or in tokens, is not
// applied: limits debited for one model must not serve a dearer one. A
// rewritten body is estimated again, as it would be sent by the client
// itself, and settlement falls back on that estimate (x.served); x.est
// stays the estimate the gate reserved, but for its Model, the one served.
func (x *exchange) rewriteForFriction(body *[]byte, did func(action, policy string)) {
	f, src := x.decision.Friction, x.decision.Sources
	perOutput := x.est.OutputCap / x.est.Outputs // each completion's output limit, as the reservation counted it
	estimator := x.caller.Estimator()
	b, rewritten, capped := *body, false, false
	var served costmodel.Estimate
	if f.CapMaxTokens > 0 && (f.CapMaxTokens < perOutput || x.est.MaxOutputTokens == 0 && x.est.UnknownModel) {
		if nb, err := capMaxTokens(b, x.kind, f.CapMaxTokens); err == nil {
			if e, err := estimator.Estimate(x.kind, nb); err == nil {
				b, served, rewritten, capped = nb, e, true, true
				did("cap_max_tokens", src.CapMaxTokens)
			}
		}
	}
	if f.DowngradeModel != "" && f.DowngradeModel != x.est.Model {
		nb, err := setJSONField(b, "model", f.DowngradeModel)
		var e costmodel.Estimate
		if err == nil {
			e, err = estimator.Estimate(x.kind, nb)
		}
		bounded := false
		if err == nil && e.OutputCap > x.est.OutputCap {
			if nb, err = capMaxTokens(nb, x.kind, perOutput); err == nil {
				e, err = estimator.Estimate(x.kind, nb)
				bounded = true
			}
		}
		switch {
		case err != nil:
			// Not expected: only priced fields changed in a body that was
			// estimated. The downgrade is not applied.
			x.s.log.Warn("estimating the body a downgrade rewrote", "request_id", x.id, "error", err)
		case e.Cost > x.est.Cost || e.Usage.TotalTokens() > x.est.Usage.TotalTokens():
			x.s.log.Warn("downgrade not applied: it costs more than was reserved", "request_id", x.id,
				"model", x.est.Model, "downgrade_model", f.DowngradeModel, "reserved_nano_usd", int64(x.est.Cost), "downgrade_nano_usd", int64(e.Cost))
		default:
			b, served, rewritten = nb, e, true
			did("downgrade_model", src.DowngradeModel)
			if bounded && !capped {
				did("cap_max_tokens", src.DowngradeModel)
			}
			x.est.Model = f.DowngradeModel
		}
	}
	if !rewritten {
		return
	}
	*body = b
	x.served = &served
}

// settleLater settles the request on a goroutine the gate owns, once the
// answer is done.
func (s *Server) settleLater(x *exchange) {
	x.res.Report(x.status) // here, before the settlement's goroutine starts
	s.inflight.Add(1)
	x.res.SettleLater(x.charge, func() { s.inflight.Add(-1) })
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
	if limit := x.est.MaxOutputTokens; limit > 0 && f.usage.OutputTokens > limit {
		// Billed as reported (what the upstream invoices), but no
		// upstream that honours the request's output limit reports this:
		// worth an operator's look.
		x.s.log.Warn("upstream reported more output tokens than the request's output limit; billed as reported",
			"request_id", x.id, "tenant", x.caller.Tenant, "model", x.est.Model, "output_tokens", f.usage.OutputTokens, "output_limit", limit)
	}
	if served != "" && x.rule == nil {
		f.model = served
	}
	f.cost = x.cost(f.model, f.usage)
	if f.model != x.est.Model && x.rule == nil {
		if _, known := x.caller.Estimator().Price(f.model); !known {
			// A served name the price table does not know (a dated
			// snapshot it has no alias for) is priced at the default
			// price, which may be far below the price of the model
			// asked for: it is charged no less than that model.
			f.cost = max(f.cost, x.cost(x.est.Model, f.usage))
		}
	}
	if f.status == ledger.StatusFailed && x.rule != nil && !x.unanswered() {
		f.cost = 0 // a failed call to a generic API is not charged per call
	}
	x.fin, x.settled = f, true
	return f
}

// charge is the gate's form of the settlement.
func (x *exchange) charge() gate.Charge {
	f := x.final()
	return gate.Charge{Usage: f.usage, Cost: f.cost, Model: f.model, Status: f.status,
		HTTPStatus: x.status, Unreached: !x.reachedUpstream()}
}

// settleEarly records the request's settlement in the ledger as soon as
// the upstream's answer says what it costs: before the end of the answer
// reaches the client, so that a crash after a completed answer bills the
// upstream's usage, not the estimate. It runs on the request's goroutine.
func (x *exchange) settleEarly() {
	if x.earlyTried || x.res == nil {
		return
	}
	x.earlyTried = true // once: a failing ledger is retried by settle, not by every chunk
	x.res.Bill(x.ctx, x.charge(), x.caller.Config().Ledger.DurableSettle)
}

// own records that the Responses answer id, which the upstream keeps
// under costgate's one account, was made for the request's tenant: only
// that tenant's requests may continue it (ownsPrevious). An answer that
// is not a success makes nothing. It runs before the client has the
// bytes that name the id, so that the client's next request finds it.
func (x *exchange) own(id string) {
	if id == "" || x.status < 200 || x.status > 299 {
		return
	}
	// A client that hangs up does not stop the record; the gate bounds it.
	if err := x.s.gate.OwnObject(context.WithoutCancel(x.ctx), x.caller.Tenant, id); err != nil {
		// The tenant's requests that continue it are refused (404).
		x.s.log.Warn("recording a stored answer's tenant", "request_id", x.id, "tenant", x.caller.Tenant, "error", err)
	}
}

// ownsPrevious answers whether the stored Responses answer the request
// continues (previous_response_id) was made for its tenant through
// costgate. Another tenant's, or one costgate has no record of, is 404 as
// the upstream answers an id it does not know; a record that cannot be
// read is 503. It answers the client and returns false when refused.
func (s *Server) ownsPrevious(w http.ResponseWriter, x *exchange) bool {
	id := x.est.PreviousResponseID
	tenant, found, err := s.gate.ObjectOwner(x.ctx, id)
	switch {
	case err != nil:
		s.log.Warn("reading a stored answer's tenant", "request_id", x.id, "error", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, x.path, http.StatusServiceUnavailable, apiError{Type: "server_error", Code: "service_unavailable",
			Message: "costgate cannot tell whose stored response this is now; retry"})
		return false
	case !found || tenant != x.caller.Tenant:
		writeError(w, x.path, http.StatusNotFound, apiError{Type: "invalid_request_error", Code: "previous_response_not_found",
			Message: fmt.Sprintf("Previous response with id '%s' not found.", id)})
		return false
	}
	return true
}

// cost prices usage: by the model's price, or by a generic route's rule.
func (x *exchange) cost(model string, u costmodel.Usage) costmodel.NanoUSD {
	if x.rule != nil {
		return x.rule.Price().Cost(u)
	}
	return x.res.Price(model, u)
}
