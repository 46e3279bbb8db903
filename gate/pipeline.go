package gate

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// Request is what a front door asks the gate to admit: who, which route
// and upstream, and what it is estimated to cost.
type Request struct {
	// ID is the request id, the ledger's idempotency key; empty makes a
	// new one (see NewID).
	ID string
	// Caller is who sends the request (Identify, Trusted). Required.
	Caller *Caller
	// Route names the API the request uses, as limits and policies see it:
	// an API path (/v1/chat/completions), /u/NAME for a generic upstream,
	// /v1/costgate/reserve, or rls:DOMAIN.
	Route string
	// Name is what the policies and the ledger see as the route when it is
	// not Route: a name the caller gives the request (the reserve API's
	// route), which limits are never keyed by.
	Name     string
	Upstream string
	// Estimate is the request's estimated usage and cost; Model in it is
	// the model asked for (model limits use its canonical name).
	Estimate costmodel.Estimate
	IP       string
	// Page is the result page a paginated generic request asks for, for
	// the policies; 0 for none.
	Page int64
	// Attributes are custom attributes the caller gives the request (the
	// reserve API's): limits keyed by attr.NAME use them, and the policies
	// see them as request.attributes. The gate does not copy the map.
	Attributes map[string]string
	// Requests is how many requests the request counts for on limits in
	// requests; 0 means 1, unless NoRequests is set.
	Requests int64
	// NoRequests makes a Requests of 0 count for no request: the request
	// is a charge for usage already served (the RLS server's debit of a
	// stream's actual tokens), not a request of its own.
	NoRequests bool
	// ExtraOnly applies the Extra limits alone: the configured limits and
	// budgets do not apply (an RLS request that names no tenant).
	ExtraOnly bool
	// Extra are limits the front door adds to the configured ones (the RLS
	// server's descriptor limits), debited in the same atomic call.
	Extra []Extra
	// Check asks only whether every limit has room for the request (a
	// cost of zero asks for one unit), and debits nothing: the decision
	// has no reservation. The policies (unless NoPolicy) answer it as
	// they would the request.
	Check bool
	// NoPolicy skips the policies.
	NoPolicy bool
	// Served marks usage already served (the RLS server's charge of a
	// stream's actual tokens): a fact to count, not a question. Reserve
	// admits it whatever the limits, the caller's levels and the policies
	// say, and debits nothing: its reservation holds a cost of zero on
	// every limit and no concurrency unit, and Settle charges each limit
	// the actual cost, clamped as weighted.Store's Settle clamps (at most
	// one capacity beyond the reservation; a token bucket or GCRA owes up
	// to one capacity beyond empty; a window or a budget fills up to
	// full), and bills the ledger entry Record wrote in full.
	// While the limiter store is out the reservation lives in the local
	// fallback, whatever each limit's posture, and the ledger's spend
	// brings the budgets up when the store returns. Check and NoPolicy
	// are ignored.
	Served bool
	// States asks for Decision.Limits, the state of every limit checked.
	States bool
	// Final marks a debit whose cost is final when made (the RLS server's
	// debit of hits_addend), to be settled at once at its estimate: the
	// limiter store keeps nothing for a later settlement of its windows
	// (weighted.Item.Final), and that settlement makes no store call
	// unless a concurrency unit is to be released.
	Final bool
	// Open marks a request whose settlement may charge any limit more
	// than its estimate costs there (the reserve API's reported usage, a
	// generic upstream's units read from its answer): on a limit where
	// the estimate costs nothing it reserves one unit, so that it is
	// refused once that limit is spent. Other requests reserve their
	// estimate's cost, 0 included (an embedding on a limit in output
	// tokens, which it never produces).
	Open bool
}

// Extra is a limit a front door adds to a request.
type Extra struct {
	Limit weighted.Limit
	// Unit names what Cost counts (requests, tokens, usd, ...), for the
	// RateLimit fields.
	Unit string
	// Key is the limit's key. A key that starts with the tenant's hash
	// tag ({tenant}) lives in the tenant's Redis Cluster slot, which an
	// atomic debit with the tenant's other limits needs.
	Key  string
	Cost int64
	// Charged is what a Served request charges on the limit (what its
	// Charge.Extra holds for it), recorded in its ledger entry at Record
	// with the limit and key (see ledger.Entry.KeyDesc), so that a
	// restore after a loss brings the counter back; a request that is not
	// Served records its Cost.
	Charged int64
	// Dimension names what the key is made of, for telemetry.
	Dimension  string
	Shadow     bool
	FailClosed bool
	// Forget leaves the limit's counter out of the restores after the
	// store loses its data: it starts empty then, one more window, and
	// the request's ledger entry does not record it (see descAmount).
	Forget bool
}

// NewID returns "req_" and 128 bits in hex: 48 bits of Unix milliseconds,
// then 80 random bits. The time prefix keeps ids in the order requests
// arrived, so that the ledger, which keys entries by id, appends to its
// index instead of writing all over it.
func NewID() string {
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
	var id [4 + 2*len(b)]byte // "req_" and the hex, made a string in one allocation
	copy(id[:], "req_")
	hex.Encode(id[4:], b[:])
	return string(id[:])
}

// Reservation is an admitted request's hold on its limits and its ledger
// entry: Record writes the entry, and Settle (or Cancel) ends it. One
// goroutine at a time owns it.
type Reservation struct {
	g   *Gate
	st  *state
	req Request
	// resID names the reservation in the limiter: the request id, or,
	// after a shadow limit's denial, another one for the second debit (on
	// Redis Cluster a denial's compensation closes the first id).
	resID string
	start time.Time
	model string // the canonical model, which model limits are keyed by
	// region is the region a restore keys a counter of a limit keyed by
	// region by (see Gate.ledgerGroupCounters); empty on a request, keyed
	// by this replica's (its configuration's Region).
	region string
	// written is what a restore keys a counter of a limit keyed by ip or
	// an attribute by, as the ledger recorded the debit's key (see
	// Gate.ledgerGroupCounters); nil on a request, keyed by its own.
	written *writtenDims
	// keyIP and keyAttrs are what the reservation's entries record of
	// its address and attributes (see keyDims.record), once keysRead.
	keyIP, keyAttrs string
	keysRead        bool

	limits    []*compiledLimit // the limits that apply, parallel to items
	items     []weighted.Item
	limitsBuf [4]*compiledLimit
	itemsBuf  [4]weighted.Item
	statesBuf [4]weighted.ItemState // the debit's result, where the store can keep it (see freshStore.DebitInto)
	actualBuf [4]int64              // the settlement's actual costs, where they fit (see settle)
	result    weighted.Result
	// unrestored tells that a level budget of the caller waits for its
	// counter's restore (see LevelLimit.MarkUnrestored).
	unrestored bool
	// decision is what the ledger and the telemetry keep of the policies'
	// decision (see decide).
	decision struct {
		Outcome policies.Outcome
		Policy  string
	}
	friction         string // the friction a front door applied (Costgate-Friction)
	degraded         bool   // the store failed; the reservation is in the local fallback fb
	fb               *freshStore
	unscaled         []weighted.Item // a degraded reservation's items as the store has them (see spentOnFallback)
	leased           atomic.Bool     // registered with the renewer (see renewer.remove)
	tracked          atomic.Bool     // counted in st.inflight (see track)
	inflight         *atomic.Int64   // the count track added r to
	carried          bool            // carryOver ran
	debited          bool            // the store debited r: lossSeq is set
	lossSeq          uint32          // the store's restores when its debit came back (see losses)
	fbDebit          *freshStore     // the local fallback when the store debited r (see rechargeFallback)
	fbSeq            uint32          // fbDebit's restores then
	restoresAtRecord uint64          // Gate.restores when Record began (see carryOver)
	learnt           *learnedOutput  // nil: the request's output is not learned (see learn)

	outcome  telemetry.Outcome
	answer   int            // the status costgate answered with itself
	blocked  *compiledLimit // the limit that refused the request, if one did
	reported bool           // the decision went to telemetry (see Report)
	recorded bool           // the ledger holds the reservation
	billed   bool           // the ledger entry is final
	ended    bool           // settled or cancelled in the limiter
	expires  time.Time      // a held reservation's expiry (see Hold)
	held     *hold          // this replica's hold of it, once Hold made one; nil when resumed from a ticket alone
	ext      *extensions    // the increments debited beyond the reservation (see Extend)
	ctx      context.Context
}

// ID is the request id.
func (r *Reservation) ID() string { return r.req.ID }

// Request is the request as admitted.
func (r *Reservation) Request() *Request { return &r.req }

// Restorable tells whether the reservation, settled with c, counts
// something that only its ledger entry can give back to a limit after
// the store lost its data: requests or tokens (of c's usage) on a limit
// the ledger restores (see compiledLimit.restorable). A front door that
// records in the ledger only what costs money (the rate limit service)
// records such a reservation all the same, at no cost: without its
// entry a restore would count none of it.
func (r *Reservation) Restorable(c Charge) bool {
	n := ledger.Counts{Requests: r.req.Requests, InputTokens: c.Usage.InputTokens, OutputTokens: c.Usage.OutputTokens}
	for _, l := range r.limits {
		if l.restorable() && l.ledgerCount(n) > 0 {
			return true
		}
	}
	return false
}

// Model is the model the limits were keyed by: the canonical name of the
// model asked for.
func (r *Reservation) Model() string { return r.model }

// Degraded tells that the reservation is in the local fallback budgets.
func (r *Reservation) Degraded() bool { return r.degraded }

// stage times one stage of a request, as a metric and a child span.
type stage struct {
	g     *Gate
	name  string
	start time.Time
	span  trace.Span
}

func (g *Gate) begin(ctx context.Context, name string) stage {
	_, sp := g.tel.Tracer().Start(ctx, name)
	return stage{g: g, name: name, start: time.Now(), span: sp}
}

func (t stage) end() {
	t.span.End()
	t.g.tel.Stage(t.name, time.Since(t.start))
}

// requests is how many requests req counts for: Requests, and 0 or less
// means 1 (0 with NoRequests).
func (req *Request) requests() int64 {
	switch {
	case req.Requests > 0:
		return req.Requests
	case req.NoRequests:
		return 0
	}
	return 1
}

// Reserve runs the pipeline for req: it debits every limit and budget that
// applies, all or nothing, then asks the policies. An admitted request
// gets a Reservation, which the front door records (Record) before it
// acts and settles (Settle) or cancels (Cancel) after; a refused one gets
// none. A request with Check set gets no reservation either way.
func (g *Gate) Reserve(ctx context.Context, req *Request) (*Reservation, Decision) {
	r := &Reservation{g: g, st: req.Caller.st, req: *req, start: time.Now(), ctx: ctx}
	r.track()
	if r.req.ID == "" {
		r.req.ID = NewID()
	}
	r.req.Requests = r.req.requests()
	r.resID = r.req.ID
	// Model limits are keyed by the model's canonical name, so that its
	// dated aliases share one allowance.
	r.model = r.st.est.Canonical(r.req.Estimate.Model)
	r.outcome = telemetry.OutcomeAllow
	if r.req.Served {
		// Usage already served asks nothing: it is counted.
		r.req.Check, r.req.NoPolicy = false, true
	} else {
		if d, refused := r.levelRefusal(); refused {
			r.record(d.Status)
			r.untrack()
			return nil, d
		}
		r.learn() // after the refusals that would not give its exposure back
	}
	t := g.begin(ctx, telemetry.StageDebit)
	r.collect()
	d, refused := r.capKeys()
	switch {
	case refused:
	case r.req.Served:
		d = r.served(ctx)
	case r.req.Check:
		d = r.check(ctx)
	default:
		d = r.debit(ctx)
		r.observeLevels(d)
	}
	t.end()
	if r.req.Check && d.Allowed() && r.st.policy != nil && !r.req.NoPolicy {
		// A check reserves nothing, but the policies answer it as they
		// would the request it asks about.
		t = g.begin(ctx, telemetry.StagePolicy)
		d = r.decide(ctx, d)
		t.end()
	}
	if !d.Allowed() || r.req.Check {
		r.record(d.Status)
		r.unexpose()
		r.untrack()
		return nil, d
	}
	// A concurrency limit's lease is renewed until settlement starts (see
	// renewer), or until the reservation ends otherwise.
	g.renewer.add(r)
	if r.st.policy != nil && !r.req.NoPolicy {
		t = g.begin(ctx, telemetry.StagePolicy)
		d = r.decide(ctx, d)
		t.end()
		if !d.Allowed() {
			r.record(d.Status)
			r.untrack()
			return nil, d
		}
	}
	return r, d
}

// collect lists the limits that apply to the request and its items.
func (r *Reservation) collect() {
	r.limits, r.items = r.limitsBuf[:0], r.itemsBuf[:0]
	for _, l := range r.st.limits {
		if r.req.ExtraOnly || !l.appliesTo(r.req.Caller.Plan) || !l.keyedFor(&r.req) {
			continue
		}
		r.limits = append(r.limits, l)
		k := l.key(r)
		lim, shut := r.g.regional(r.ctx, l, k)
		cost := r.reserved(l)
		if shut && cost > 0 {
			// This region's cap is 0, and a limit's least rate is 1: a
			// cost above it is refused as the budget spent here
			// (regionalTooBig), as a cost above any cap is.
			cost = lim.Capacity() + 1
		}
		r.items = append(r.items, weighted.Item{Limit: lim, Key: k, Cost: cost})
		if l.byModel && r.req.Estimate.Usage.Steps != nil {
			r.collectOthers(l)
		}
	}
	r.collectLevels()
	var extras []compiledLimit // the extra limits', in one allocation
	if len(r.req.Extra) > 0 {
		extras = make([]compiledLimit, len(r.req.Extra))
	}
	for i, e := range r.req.Extra {
		extras[i] = compiledLimit{limit: e.Limit, unit: e.Unit, dimension: e.Dimension,
			shadow: e.Shadow, failClosed: e.FailClosed, extra: i + 1}
		if e.FailClosed {
			r.g.noteFailClosedExtra(e.Limit.Name)
		}
		r.limits = append(r.limits, &extras[i])
		r.items = append(r.items, weighted.Item{Limit: e.Limit, Key: e.Key, Cost: e.Cost})
	}
	if r.req.Final {
		for i := range r.items {
			r.items[i].Final = true
		}
	}
}

// reserved is what the request reserves on limit l: its cost there, and,
// for an Open request, at least one unit, so that an Open request of no
// cost on l (0 tokens, $0, a generic call of 0 units) needs room for one,
// as a check does, and is refused once l is spent: its settlement may
// charge any amount. A settlement at 0 refunds the unit. Served requests
// reserve 0 (see served).
func (r *Reservation) reserved(l *compiledLimit) int64 {
	cost := l.costOf(r.req.Requests, r.req.Estimate.Usage, r.req.Estimate.Cost)
	if !r.req.Open {
		return cost
	}
	return max(cost, 1)
}

// check answers a Check request with the store's Peek: each limit must
// have room for the request's cost, at least one unit.
func (r *Reservation) check(ctx context.Context) Decision {
	if len(r.items) == 0 {
		return Decision{Outcome: telemetry.OutcomeAllow}
	}
	for i := range r.items { // a check reserves nothing: its items are its own
		r.items[i].Cost = max(r.items[i].Cost, 1)
	}
	if r.restoreCounters(ctx) != nil {
		return r.overloaded()
	}
	res, err := r.g.store.Peek(ctx, r.items)
	if d, undecided := r.undecided(err); undecided {
		return d
	}
	if err != nil && r.callerLeft(ctx, err) {
		return r.callerGone()
	}
	if err != nil {
		return r.storeFailed(ctx, err, true)
	}
	r.result = res
	if res.Allowed || r.deniedOnlyByShadow() {
		r.shadowWouldBlock()
		return r.admitted()
	}
	return r.deny()
}

// debit reserves the estimate on every limit that applies, all or
// nothing. A denial by shadow limits alone is recorded and not enforced:
// the others are debited again alone.
func (r *Reservation) debit(ctx context.Context) Decision {
	if len(r.items) == 0 {
		return Decision{Outcome: telemetry.OutcomeAllow}
	}
	if r.restoreCounters(ctx) != nil {
		return r.overloaded()
	}
	res, err := r.g.store.DebitInto(ctx, r.resID, r.items, r.statesBuf[:])
	if d, undecided := r.undecided(err); undecided {
		return d
	}
	if err != nil && r.callerLeft(ctx, err) {
		return r.callerGone()
	}
	if err != nil {
		return r.storeFailed(ctx, err, false)
	}
	r.result = res
	if res.Allowed {
		r.noteDebit()
		return r.admitted()
	}
	if r.deniedOnlyByShadow() {
		r.shadowWouldBlock()
		r.dropShadow()
		// On Redis Cluster the denial's compensation closed the first
		// reservation id: the second debit reserves under another.
		r.resID = r.req.ID + ":2"
		return r.debit(ctx)
	}
	d := r.deny()
	r.remember()
	return d
}

// served admits a Served request whatever its limits say. It debits
// nothing: its items hold a cost of zero, which Settle raises to the
// actual cost (a settlement needs no debit before it). The limits' states,
// as a check of zero reads them, fill the decision's fields. A store that
// cannot answer leaves the reservation in the local fallback, so that the
// settlement is counted there rather than lost; a store that cannot
// decide now (overloaded, its counters not yet restored) leaves the
// decision without states, and the settlement is tried all the same.
func (r *Reservation) served(ctx context.Context) Decision {
	if len(r.items) == 0 {
		return Decision{Outcome: telemetry.OutcomeAllow}
	}
	for i := range r.items {
		r.items[i].Cost = 0
	}
	res, err := r.g.store.Peek(ctx, r.items)
	switch {
	case err == nil:
		r.result = res
		return r.admitted()
	case errors.Is(err, weighted.ErrOverloaded), errors.Is(err, weighted.ErrStale):
		r.result = weighted.Result{Decider: -1}
		return Decision{Outcome: telemetry.OutcomeAllow}
	}
	if !errors.Is(err, errBreakerOpen) {
		r.g.log.Warn("limiter store failed; charging the local fallback", "request_id", r.req.ID, "err", err)
	}
	r.toFallback()
	r.result = weighted.Result{Decider: -1}
	d := Decision{Outcome: telemetry.OutcomeAllow}
	// The fallback's Peek brings its budgets up to the ledger's spend
	// before the settlement adds to them.
	if res, err := r.fb.Peek(ctx, r.items); err == nil {
		r.result = res
		d = r.admitted()
	}
	d.Degraded = true
	return d
}

// undecided answers a store's error that is no outage: a cost larger than
// a limit can ever admit (400), or a busy store, or one whose counters
// could not be brought up to the ledger (503 overloaded: admitting past a
// limit is not an answer; the request is shed, and may come back).
// undecided is false for no error and for a store failure, which the
// limits' posture answers.
func (r *Reservation) undecided(err error) (Decision, bool) {
	if err == nil {
		return Decision{}, false // before tooBig, which escapes: no allocation per decision
	}
	var tooBig *weighted.CostError
	switch {
	case errors.As(err, &tooBig):
		if d, ok := r.regionalTooBig(tooBig); ok {
			return d, true
		}
		return r.costTooBig(tooBig), true
	case errors.Is(err, weighted.ErrCrowded):
		return r.crowded(), true
	case errors.Is(err, weighted.ErrOverloaded), errors.Is(err, weighted.ErrStale):
		return r.overloaded(), true
	}
	return Decision{}, false
}

// crowded refuses a request that the store shed because its tenant's
// requests already fill its queue (weighted.ErrCrowded): the tenant's own
// excess, a 429, not the limiter's overload, which the rate limit service
// answers UNAVAILABLE and Envoy lets through.
func (r *Reservation) crowded() Decision {
	r.outcome, r.answer = telemetry.OutcomeHard, http.StatusTooManyRequests
	r.items = r.items[:0]
	d := refusal(telemetry.OutcomeHard, http.StatusTooManyRequests, Error{
		Type: "rate_limit_exceeded", Code: "too_many_requests_waiting",
		Message: "too many of this tenant's requests wait for costgate's limiter; retry in 1 s",
	})
	d.RetryAfter = 1
	return d
}

func (r *Reservation) costTooBig(tooBig *weighted.CostError) Decision {
	r.outcome, r.answer = telemetry.OutcomeNone, http.StatusBadRequest
	r.items = r.items[:0]
	return refusal(telemetry.OutcomeNone, http.StatusBadRequest, Error{
		Type: "invalid_request_error", Code: "cost_exceeds_limit",
		Message: fmt.Sprintf("this request's estimated cost (%d %s) is larger than limit %q can ever admit (%d); lower max_tokens or shorten the prompt",
			tooBig.Cost, r.limitFor(tooBig.Limit).unit, tooBig.Limit, tooBig.Capacity),
	})
}

// callerLeft reports whether err is the caller's context ending, not the
// store failing: a caller that hangs up during the store's call must not
// be admitted on the local fallback as if the store were out.
func (r *Reservation) callerLeft(ctx context.Context, err error) bool {
	return ctx.Err() != nil && !weighted.IsStoreFailure(err) &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// callerGone refuses a request whose caller left while the store decided.
// What the call debited, if it reached the store, stays charged: whether
// it did is unknown, and a refund of a debit never made would be a credit.
func (r *Reservation) callerGone() Decision {
	r.outcome, r.answer = telemetry.OutcomeNone, statusCallerGone
	r.items = r.items[:0]
	return refusal(telemetry.OutcomeNone, statusCallerGone, Error{
		Type: "invalid_request_error", Code: "client_closed_request",
		Message: "the client closed the request before costgate decided on it",
	})
}

// statusCallerGone is the status of a request whose client left before
// the answer (nginx's 499); no client reads it.
const statusCallerGone = 499

func (r *Reservation) overloaded() Decision {
	r.outcome, r.answer = telemetry.OutcomeHard, http.StatusServiceUnavailable
	r.items = r.items[:0]
	d := refusal(telemetry.OutcomeHard, http.StatusServiceUnavailable, Error{
		Type: "service_unavailable", Code: "overloaded",
		Message: "costgate's limiter cannot take a decision now; retry in 1 s",
	})
	d.RetryAfter, d.Undecided = 1, true
	return d
}

func (r *Reservation) shadowWouldBlock() {
	for i, st := range r.result.Items {
		if !st.Allowed && i < len(r.limits) && r.limits[i].shadow {
			r.g.tel.ShadowWouldBlock("", r.limits[i].limit.Name, r.req.Caller.Tenant)
			r.g.log.Info("shadow limit would block", "request_id", r.req.ID, "limit", r.limits[i].limit.Name, "tenant", r.req.Caller.Tenant)
		}
	}
}

func (r *Reservation) limitFor(name string) *compiledLimit {
	for _, l := range r.limits {
		if l.limit.Name == name {
			return l
		}
	}
	return &compiledLimit{}
}

// deniedOnlyByShadow tells whether every limit that denied the debit is a
// shadow limit, and at least one did.
func (r *Reservation) deniedOnlyByShadow() bool {
	shadow := false
	for i, st := range r.result.Items {
		if !st.Allowed && !r.limits[i].shadow {
			return false
		}
		shadow = shadow || !st.Allowed
	}
	return shadow
}

func (r *Reservation) dropShadow() {
	limits, items := r.limits[:0], r.items[:0]
	for i, l := range r.limits {
		if !l.shadow {
			limits = append(limits, l)
			items = append(items, r.items[i])
		}
	}
	r.limits, r.items = limits, items
}

// failClosed returns the refusal of the first enforced fail-closed limit,
// if any, for a store that failed with err.
func (r *Reservation) failClosed(err error) (Decision, bool) {
	if !errors.Is(err, errBreakerOpen) {
		r.g.log.Warn("limiter store failed", "request_id", r.req.ID, "err", err)
	}
	for _, l := range r.limits {
		if l.failClosed && !l.shadow { // a shadow limit never refuses
			r.outcome, r.answer, r.blocked = telemetry.OutcomeHard, http.StatusServiceUnavailable, l
			r.items = r.items[:0]
			return l.storeDown(), true
		}
	}
	return Decision{}, false
}

// storeDown is the refusal of fail-closed limit l while the limiter store
// is unavailable.
func (l *compiledLimit) storeDown() Decision {
	d := refusal(telemetry.OutcomeHard, http.StatusServiceUnavailable, Error{
		Type: "service_unavailable", Code: l.limit.Name,
		Message: "the limiter store is unavailable and limit " + l.limit.Name + " fails closed",
	})
	d.RetryAfter = 1
	return d
}

// toFallback moves the reservation to the local fallback: its items
// scaled to this replica's share, kept in process memory.
func (r *Reservation) toFallback() {
	r.degraded, r.fb = true, r.g.fallbackStore()
	r.g.markBehind(r.items)
	r.unscaled = r.items
	r.items = fallbackItems(r.items, r.st.cfg.Store.FallbackReplicas)
}

// storeFailed applies the limits' posture when the store cannot answer: a
// fail-closed limit refuses with 503; otherwise the request goes on within
// the local fallback budget and says so. A check (Request.Check) is
// answered there too, where the requests and the usage admitted during the
// outage count and the budgets start from the ledger's spend, and writes
// nothing.
func (r *Reservation) storeFailed(ctx context.Context, err error, check bool) Decision {
	if d, closed := r.failClosed(err); closed {
		return d
	}
	// Fail open, within the local fallback budget: the enforced limits,
	// scaled down to this replica's share, in process memory.
	r.dropShadow()
	for _, l := range r.limits {
		r.g.tel.FailOpen(l.limit.Name)
	}
	var res weighted.Result
	if check {
		r.items = fallbackItems(r.items, r.st.cfg.Store.FallbackReplicas)
		res, err = r.g.fallbackStore().Peek(ctx, r.items)
	} else {
		r.toFallback()
		res, err = r.fb.Debit(ctx, r.resID, r.items)
	}
	if err != nil && !errors.As(err, new(*weighted.CostError)) {
		// The fallback could not be brought up to the ledger's spend.
		r.outcome, r.answer = telemetry.OutcomeHard, http.StatusServiceUnavailable
		r.items = r.items[:0]
		d := refusal(telemetry.OutcomeHard, http.StatusServiceUnavailable, Error{
			Type: "service_unavailable", Code: "limiter_unavailable",
			Message: "the limiter store is unavailable and the local budgets cannot be restored; retry in 1 s",
		})
		d.RetryAfter, d.Degraded, d.Undecided = 1, true, true
		return d
	}
	if err != nil {
		// A cost larger than the fallback's capacity: the request cannot
		// fit this replica's share while the store is out.
		r.result = weighted.Result{Decider: 0, Items: make([]weighted.ItemState, len(r.items)), RetryAfter: time.Second}
		for i := range r.items {
			r.result.Items[i] = weighted.ItemState{Capacity: r.items[i].Limit.Capacity()}
		}
		d := r.deny()
		d.Degraded = true
		return d
	}
	r.result = res
	var d Decision
	if res.Allowed {
		d = r.admitted()
	} else {
		d = r.deny()
	}
	d.Degraded = true
	return d
}

// store is where the reservation lives: the limiter store, or the local
// fallback when the store failed.
func (r *Reservation) store() weighted.Store {
	if r.degraded {
		return r.fb
	}
	return r.g.store
}

// admitted is the decision of a request the limits admitted.
func (r *Reservation) admitted() Decision {
	d := Decision{Outcome: telemetry.OutcomeAllow, Limits: r.states()}
	if i, ok := r.decider(); ok {
		d.RateLimit = r.rateLimit(i, ceilSeconds(r.result.Items[i].ResetAfter))
	}
	return d
}

// deny is the refusal of a denied debit: 402 when a budget decided, else
// 429.
func (r *Reservation) deny() Decision {
	res := r.result
	l := r.limits[res.Decider]
	retry := retryAfterSeconds(res.RetryAfter)
	status, typ := http.StatusTooManyRequests, "rate_limit_exceeded"
	msg := fmt.Sprintf("limit %q is exhausted for this %s; retry in %d s", l.limit.Name, l.dimension, retry)
	if l.model != "" {
		msg = fmt.Sprintf("limit %q is exhausted for model %s, which this request may run (its advisor tool or fallbacks), for this %s; retry in %d s",
			l.limit.Name, l.model, l.dimension, retry)
	}
	if l.budget {
		status, typ = http.StatusPaymentRequired, "budget_exceeded"
		msg = fmt.Sprintf("budget %q is spent for this period; it resets in %d s", l.limit.Name, retry)
	}
	r.outcome, r.answer, r.blocked = telemetry.OutcomeHard, status, l
	r.regionRefused(res.Decider)
	d := refusal(telemetry.OutcomeHard, status, Error{
		Type: typ, Code: l.limit.Name, Message: msg, Policy: l.limit.Name,
		RetryAfterMS: res.RetryAfter.Milliseconds(),
	})
	d.RetryAfter = retry
	d.RateLimit = r.rateLimit(res.Decider, retry)
	if r.req.States {
		d.Limits = r.states()
	}
	return d
}

// decider is the index of the limit that decided the request, if any.
func (r *Reservation) decider() (int, bool) {
	i := r.result.Decider
	return i, len(r.items) > 0 && i >= 0 && i < len(r.result.Items) && i < len(r.limits)
}

// rateLimit is limit i's RateLimit fields with t seconds.
func (r *Reservation) rateLimit(i int, t int64) *RateLimit {
	l, st := r.limits[i], r.result.Items[i]
	return &RateLimit{Name: l.limit.Name, Quota: st.Capacity, Window: int64(l.window(time.Now()) / time.Second),
		Unit: l.unit, Remaining: st.Remaining, Reset: t}
}

// states lists every limit's state after the decision.
func (r *Reservation) states() []LimitState {
	if !r.req.States || len(r.result.Items) != len(r.limits) {
		return nil
	}
	out := make([]LimitState, len(r.limits))
	now := time.Now()
	for i, l := range r.limits {
		st := r.result.Items[i]
		out[i] = LimitState{Name: l.limit.Name, Unit: l.unit, Dimension: l.dimension, Key: r.items[i].Key,
			Allowed: st.Allowed, Capacity: st.Capacity, Remaining: st.Remaining,
			Window: l.window(now), ResetAfter: st.ResetAfter, RetryAfter: st.RetryAfter,
			Shadow: l.shadow, Budget: l.budget}
	}
	return out
}

// decide evaluates the policies on an admitted request whose limits
// decided d: a hard decision cancels the reservation and refuses; a soft
// one adds its friction to d.
func (r *Reservation) decide(ctx context.Context, d Decision) Decision {
	in := r.policyInput()
	// Without the caller's cancellation: a client that hangs up while a
	// policy evaluates must not turn its answer into an error, and so into
	// an allow of what it would refuse.
	pd, err := r.st.policies().Decide(context.WithoutCancel(ctx), in)
	if err != nil {
		// A broken policy must not take the API down: it allows, loudly,
		// and the policies that evaluated decide.
		r.g.log.Error("policy evaluation failed; the other policies decide", "request_id", r.req.ID, "err", err)
	}
	r.decision.Outcome, r.decision.Policy = pd.Outcome, pd.Policy
	if r.g.capture != nil {
		r.g.capture.Capture(r.req.ID, in, &pd)
	}
	for _, sh := range pd.Shadow {
		if sh.Outcome != policies.Allow {
			r.g.tel.ShadowWouldBlock(sh.Policy, "", r.req.Caller.Tenant)
			r.g.log.Info("shadow policy would act", "request_id", r.req.ID, "tenant", r.req.Caller.Tenant, "policy", sh.Policy, "outcome", sh.Outcome, "status", sh.Status)
		}
	}
	switch pd.Outcome {
	case policies.Hard:
		if !r.req.Check { // a check debited nothing to give back
			r.Cancel(context.WithoutCancel(ctx))
		}
		status := pd.Status
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
		r.outcome, r.answer = telemetry.OutcomeHard, status
		out := refusal(telemetry.OutcomeHard, status, Error{Type: typ, Code: pd.Policy, Message: pd.Reason, Policy: pd.Policy})
		out.Policy, out.Limits, out.Degraded = pd.Policy, d.Limits, d.Degraded
		// A 403 has no time at which it would decide otherwise: it carries
		// the deciding limit's fields as they stand.
		out.RateLimit = d.RateLimit
		if status != http.StatusForbidden {
			out.RetryAfter = policyRetryAfter
			if out.RateLimit != nil {
				rl := *out.RateLimit
				rl.Reset = policyRetryAfter
				out.RateLimit = &rl
			}
		}
		return out
	case policies.Soft:
		r.outcome = telemetry.OutcomeSoft
		d.Outcome = telemetry.OutcomeSoft
		d.Policy, d.Friction, d.Sources = pd.Policy, pd.Friction, pd.Sources
	}
	return d
}

// otherModels are the models besides its own the request may run (an
// advisor tool's, its fallbacks': see costmodel.Usage.Steps), by their
// canonical names as r.model is; nil for none.
func (r *Reservation) otherModels() []string {
	ms := r.req.Estimate.Usage.Steps.Models()
	for i, m := range ms {
		ms[i] = r.st.est.Canonical(m)
	}
	return ms
}

func (r *Reservation) policyInput() *policies.Input {
	now := time.Now().UTC()
	c, est := r.req.Caller, r.req.Estimate
	in := &policies.Input{
		Caller: policies.Caller{Tenant: c.Tenant, User: c.User, KeyID: c.KeyID, Plan: c.Plan, IP: r.req.IP, Region: r.st.cfg.Region},
		Request: policies.Request{Route: r.policyRoute(), Upstream: r.req.Upstream, Model: r.model, OtherModels: r.otherModels(), Stream: est.Stream,
			MaxOutputTokens: est.MaxOutputTokens, Page: r.req.Page, Attributes: r.req.Attributes},
		Estimate: policies.Estimate{InputTokens: est.Usage.InputTokens, OutputTokens: est.Usage.OutputTokens, CostNanoUSD: int64(est.Cost)},
		Time:     policies.Time{Unix: now.Unix(), Hour: now.Hour(), Weekday: int(now.Weekday())},
	}
	r.estimateInput(&in.Estimate)
	// The limiter has already taken this request's cost (one round trip
	// instead of two); the policy sees each limit as it was before. A
	// check's states are already the ones before.
	if n := min(len(r.limits), len(r.result.Items)); n > 0 {
		in.Limits = make([]policies.Limit, 0, n) // one allocation; nil again below when no limit is listed
	}
	for i, l := range r.limits {
		if i >= len(r.result.Items) {
			break
		}
		if l.model != "" {
			continue // another model's item of a limit listed already (see others.go)
		}
		st := r.result.Items[i]
		if !r.req.Check {
			st.Remaining = min(st.Remaining+r.items[i].Cost, st.Capacity)
		}
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
	if len(in.Limits) == 0 {
		in.Limits = nil
	}
	return in
}

// policyRoute is the route the policies see.
func (r *Reservation) policyRoute() string {
	if r.req.Name != "" {
		return r.req.Name
	}
	return r.req.Route
}

// Applied records what the front door did of the decision's friction: the
// Costgate-Friction value, and the model a downgrade switched to (empty
// for none). The ledger entry carries both.
func (r *Reservation) Applied(friction, model string) {
	r.friction = friction
	if model != "" {
		r.req.Estimate.Model = model
	}
}

// Record writes the reservation's ledger entry, before the front door
// acts on it. When the ledger refuses, the reservation is cancelled and
// the refusal is returned: 400 for text the ledger cannot store (the
// request is at fault), 503 when the ledger is unavailable. A Served
// reservation (usage already served) is not cancelled: its caller settles
// it, so that its limits count the usage whatever the ledger says.
func (r *Reservation) Record(ctx context.Context) (Decision, bool) {
	t := r.g.begin(ctx, telemetry.StageLedger)
	r.restoresAtRecord = r.g.restores.Load()
	err := r.g.ledger.Reserve(ctx, r.entry(ledger.StatusReserved))
	t.end()
	r.untrack()
	if err == nil {
		r.recorded = true
		r.rechargeLost(ctx)
		return Decision{}, true
	}
	return r.ledgerRefused(ctx, err), false
}

// ledgerRefused cancels the reservation the ledger refused (with err),
// unless it is Served usage, and returns the refusal.
func (r *Reservation) ledgerRefused(ctx context.Context, err error) Decision {
	if !r.req.Served {
		r.Cancel(context.WithoutCancel(ctx))
	}
	if errors.Is(err, ledger.ErrInvalid) {
		r.outcome, r.answer = telemetry.OutcomeNone, http.StatusBadRequest
		return refusal(telemetry.OutcomeNone, http.StatusBadRequest, Error{
			Type: "invalid_request_error", Code: "invalid_body", Message: err.Error(),
		})
	}
	r.outcome, r.answer = telemetry.OutcomeHard, http.StatusServiceUnavailable
	r.g.log.Error("ledger reserve failed", "request_id", r.req.ID, "err", err)
	r.Report(http.StatusServiceUnavailable)
	d := refusal(telemetry.OutcomeHard, http.StatusServiceUnavailable, Error{
		Type: "service_unavailable", Code: "ledger_unavailable",
		Message: "costgate cannot record the request in its ledger; try again",
	})
	d.Undecided = true
	return d
}

// Tally is Record for a request that costs nothing and counts only on
// its extra limits (CountsExtra, not Restorable, not Served): its
// counters go to the ledger's aggregate of such calls (ledger.Tally), an
// entry a second rather than one a call, with those under other tags
// (TallyShared's) in the same append, and the reservation is not
// recorded (its settlement writes no entry). It refuses as Record does
// when the ledger cannot take it.
func (r *Reservation) Tally(ctx context.Context) (Decision, bool) {
	var buf [2]ledger.Entry
	es := append(buf[:0], r.entry(ledger.StatusSettled))
	if es[0].KeyDesc == "" {
		// No counter's line fits an entry (see descKeys): an entry of its
		// own, as before tallies, rather than a tally the ledger refuses.
		if d, ok := r.TallyShared(ctx); !ok {
			return d, false
		}
		return r.Record(ctx)
	}
	es = r.sharedEntries(es)
	t := r.g.begin(ctx, telemetry.StageLedger)
	err := r.g.ledger.Tally(ctx, es...)
	t.end()
	r.untrack()
	if err == nil {
		r.rechargeLost(ctx)
		return Decision{}, true
	}
	return r.ledgerRefused(ctx, err), false
}

// Cancel returns the whole reservation to the limits. A reservation
// already recorded in the ledger is settled there as failed, at no cost.
// Cancel after Settle, or twice, does nothing.
func (r *Reservation) Cancel(ctx context.Context) {
	r.cancel(ctx, false)
}

// cancel is Cancel; stored tells that the limiter store cancelled the
// items already (see Gate.end).
func (r *Reservation) cancel(ctx context.Context, stored bool) {
	defer r.untrack() // after the limits have it back
	r.g.renewer.remove(r)
	r.unexpose()
	if r.ended {
		return
	}
	r.ended = true
	if len(r.items) > 0 && !stored {
		if err := r.store().Cancel(ctx, r.resID, r.items); err != nil {
			r.g.log.Warn("limiter cancel failed", "request_id", r.req.ID, "err", err)
		}
	}
	r.cancelExtended(ctx)
	r.carryOver(ctx, Charge{}, true)
	if r.recorded && !r.billed {
		r.Bill(ctx, Charge{Status: ledger.StatusFailed}, false)
	}
}

// Charge is what a request turned out to cost.
type Charge struct {
	Usage costmodel.Usage
	Cost  costmodel.NanoUSD
	// Model is the model priced (the one the upstream says it served);
	// empty keeps the one asked for.
	Model string
	// Status is ledger.StatusSettled (the default) or StatusFailed.
	Status     ledger.Status
	HTTPStatus int
	// Unreached tells that the request never reached the upstream (its
	// connection failed): its request units are returned. A request that
	// reached the upstream spends them, whatever it answered.
	Unreached bool
	// Extra holds the actual cost of each of the request's extra limits;
	// nil keeps their reserved costs.
	Extra []int64
}

// Bill finalizes the reservation's ledger entry with c, once: a later Bill
// or Settle leaves the entry as it is. durable waits for the fsync that
// covers it (see ledger.SettleDurable). It is for a front door that knows
// the cost before the end of its answer reaches the client.
func (r *Reservation) Bill(ctx context.Context, c Charge, durable bool) error {
	if r.billed {
		return nil
	}
	settle := r.g.ledger.Settle
	if durable {
		settle = r.g.ledger.SettleDurable
	}
	if err := settle(context.WithoutCancel(ctx), r.billEntry(c)); err != nil {
		r.g.log.Error("ledger settle failed", "request_id", r.req.ID, "err", err)
		return err
	}
	r.billed = true
	return nil
}

// billEntry is the final ledger entry of the reservation charged c.
func (r *Reservation) billEntry(c Charge) ledger.Entry {
	e := r.entry(c.Status)
	if e.Status == "" || e.Status == ledger.StatusReserved {
		e.Status = ledger.StatusSettled
	}
	if c.Model != "" && ledger.ValidText(c.Model) {
		e.Model = c.Model // else the entry keeps the model asked for, not text the ledger refuses
		r.keyedBy(&e)
	}
	e.HTTPStatus = c.HTTPStatus
	e.Actual, e.ActualCost = c.Usage, c.Cost
	e.SettledAt = time.Now()
	return e
}

// Settle charges or refunds each limit the difference between its
// reserved and its actual cost, and bills the ledger entry (unless Bill
// did). A charge beyond what the reservation holds is billed before the
// limits are charged, so that the death of the process between the two
// never leaves the limits charged and the entry recovered at its
// estimate. It records the request's decision in the telemetry. Settle after
// Cancel, or twice, charges nothing more.
func (r *Reservation) Settle(ctx context.Context, c Charge) {
	r.settle(ctx, c, nil, false)
}

// settle is Settle with actual, what c costs on each limit when the
// caller worked it out already (nil: worked out here); stored tells that
// the limiter store settled the items already (see Gate.end).
func (r *Reservation) settle(ctx context.Context, c Charge, actual []int64, stored bool) {
	defer r.untrack() // once billed
	r.g.renewer.remove(r)
	if !r.ended {
		r.observe(c)
	}
	if !r.ended && len(r.items) > 0 && !stored {
		r.ended = true
		if actual == nil {
			actual = r.actualInto(c, r.actualBuf[:0])
		}
		if r.recorded && !r.billed && r.chargesBeyond(c, actual) {
			// The ledger holds the charge before the limits are charged
			// beyond what they hold: a crash between the two leaves the
			// entry billed at the actual cost and the limits short of it
			// (the budgets' reconciliation, and a restore after a loss,
			// raise them from the ledger), never the limits charged and
			// the entry recovered at its estimate.
			r.carryOver(ctx, c, false)
			r.Bill(ctx, c, false)
		}
		if r.billed && !r.degraded {
			// Billed before its limits are settled (a front door's Bill):
			// a restore since may have counted what it cost.
			actual = refundsKept(&r.g.store.lost, r.lossSeq, r.items, r.ext, actual)
		}
		if r.ext != nil {
			r.refreshKeys()
			r.settleExtended(ctx, actual)
		} else if !unchanged(r.items, actual) {
			r.refreshKeys()
			if err := r.store().Settle(ctx, r.resID, r.items, actual); err != nil {
				r.g.log.Warn("limiter settle failed", "request_id", r.req.ID, "err", err)
				if !r.degraded {
					r.keepUnsettled(r.resID, r.items, actual)
				}
			}
		} else {
			r.g.endedAtEstimate(r.resID, r.items)
		}
		if r.degraded && r.ext == nil {
			r.g.spentOnFallback(r.resID, r.unscaled, actual) // settleExtended keeps an extended one's
		}
	}
	r.ended = true
	r.unexpose() // after the store charged what the answer took beyond it
	model := c.Model
	if model == "" {
		model = r.req.Estimate.Model
	}
	r.g.tel.Usage(r.req.Caller.Tenant, modelLabel(r.req.Caller.Estimator(), model), c.Usage.InputTokens, c.Usage.OutputTokens, int64(c.Cost))
	r.carryOver(ctx, c, false)
	if r.recorded && !r.billed {
		r.Bill(ctx, c, false)
	}
	if r.degraded {
		r.g.markBehind(r.items) // once billed: the catch-up reads the ledger
	}
	r.Report(c.HTTPStatus)
}

// keepUnsettled keeps the settlement of debit id (items, charged
// actual) that the limiter store failed, to be made again before the
// store's next call on its tenant. It is billed next: a restore after
// this may count what it cost, and the replay then refunds nothing on
// the tags restored since r's debit.
func (r *Reservation) keepUnsettled(id string, items []weighted.Item, actual []int64) {
	r.g.unsettledAs(pendingSettle{id: id, items: slices.Clone(items), actual: slices.Clone(actual), debit: true, lossSeq: r.lossSeq})
}

// chargesBeyond tells whether c, costing actual on each limit, charges
// more than the reservation holds: more than its estimate's price and the
// increments extended, or more on some limit than its item and the
// increments on it hold. It allocates nothing.
func (r *Reservation) chargesBeyond(c Charge, actual []int64) bool {
	est := r.req.Estimate.Cost
	if r.ext != nil {
		est = costmodel.AddSat(est, r.ext.cost)
	}
	if c.Cost > est {
		return true
	}
	for i := range r.items {
		if i < len(actual) && actual[i] > r.holds(i) {
			return true
		}
	}
	return false
}

// holds is what the reservation's item i and the increments extended on
// it hold.
func (r *Reservation) holds(i int) int64 {
	h := r.items[i].Cost
	if r.ext == nil {
		return h
	}
	for _, e := range r.ext.debts {
		for j, k := range e.index {
			if k == i {
				h = costmodel.AddSat(h, e.items[j].Cost)
			}
		}
	}
	return h
}

// actual is what c costs on each of the reservation's limits.
func (r *Reservation) actual(c Charge) []int64 {
	return r.actualInto(c, nil)
}

// actualInto is actual, in buf when it has room for every limit.
func (r *Reservation) actualInto(c Charge, buf []int64) []int64 {
	actual := buf[:0]
	if cap(actual) < len(r.items) {
		actual = make([]int64, len(r.items))
	} else {
		actual = actual[:len(r.items)]
	}
	for i, l := range r.limits {
		switch {
		case l.extra > 0:
			actual[i] = r.items[i].Cost
			if j := l.extra - 1; j < len(c.Extra) {
				actual[i] = max(c.Extra[j], 0)
			}
		case l.unit == "requests" && c.Unreached:
			actual[i] = 0
		case l.model != "":
			actual[i] = r.otherCost(l, c.Usage, r.items[i].Cost)
		default:
			actual[i] = l.costOf(r.req.Requests, c.Usage, c.Cost)
		}
	}
	return actual
}

// Report records the admitted request's decision in the telemetry, with
// status, the status it was answered with, on the span of the context
// Reserve was given: a front door calls it before that span ends. Settle
// reports a request that was not reported. Only the first call counts.
func (r *Reservation) Report(status int) {
	if r.reported {
		return
	}
	r.reported = true
	r.record(status)
}

// endedAtEstimate tells the leases that reservation id of items, whose
// Settle is skipped (unchanged), ended: they would otherwise remember it
// for hours, a map entry per request. A reservation of no leased item
// costs nothing here.
func (g *Gate) endedAtEstimate(id string, items []weighted.Item) {
	if g.leases == nil {
		return
	}
	for i := range items {
		if items[i].Limit.Lease.On() {
			g.leases.Ended(id)
			return
		}
	}
}

// unchanged tells whether settling items at actual costs changes nothing
// in the store, so that the call is not made: every actual cost is the
// reserved one, and no item holds a concurrency unit or a window's
// reservation record, which a settlement releases (a Final item's record
// expires on its own: see weighted.Item.Final). An RLS decision, final at
// once, is settled so.
func unchanged(items []weighted.Item, actual []int64) bool {
	for i, it := range items {
		if actual[i] != it.Cost {
			return false
		}
		switch it.Limit.Algorithm {
		case weighted.Concurrency:
			if it.Cost > 0 {
				return false
			}
		case weighted.FixedWindow, weighted.SlidingWindow:
			if it.Cost > 0 && !it.Final {
				return false
			}
		}
	}
	return true
}

// SettleLater settles on a goroutine the gate owns, so that the front
// door's caller is free at once; Close waits for it. done runs after the
// settlement, on that goroutine. A settlement that calls no remote store
// (see settlesInProcess) runs at once on the caller's goroutine instead:
// it takes a few microseconds, less than starting a goroutine and waking
// a processor for it.
func (r *Reservation) SettleLater(c func() Charge, done func()) {
	r.g.renewer.remove(r)
	t := r.g.begin(r.ctx, telemetry.StageSettle)
	if r.settlesInProcess() {
		r.Settle(context.WithoutCancel(r.ctx), r.charged(c))
		t.end()
		if done != nil {
			done()
		}
		return
	}
	r.g.settles.Add(1)
	go func() {
		defer r.g.settles.Done()
		defer t.end()
		if done != nil {
			defer done()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.Settle(ctx, r.charged(c))
	}()
}

// charged is c's charge. When c panics (a front door's reading of an
// answer that went wrong on some input), the panic is logged and the
// request is charged what its limits hold: the estimate and the
// increments extended (see Extend). Its entry is settled, never lost with
// the goroutine, and the increments a stream was let through stay spent.
func (r *Reservation) charged(c func() Charge) (ch Charge) {
	defer func() {
		if v := recover(); v != nil {
			r.g.log.Error("working out the charge panicked; charging the reservation", "request_id", r.req.ID,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			u, cost := r.Extended()
			ch = Charge{Usage: addUsage(r.req.Estimate.Usage, u), Cost: costmodel.AddSat(r.req.Estimate.Cost, cost), Status: ledger.StatusSettled}
		}
	}()
	return c()
}

// settlesInProcess tells whether settling r calls no store over the
// network: its limits live in this process (the memory store, the local
// fallback), or this replica's leases held all of them, and no increment
// beyond the reservation is held (see Extend). The ledger's part of a
// settlement is a local append in every case.
func (r *Reservation) settlesInProcess() bool {
	switch {
	case r.ext != nil:
		return false
	case r.ended || len(r.items) == 0 || r.degraded:
		return true
	case r.g.leases != nil:
		return r.g.leases.Local(r.resID, len(r.items))
	}
	return r.g.redis == nil
}

// Price is what usage costs at model's price in the reservation's
// configuration.
func (r *Reservation) Price(model string, u costmodel.Usage) costmodel.NanoUSD {
	return r.st.est.Cost(model, u)
}

// record reports the request's decision to telemetry and logs it: a
// refused request at info level, a served one at debug level. status is
// the status the request was answered with.
func (r *Reservation) record(status int) {
	if r.outcome == telemetry.OutcomeNone {
		return
	}
	c := r.req.Caller
	d := telemetry.Decision{Tenant: c.Tenant, Route: r.req.Route, Model: r.req.Estimate.Model, Policy: r.decision.Policy, Outcome: r.outcome}
	d.Status = r.answer
	if d.Status == 0 {
		d.Status = status
	}
	if r.blocked != nil {
		d.Limit = r.blocked.limit.Name
		d.Dimension = r.blocked.dimension
		d.Key = r.blocked.key(r)
	} else if i := r.result.Decider; i >= 0 && i < len(r.limits) {
		d.Limit = r.limits[i].limit.Name
		d.Dimension = r.limits[i].dimension
	}
	r.g.tel.Decision(r.ctx, d)
	r.g.refusals.record(d, r.blocked)
	if r.outcome == telemetry.OutcomeHard {
		r.g.log.Info("request refused", "request_id", r.req.ID, "tenant", c.Tenant, "user", c.User,
			"route", r.req.Route, "model", r.req.Estimate.Model, "status", d.Status, "limit", d.Limit, "dimension", d.Dimension, "policy", d.Policy)
	} else if r.g.log.Enabled(r.ctx, slog.LevelDebug) {
		r.g.log.Debug("request served", "request_id", r.req.ID, "tenant", c.Tenant, "route", r.req.Route, "model", r.req.Estimate.Model,
			"status", d.Status, "outcome", r.outcome, "limit", d.Limit, "policy", d.Policy)
	}
}

func (r *Reservation) entry(status ledger.Status) ledger.Entry {
	decision := "allow"
	if r.decision.Outcome != "" {
		decision = string(r.decision.Outcome)
	}
	c := r.req.Caller
	e := ledger.Entry{
		RequestID: r.req.ID, Tenant: c.Tenant, User: c.User, KeyID: c.KeyID, Plan: entryPlan(c.Plan),
		Route: r.policyRoute(), Upstream: r.req.Upstream, Model: r.req.Estimate.Model, Region: r.st.cfg.Region,
		Decision: decision, Policy: r.decision.Policy, Friction: r.friction,
		Status: status, Requests: r.req.Requests,
		Estimated: r.req.Estimate.Usage, EstimatedCost: r.req.Estimate.Cost,
		CreatedAt: r.start,
	}
	r.keyedBy(&e)
	e.KeyDesc = r.descKeys()
	return e
}

// entryPlan is the plan an entry records: plan, or nothing for one that
// the ledger would refuse to store (longer than a key field, not UTF-8,
// or holding a NUL: the configuration and the control plane refuse such a
// plan, but a control plane's database written before holds it still, and
// any Directory may answer one). An entry of no plan counts on every
// limit of some plans, so the entry is kept and its spend counted
// everywhere, never nowhere.
func entryPlan(plan string) string {
	if !ledger.ValidKeyText(plan) {
		return ""
	}
	return plan
}

// dimension is the request's value of dimension d.
func (r *Reservation) dimension(d string) string {
	switch d {
	case "tenant":
		return r.req.Caller.Tenant
	case "user":
		return r.req.Caller.User
	case "api_key":
		return r.req.Caller.KeyID
	case "ip":
		return ipKey(r.req.IP)
	case "model":
		return r.model
	case "route":
		return r.req.Route
	case "upstream":
		return r.req.Upstream
	case "region":
		if r.region != "" {
			return r.region
		}
		return r.st.cfg.Region
	}
	if name, ok := strings.CutPrefix(d, config.AttributePrefix); ok {
		return r.req.Attributes[name]
	}
	return ""
}

// carryOver charges or refunds, on the active configuration's budget
// counters, the difference between r's estimate and what it ended at (c;
// cancelled: nothing), when r was decided on a state that a reload moving
// budgets replaced and the new counters were restored from the ledger
// while r's entry there held its estimate (the restore waited for it: see
// drain). r's own settlement goes to the old counters only. It runs once,
// before r's entry is billed: a restore still to come reads the entry
// billed, and counts what r cost.
func (r *Reservation) carryOver(ctx context.Context, c Charge, cancelled bool) {
	if r.carried || !r.recorded || r.billed || r.degraded {
		return
	}
	r.carried = true
	moved, restored := r.g.replaced(r.st), r.g.restores.Load() != r.restoresAtRecord
	if !moved && !restored {
		return // the common case: nothing to carry, nothing allocated
	}
	type counter struct {
		name, key string
		algo      weighted.Algorithm
		period    time.Duration
		calendar  weighted.Calendar
	}
	counterOf := func(it weighted.Item) counter {
		return counter{it.Limit.Name, it.Key, it.Limit.Algorithm, it.Limit.Period, it.Limit.Calendar}
	}
	old := make(map[counter]bool, len(r.items))
	for _, it := range r.items {
		old[counterOf(it)] = true
	}
	var items []weighted.Item
	var actual []int64
	add := func(l *compiledLimit, it weighted.Item) {
		if !l.budget || old[counterOf(it)] {
			return // a counter r's own settlement reaches
		}
		old[counterOf(it)] = true
		a := int64(0)
		if !cancelled {
			a = l.costOf(r.req.Requests, c.Usage, c.Cost)
		}
		if a != it.Cost {
			items, actual = append(items, it), append(actual, a)
		}
	}
	// The configuration's budgets, when a reload moved them.
	if st := r.g.state.Load(); moved {
		if _, ok := st.restored.Load(r.req.Caller.Tenant); ok || st.allRestored.Load() {
			n := &Reservation{g: r.g, st: st, req: r.req, ctx: ctx, start: r.start, model: r.model}
			n.req.Caller = r.g.rebind(r.req.Caller)
			n.req.Extra, n.req.Caller.levels = nil, [4]*Level{}
			n.collect()
			for i, l := range n.limits {
				add(l, n.items[i])
			}
		}
	}
	// The control plane's budgets of the entities r's level budgets
	// belong to, when a change gave them counters restored since r's
	// record (a restore ran: see Record).
	if restored {
		entities := map[string]bool{}
		for _, l := range r.limits {
			if l.level != nil && l.budget {
				entities[l.level.Entity] = true
			}
		}
		if d := r.g.dir.dir.Load(); d != nil && len(entities) > 0 {
			for _, lb := range (*d).Budgets(r.req.Caller.Tenant) {
				ll := lb.Limit
				if !entities[ll.Entity] || ll.unrestored.Load() {
					continue // another entity's; or its restore is to come, and reads r billed
				}
				l := ll.at(r.start).cl
				add(l, weighted.Item{Limit: l.limit, Key: l.fixedKey, Cost: l.costOf(r.req.Requests, r.req.Estimate.Usage, r.req.Estimate.Cost)})
			}
		}
	}
	if len(items) == 0 {
		return
	}
	// A settlement of an id the store never debited charges what it
	// costs beyond its estimate, and refunds nothing (a window refunds
	// only into the window debited). A refund first debits one unit under
	// the id, now, in the windows the restore counted r's estimate in,
	// and settles the estimate and that unit. (A counter without that
	// unit of room keeps the refund until the period ends: a store
	// operation that refunds into the current window would not.)
	id := r.resID + ":moved"
	var refund bool
	for i := range items {
		refund = refund || actual[i] < items[i].Cost
	}
	if refund {
		unit := make([]weighted.Item, len(items))
		for i, it := range items {
			unit[i] = it
			unit[i].Cost = 1
			items[i].Cost++
		}
		if res, err := r.g.store.Debit(ctx, id, unit); err != nil || !res.Allowed {
			r.g.log.Warn("a moved budget's new counters keep the estimate of a request decided on the old ones", "request_id", r.req.ID, "err", err)
			return
		}
	}
	if err := r.g.store.Settle(ctx, id, items, actual); err != nil {
		r.g.log.Warn("limiter settle on a moved budget's new counters failed; the next reconciliation raises them", "request_id", r.req.ID, "err", err)
	}
}

// modelLabel is the gen_ai.request.model value of model's usage: its
// canonical name when the price table knows it, else "unpriced" ("" when
// the request names none). The label's values are then the table's,
// which no tenant adds to: named as sent, a tenant's requests naming 50
// models of its choice filled the label's bound, and every other
// tenant's models showed as "other" (TestMetricsAtkModelLabelsNotFilledByATenant).
func modelLabel(est *costmodel.Estimator, model string) string {
	if model == "" {
		return ""
	}
	if c, ok := est.Priced(model); ok {
		return c
	}
	return "unpriced"
}
