package proxy

// The reserve/settle API: the gate's decisions for callers that are not
// proxied (an SDK that cannot be pointed at a proxy, a batch job that asks
// "may I spend this?" first). POST /v1/costgate/reserve debits the limits
// and budgets as a proxied request would and answers with a reservation
// id; /settle charges or refunds the difference from the actual usage;
// /release returns an unused reservation. The key is the tenant's, as on
// every data-plane route, and the answers are the proxy's: the same 429
// and 402 bodies, Retry-After and RateLimit fields.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
)

// reserveRoute is the route reservations are recorded under when their
// request names none.
const reserveRoute = "/v1/costgate/reserve"

// maxReserveBody bounds a reserve, settle or release request's body.
const maxReserveBody = 1 << 20

// amounts is a cost or a usage in the API's units. Requests is a pointer
// so that an explicit 0 differs from none (1).
type amounts struct {
	Requests     *int64 `json:"requests"`
	Tokens       int64  `json:"tokens"`
	InputTokens  int64  `json:"input_tokens"`
	OutputTokens int64  `json:"output_tokens"`
	Units        int64  `json:"units"`
	USD          string `json:"usd"`
}

// usage reads the amounts: tokens counts as input tokens, and may not be
// given with input_tokens or output_tokens; usd, when set, is the cost.
func (a *amounts) usage() (u costmodel.Usage, cost costmodel.NanoUSD, priced bool, err error) {
	switch {
	case a.Tokens < 0 || a.InputTokens < 0 || a.OutputTokens < 0 || a.Units < 0 || (a.Requests != nil && *a.Requests < 0):
		return u, 0, false, errors.New("amounts must not be negative")
	case a.Tokens > 0 && (a.InputTokens > 0 || a.OutputTokens > 0):
		return u, 0, false, errors.New("give tokens, or input_tokens and output_tokens, not both")
	}
	u.InputTokens = a.InputTokens + a.Tokens
	u.OutputTokens, u.Units = a.OutputTokens, a.Units
	if a.USD != "" {
		if cost, err = costmodel.ParseUSD(a.USD); err != nil {
			return u, 0, false, fmt.Errorf("usd: %w", err)
		}
		if cost < 0 {
			return u, 0, false, errors.New("usd must not be negative")
		}
		priced = true
	}
	return u, cost, priced, nil
}

func (a *amounts) requests() int64 {
	if a == nil || a.Requests == nil {
		return 1
	}
	return *a.Requests
}

type reserveRequest struct {
	Cost     *amounts        `json:"cost"`
	Kind     string          `json:"kind"`
	Body     json.RawMessage `json:"body"`
	Upstream string          `json:"upstream"`
	Model    string          `json:"model"`
	Route    string          `json:"route"`
	TTL      string          `json:"ttl"`
	// Attributes are custom attributes: limits keyed by attr.NAME and
	// the policies (request.attributes) see them.
	Attributes map[string]string `json:"attributes"`
}

// maxAttributes bounds the custom attributes of a reservation.
const maxAttributes = 16

// checkAttributes tells what is wrong with a reservation's attributes:
// at most maxAttributes, names as limits name them (config.ValidAttributeName),
// values printable, at most 200 bytes, without the characters that
// delimit the limiter's keys.
func checkAttributes(attrs map[string]string) error {
	if len(attrs) > maxAttributes {
		return fmt.Errorf("at most %d attributes", maxAttributes)
	}
	for k, v := range attrs {
		if !config.ValidAttributeName(k) {
			return fmt.Errorf("attribute name %q: 1 to 64 of a-z, 0-9, _ and -", k)
		}
		if !validName(v) || strings.ContainsAny(v, ":{}=") {
			return fmt.Errorf("attribute %s: a value is printable text of at most 200 bytes without ':', '{', '}' or '='", k)
		}
	}
	return nil
}

type estimateJSON struct {
	Requests     int64             `json:"requests"`
	InputTokens  int64             `json:"input_tokens"`
	OutputTokens int64             `json:"output_tokens"`
	Units        int64             `json:"units"`
	CostUSD      string            `json:"cost_usd"`
	CostNanoUSD  costmodel.NanoUSD `json:"cost_nanousd"`
}

type reserveAnswer struct {
	ReservationID string        `json:"reservation_id"`
	RequestID     string        `json:"request_id"`
	ExpiresAt     string        `json:"expires_at"`
	Estimate      estimateJSON  `json:"estimate"`
	Friction      *frictionJSON `json:"friction,omitempty"`
	Degraded      bool          `json:"degraded"`
}

type settleAnswer struct {
	ReservationID  string            `json:"reservation_id"`
	RequestID      string            `json:"request_id"`
	Status         string            `json:"status"`
	CostUSD        string            `json:"cost_usd"`
	CostNanoUSD    costmodel.NanoUSD `json:"cost_nanousd"`
	AlreadySettled bool              `json:"already_settled"`
}

type frictionJSON struct {
	DelayMS        int64  `json:"delay_ms,omitempty"`
	CapMaxTokens   int64  `json:"cap_max_tokens,omitempty"`
	DowngradeModel string `json:"downgrade_model,omitempty"`
	Warning        string `json:"warning,omitempty"`
}

// decodeStrict reads one JSON object, raw, into v: no unknown field, and
// every field spelled exactly once as v names it (see readAPIBody).
func decodeStrict(raw []byte, v apiBody) error {
	if err := readAPIBody(raw, v); err != nil {
		return fmt.Errorf("reading the JSON body: %w", err)
	}
	return nil
}

func badRequest(w http.ResponseWriter, path, code, msg string) {
	writeError(w, path, http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: code, Message: msg})
}

// validName tells whether s may name a route or a model: printable, at
// most 200 bytes of UTF-8.
func validName(s string) bool {
	if len(s) > 200 || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// apiCall identifies the caller of a reserve/settle API call and reads its
// body into in, answering the client and returning nil when it cannot.
func (s *Server) apiCall(w http.ResponseWriter, r *http.Request, path string, in apiBody) *gate.Caller {
	c := s.gate.Identify(apiKey(r))
	if c == nil {
		writeError(w, path, http.StatusUnauthorized, errUnauthorized)
		return nil
	}
	p := apiBodyBufs.Get().(*[]byte)
	defer func() {
		if cap(*p) <= maxPooledAPIBody {
			apiBodyBufs.Put(p)
		}
	}()
	raw, err := readBodyInto(w, r, time.Now(), maxReserveBody, *p)
	*p = raw[:0]
	if err != nil {
		writeBodyError(w, path, err)
		return nil
	}
	if err := decodeStrict(raw, in); err != nil {
		badRequest(w, path, "invalid_body", err.Error())
		return nil
	}
	return c
}

// apiBodyBufs are apiCall's buffers for the bodies it reads. A body is
// decoded into values of its own (decodeStrict copies every string and
// raw value out of it), so its buffer is reused once apiCall returns.
var apiBodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}

// maxPooledAPIBody bounds the buffers kept in apiBodyBufs: a large body's
// does not stay behind.
const maxPooledAPIBody = 16 << 10

// knownModel tells whether c's price table knows model, or prices
// unknown models at all (costs.free_unknown).
func knownModel(c *gate.Caller, model string) bool {
	_, known := c.Estimator().Price(model)
	return known || c.Config().Costs.FreeUnknown
}

// priceableModel tells whether the caller may name model: text a ledger
// entry can hold, in the price table (or any, under costs.free_unknown).
// Else it answers 400.
func priceableModel(w http.ResponseWriter, path string, c *gate.Caller, model string) bool {
	switch {
	case !validName(model):
		badRequest(w, path, "invalid_model", "model must be printable text of at most 200 bytes")
		return false
	case !knownModel(c, model):
		badRequest(w, path, "unknown_model", fmt.Sprintf("model %q is not in the price table; name a priced model or an alias (costs.prices, costs.aliases)", model))
		return false
	}
	return true
}

// serveReserve is POST /v1/costgate/reserve.
func (s *Server) serveReserve(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/costgate/reserve"
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	ctx, span := s.tel.Tracer().Start(r.Context(), "costgate "+path)
	defer span.End()
	var in reserveRequest
	c := s.apiCall(w, r, path, &in)
	if c == nil {
		return
	}
	req, ok := s.reserveRequest(w, c, &in)
	if !ok {
		return
	}
	req.IP, _, _ = net.SplitHostPort(r.RemoteAddr)
	ttl := c.Config().Reservations.DefaultTTL
	if in.TTL != "" {
		d, err := time.ParseDuration(in.TTL)
		if err != nil || d < time.Second || d > c.Config().Reservations.MaxTTL {
			badRequest(w, path, "invalid_ttl", fmt.Sprintf("ttl must be a duration from 1s to %s, such as 30s or 5m", c.Config().Reservations.MaxTTL))
			return
		}
		ttl = d
	}
	if d, refused := s.gate.Prefilter(req); refused {
		writeDecision(w, path, d)
		return
	}
	// The debit and its record run to their end whatever the caller does
	// meanwhile: a hang-up is no store outage (a decision on the fallback
	// budgets, a 503) and must not leave half a reservation.
	work := context.WithoutCancel(ctx)
	res, d := s.gate.Reserve(work, req)
	if d.Degraded {
		w.Header().Set("Costgate-Degraded", "fail-open")
	}
	if res == nil {
		writeDecision(w, path, d)
		return
	}
	// Friction costgate can apply itself (a delay, a warning) it applies;
	// the rest (a max_tokens cap, a downgrade) is the caller's to apply.
	f := d.Friction
	var applied []string
	if f.DelayMS > 0 {
		if err := s.frictionDelay(ctx, req.Caller.Tenant, f.DelayMS); err != nil {
			res.Cancel(work)
			if errors.Is(err, errDelayBacklog) {
				writeDelayBacklog(w, path, f.DelayMS)
			}
			return
		}
		applied = append(applied, d.FrictionNote("delay", d.Sources.DelayMS))
	}
	if f.Warning != "" {
		w.Header().Set("Costgate-Warning", f.Warning)
		applied = d.WarnNotes(applied, "warn")
	}
	if f.CapMaxTokens > 0 {
		applied = append(applied, d.FrictionNote("cap_max_tokens", d.Sources.CapMaxTokens))
	}
	if f.DowngradeModel != "" {
		applied = append(applied, d.FrictionNote("downgrade_model", d.Sources.DowngradeModel))
	}
	if len(applied) > 0 {
		note := strings.Join(applied, ", ")
		res.Applied(note, "")
		w.Header().Set("Costgate-Friction", note)
	}
	if d, ok := res.Record(work); !ok {
		writeDecision(w, path, d)
		return
	}
	// A caller gone before its answer never learns the reservation's id:
	// nobody could settle or release it, and at its expiry it would be
	// charged its estimate. It is cancelled instead (ledger status failed,
	// no charge).
	if ctx.Err() != nil {
		res.Cancel(work)
		return
	}
	id, exp := res.Hold(ttl)
	res.Report(http.StatusOK)
	setRateLimit(w.Header(), d.RateLimit)
	reserved := res.Request() // what the gate reserved (a learned output estimate, under output_reserve: pNN; requests 0 as 1)
	est := reserved.Estimate
	out := reserveAnswer{
		ReservationID: id, RequestID: res.ID(), ExpiresAt: exp.UTC().Format(time.RFC3339Nano),
		Estimate: estimateJSON{Requests: reserved.Requests, InputTokens: est.Usage.InputTokens, OutputTokens: est.Usage.OutputTokens,
			Units: est.Usage.Units, CostUSD: usdText(est.Cost), CostNanoUSD: est.Cost},
		Degraded: d.Degraded,
	}
	if !f.IsZero() {
		fj := frictionJSON(f)
		out.Friction = &fj
	}
	p := answerBuf()
	*p = out.appendJSON(*p)
	writeAnswer(w, http.StatusOK, p)
}

// reserveRequest turns a reserve body into the gate's request: its cost
// from the amounts given, or an LLM body estimated as the proxy would. It
// answers the client and returns false on bad input.
func (s *Server) reserveRequest(w http.ResponseWriter, c *gate.Caller, in *reserveRequest) (*gate.Request, bool) {
	const path = "/v1/costgate/reserve"
	req := &gate.Request{Caller: c, Route: reserveRoute, Upstream: in.Upstream, Open: true}
	if err := checkAttributes(in.Attributes); err != nil {
		badRequest(w, path, "invalid_attributes", err.Error())
		return nil, false
	}
	req.Attributes = in.Attributes
	st := s.state.Load()
	var u *upstream
	if in.Upstream != "" {
		if u = st.upstreams[in.Upstream]; u == nil {
			badRequest(w, path, "unknown_upstream", fmt.Sprintf("no upstream is configured under the name %q", in.Upstream))
			return nil, false
		}
	}
	// Limits may be keyed by route and model: a name the caller makes up
	// must not be a fresh allowance each time. The policies see the route
	// the caller names; limits and the ledger see it only when it is one
	// costgate serves (an API path, /u/UPSTREAM), else the reserve API's
	// own. A model must be one the price table knows.
	if in.Route != "" {
		if !validName(in.Route) {
			badRequest(w, path, "invalid_route", "route must be printable text of at most 200 bytes")
			return nil, false
		}
		req.Name = in.Route
		if knownRoute(st, in.Route) {
			req.Route = in.Route
		}
	}
	if in.Model != "" && !priceableModel(w, path, c, in.Model) {
		return nil, false
	}
	switch {
	case in.Cost != nil && len(in.Body) > 0:
		badRequest(w, path, "invalid_body", "give cost, or kind and body to estimate, not both")
		return nil, false
	case len(in.Body) > 0:
		kind, err := costmodel.ParseKind(in.Kind)
		if err != nil || kind == costmodel.Generic {
			badRequest(w, path, "invalid_kind", "kind must name an LLM API: chat_completions, completions, embeddings, responses or anthropic_messages")
			return nil, false
		}
		est, err := c.Estimator().Estimate(kind, in.Body)
		if errors.Is(err, costmodel.ErrCostOverflow) {
			badRequest(w, path, "cost_exceeds_limit", "this request's cost cannot be represented: "+err.Error())
			return nil, false
		}
		if err != nil {
			badRequest(w, path, "invalid_body", "body: "+err.Error())
			return nil, false
		}
		if !priceableModel(w, path, c, est.Model) {
			return nil, false // a made-up model in the body would be a fresh allowance of a limit keyed by model too
		}
		req.Estimate, req.Requests = est, 1
		return req, true
	case in.Kind != "":
		badRequest(w, path, "invalid_body", "kind needs a body to estimate")
		return nil, false
	}
	a := in.Cost
	if a == nil {
		a = &amounts{}
	}
	usage, cost, priced, err := a.usage()
	if err != nil {
		badRequest(w, path, "invalid_cost", "cost: "+err.Error())
		return nil, false
	}
	if !priced {
		cost = priceUsage(c.Estimator(), u, in.Model, usage)
	}
	if overflows(usage, cost) {
		badRequest(w, path, "cost_exceeds_limit", "this reservation's cost cannot be represented; lower its amounts")
		return nil, false
	}
	req.Requests = a.requests()
	// Reserved by its amounts: no LLM API's answer is the one it awaits
	// (see serveSettle).
	req.Estimate = costmodel.Estimate{Kind: costmodel.Generic, Model: in.Model, Usage: usage, Cost: cost}
	return req, true
}

// knownRoute tells whether route is one costgate serves: an API path, or
// /u/NAME of a configured generic upstream.
func knownRoute(st *state, route string) bool {
	if _, ok := config.RouteKinds[route]; ok {
		return true
	}
	name, ok := strings.CutPrefix(route, "/u/")
	if !ok {
		return false
	}
	u := st.upstreams[name]
	return u != nil && u.kind == "generic"
}

// overflows tells whether an amount reached costmodel's saturation bound,
// where a count or a cost no longer says what it is.
func overflows(u costmodel.Usage, cost costmodel.NanoUSD) bool {
	const top = math.MaxInt64
	tokens := u.InputTokens + u.OutputTokens
	return cost >= top || u.InputTokens >= top || u.OutputTokens >= top || u.Units >= top ||
		tokens < 0 || tokens == top
}

// priceUsage prices usage that came without a dollar amount: its units by
// a generic upstream's cost rule, its tokens by model's price when a model
// is named, the two added when both are; with neither it costs nothing in
// dollars. (A rule priced tokens at nothing: naming an upstream made a
// model's tokens free.)
func priceUsage(est *costmodel.Estimator, u *upstream, model string, usage costmodel.Usage) costmodel.NanoUSD {
	generic := u != nil && u.kind == "generic" && u.cost != nil
	switch {
	case generic && model != "":
		tokens := usage
		tokens.Units = 0
		return costmodel.AddSat(u.cost.Price().Cost(costmodel.Usage{Units: usage.Units}), est.Cost(model, tokens))
	case generic:
		return u.cost.Price().Cost(usage)
	case model != "":
		return est.Cost(model, usage)
	}
	return 0
}

type settleRequest struct {
	ReservationID string          `json:"reservation_id"`
	Usage         *amounts        `json:"usage"`
	Response      json.RawMessage `json:"response"`
	Kind          string          `json:"kind"`
	Status        string          `json:"status"`
	Model         string          `json:"model"`
}

// resume finds the reservation a settle or release names, answering the
// client when it cannot.
func (s *Server) resume(ctx context.Context, w http.ResponseWriter, path string, c *gate.Caller, id string) (*gate.Reservation, bool) {
	if id == "" {
		badRequest(w, path, "invalid_body", "reservation_id is required")
		return nil, false
	}
	res, _, err := s.gate.Resume(ctx, c, id)
	if err != nil {
		writeReservationError(w, path, err)
		return nil, false
	}
	return res, true
}

func writeReservationError(w http.ResponseWriter, path string, err error) {
	switch {
	case errors.Is(err, gate.ErrExpired):
		writeError(w, path, http.StatusGone, apiError{Type: "invalid_request_error", Code: "reservation_expired",
			Message: "the reservation is past its expiry; unless it was settled or released before, it was settled at its estimate"})
	case errors.Is(err, gate.ErrReleased):
		writeError(w, path, http.StatusConflict, apiError{Type: "invalid_request_error", Code: "reservation_released",
			Message: "the reservation was released"})
	case errors.Is(err, gate.ErrSettled):
		writeError(w, path, http.StatusConflict, apiError{Type: "invalid_request_error", Code: "reservation_settled",
			Message: "the reservation was settled; it cannot be released"})
	default:
		writeError(w, path, http.StatusNotFound, apiError{Type: "invalid_request_error", Code: "unknown_reservation",
			Message: "no reservation of this tenant has that id"})
	}
}

// serveSettle is POST /v1/costgate/settle.
func (s *Server) serveSettle(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/costgate/settle"
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	var in settleRequest
	c := s.apiCall(w, r, path, &in)
	if c == nil {
		return
	}
	// Once read, a settlement is carried out whether or not its caller
	// waits for the answer: a cut connection must not keep usage off the
	// limits.
	work := context.WithoutCancel(r.Context())
	res, ok := s.resume(work, w, path, c, in.ReservationID)
	if !ok {
		return
	}
	if in.Model != "" && !priceableModel(w, path, c, in.Model) {
		return
	}
	ch := gate.Charge{Status: ledger.StatusSettled, HTTPStatus: http.StatusOK, Model: in.Model}
	switch in.Status {
	case "", "settled":
	case "failed":
		ch.Status, ch.HTTPStatus = ledger.StatusFailed, http.StatusBadGateway
	default:
		badRequest(w, path, "invalid_status", `status must be "settled" or "failed"`)
		return
	}
	req := res.Request()
	priced := false
	switch {
	case in.Usage != nil && len(in.Response) > 0:
		badRequest(w, path, "invalid_body", "give usage, or kind and response, not both")
		return
	case len(in.Response) > 0:
		kind, err := costmodel.ParseKind(in.Kind)
		if err != nil || kind == costmodel.Generic {
			badRequest(w, path, "invalid_kind", "kind must name the LLM API that answered: chat_completions, completions, embeddings, responses or anthropic_messages")
			return
		}
		if reserved := req.Estimate.Kind; reserved != costmodel.Generic && reserved != kind {
			// Estimated from an LLM body, the reservation awaits that API's
			// answer: read as another API's, an answer's counts lose what
			// the request reserved that only its own API bills apart (a
			// chat completion's search, which its answer never reports).
			badRequest(w, path, "invalid_kind", "kind is "+kind.String()+" but the reservation was estimated for a "+reserved.String()+" request: settle it with that API's answer, or with usage")
			return
		}
		for _, said := range costmodel.AnswerKinds(in.Response) {
			if said != kind {
				// Read as another API's, an answer loses what only its
				// own API reports (Anthropic's cache tokens, Responses'
				// searches). Every member that names its API counts: of
				// two, encoding/json reads the last, the SDKs the first.
				badRequest(w, path, "invalid_kind", "kind is "+kind.String()+" but the response is a "+said.String()+" answer")
				return
			}
		}
		raw := bytes.TrimSpace(in.Response)
		u, served, err := costmodel.ParseResponse(kind, raw)
		if err != nil {
			badRequest(w, path, "invalid_response", "response: "+err.Error())
			return
		}
		if kind == costmodel.Responses && costmodel.ResponseRunning(raw) {
			// A background run answered queued or in progress: the usage
			// it states (zeros) is not what the run bills, and the proxy
			// reads no usage in it either. The reservation stays open for
			// the run's final answer, or is charged its estimate at expiry.
			badRequest(w, path, "response_running", "response: its run is not over (status queued or in_progress): settle with the run's final answer")
			return
		}
		if ch.Status == ledger.StatusSettled {
			u = withPrompt(askedFor(kind, u, req.Estimate.Usage), req.Estimate.Usage)
		}
		ch.Usage = u
		if ch.Model == "" {
			ch.Model = served
		}
	case in.Usage != nil:
		if in.Usage.Requests != nil {
			badRequest(w, path, "invalid_usage", "usage: requests cannot be settled: a reserved request is spent")
			return
		}
		u, cost, p, err := in.Usage.usage()
		if err != nil {
			badRequest(w, path, "invalid_usage", "usage: "+err.Error())
			return
		}
		if ch.Status == ledger.StatusSettled {
			// Counts say nothing of what the request asked for that the
			// upstream bills apart, searches (web and file) and containers
			// among them: charged as reserved, which is never less than
			// the reservation for what the settlement cannot count.
			est := req.Estimate.Usage
			u.WebSearchRequests = max(u.WebSearchRequests, est.WebSearchRequests)
			u.FileSearchCalls = max(u.FileSearchCalls, est.FileSearchCalls)
			u = u.DearerParts(est).Asked(est)
		}
		ch.Usage, ch.Cost, priced = u, cost, p
	case ch.Status != ledger.StatusFailed:
		badRequest(w, path, "invalid_body", "usage, or kind and response, is required")
		return
	}
	if !priced {
		ch.Cost = s.settlementCost(req, ch)
	}
	// A usage that costs more than one entry can be charged is charged
	// that much, as the proxy charges such an answer: refused, it would
	// leave the reservation to expire at its estimate.
	ch.Cost = min(ch.Cost, ledger.MaxCost)
	if overflows(ch.Usage, ch.Cost) {
		badRequest(w, path, "cost_exceeds_limit", "this usage's cost cannot be represented")
		return
	}
	got, again, err := res.SettleHeld(work, ch)
	if err != nil {
		writeReservationError(w, path, err)
		return
	}
	status := "settled"
	if got.Status == ledger.StatusFailed {
		status = "failed"
	}
	out := settleAnswer{ReservationID: in.ReservationID, RequestID: res.ID(), Status: status,
		CostUSD: usdText(got.Cost), CostNanoUSD: got.Cost, AlreadySettled: again}
	p := answerBuf()
	*p = out.appendJSON(*p)
	writeAnswer(w, http.StatusOK, p)
}

// settlementCost prices a settlement that names no dollar amount. A failed
// call is charged what its usage costs at the model's price (an LLM
// upstream reports what it billed for an error), never per call. A call
// that succeeded is priced by the upstream's cost rule or the model's
// price; with neither, the reservation's dollars stand.
func (s *Server) settlementCost(req *gate.Request, ch gate.Charge) costmodel.NanoUSD {
	model := ch.Model
	if model == "" {
		model = req.Estimate.Model
	}
	var u *upstream
	if req.Upstream != "" {
		u = s.state.Load().upstreams[req.Upstream]
	}
	generic := u != nil && u.kind == "generic" && u.cost != nil
	// At the prices in force when it is settled, as the upstream's rule
	// is: whichever replica settles, the same settlement bills the same.
	est := s.gate.Estimator()
	// A model the table does not know can only be the one the answer
	// names (a settlement that names one is refused): priced no lower
	// than the model reserved, as the proxy prices such an answer.
	// reserved is that model, "" when the answer's model is priced as
	// it is.
	reserved := req.Estimate.Model
	if _, known := est.Price(model); known || model == "" || reserved == model {
		reserved = ""
	}
	switch {
	case ch.Status == ledger.StatusFailed && model != "":
		u := ch.Usage
		if generic {
			u.Units = 0 // a generic upstream's units are its rule's, which charges no error; the model's tokens are charged
		}
		c := est.Cost(model, u)
		if reserved != "" {
			c = max(c, est.Cost(reserved, u))
		}
		return c
	case ch.Status == ledger.StatusFailed:
		return 0
	case generic || model != "":
		c := priceUsage(est, u, model, ch.Usage)
		if reserved != "" {
			c = max(c, priceUsage(est, u, reserved, ch.Usage))
		}
		return c
	}
	return req.Estimate.Cost
}

// askedFor is u, the usage read from an answer of API kind to a call that
// succeeded, with what its reservation's request asked for (est, its
// estimated usage) that the upstream bills and its answer does not report,
// as the proxy charges a call: the speed and the containers (Usage.Asked),
// and a chat completion's web search (web_search_options, a search model),
// billed per request and never in its usage. (The kind is the settlement's,
// which is the API the reservation was estimated for when it was reserved
// from a body (the ticket carries it to every replica; serveSettle
// refuses another) and which the answer itself confirms. Responses and
// Anthropic answers report their searches, which are read.)
func askedFor(kind costmodel.Kind, u, est costmodel.Usage) costmodel.Usage {
	if kind == costmodel.ChatCompletions {
		u.WebSearchRequests = max(u.WebSearchRequests, est.WebSearchRequests)
	}
	return u.Asked(est)
}

// serveRelease is POST /v1/costgate/release.
func (s *Server) serveRelease(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/costgate/release"
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	var in releaseRequest
	c := s.apiCall(w, r, path, &in)
	if c == nil {
		return
	}
	work := context.WithoutCancel(r.Context()) // as a settlement's
	res, ok := s.resume(work, w, path, c, in.ReservationID)
	if !ok {
		return
	}
	if err := res.Release(work); err != nil {
		writeReservationError(w, path, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"reservation_id": in.ReservationID, "request_id": res.ID(), "status": "released"})
}

// usdText is n as a decimal dollar amount without a symbol: n.String()
// without its leading "$" (a negative amount keeps "-$").
func usdText(n costmodel.NanoUSD) string {
	var buf [32]byte
	b := n.AppendUSD(buf[:0])
	if n >= 0 {
		b = b[1:]
	}
	return string(b)
}
