package client

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/sendonce"
)

// DefaultMaxBody is a Transport's default bound on the request and
// response bodies it reads: 8 MiB.
const DefaultMaxBody = 8 << 20

// settleTimeout bounds a Transport's settle or release call, which runs
// even when the caller's context has ended: the metered call was made.
const settleTimeout = 10 * time.Second

// Transport is an http.RoundTripper that gates each call to a metered API
// with costgate: it reserves the units Rule reads from the outgoing request
// before the call, and settles the units Rule reads from the response
// after it, so that the calls draw on the tenant's limits and budgets as
// the proxy's /u/{upstream}/ routes do.
//
// A refused reservation is returned as the *RefusedError (http.Client
// wraps it in a *url.Error; errors.As finds it) and the API is not called.
// A call that fails before its request was written whole releases its
// reservation; one that fails after (the connection cut, the caller's
// context ended while the API worked) is settled at the estimate, as the
// API may have served and billed it (known from httptrace's WroteRequest,
// which http.Transport reports; a Base that does not report it releases).
// An
// answer with status 400 or more is settled as failed and free, as the
// proxy charges nothing for a generic upstream's errors (the request
// itself counts against request limits all the same). Otherwise the units
// the response reports where Rule.Actual says (header or JSON body) are
// settled; an answer that reports none is settled as below, at the most
// Rule.Actual lets it report, or the estimate without a Rule.Actual
// (an API may leave its report out of an answer asked for in another
// format, or with some fields only). (A friction delay that
// costgate's policies ask for, costgate waits before it admits the call.)
//
// To read the units, RoundTrip reads the response body before it returns:
// up to MaxBody bytes, which the caller then reads from memory. A longer
// body, one cut before its end (the connection dropped, the caller's
// context ended), or a stream of server-sent events, is settled by its
// header, else
// at the most Rule.Actual lets the answer report (its Max; the estimate
// when it has none), as the proxy charges such an answer, and a longer
// body is passed on unread beyond the bound. An answer a Base hands on in
// a content coding (it asked for one itself) is read gunzipped, for gzip,
// and otherwise charged as one whose report was not read; the caller
// gets it as it came. The request body is read only when Rule reads it (a
// JSON source, a complexity score, or a form body, whose field named as
// the query parameter the rule reads as the proxy does), likewise
// bounded; such a body in a content coding (Content-Encoding other than
// identity) is refused before reserving, as the proxy refuses it: the
// rule would price the coded bytes, and an API that decodes the body
// would serve what the decoded body asks for.
//
// A Base outside the RoundTripper contract is read as http.Client reads
// it: a nil Body as an empty one (one whose Content-Length promised bytes
// as an answer cut before its first), and neither a response nor an
// error as a call that failed once its request was written.
//
// RoundTrip does not modify the request. A Transport is safe for
// concurrent use; its fields must not change once it is in use.
type Transport struct {
	// Base sends the calls; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Client reserves and settles, with the tenant's key. Required.
	Client *Client
	// Rule reads the units from the request (Units, Complexity) and from
	// the response (Actual), as a generic upstream's cost rule in
	// costgate's configuration does (the same YAML shape). With Upstream
	// set, costgate prices the units by that upstream's configured rule
	// and this Rule's prices may be zero; without it, the cost is priced
	// here by this Rule and reserved and settled in dollars.
	Rule costmodel.Rule
	// Upstream names the generic upstream in costgate's configuration
	// whose cost rule prices the units. Optional.
	Upstream string
	// Route is the name costgate's policies see as request.route.
	// Optional.
	Route string
	// TTL is each reservation's TTL; 0 means costgate's default.
	TTL time.Duration
	// MaxBody bounds the request and response bodies read, in bytes;
	// 0 means DefaultMaxBody.
	MaxBody int64
	// Settled, when set, is called once for each call that was reserved,
	// after its reservation was settled (s) or released (s nil), with the
	// error of that settle or release call. An unsettled reservation
	// expires and is charged its estimate. It runs on the caller's
	// goroutine before RoundTrip returns.
	Settled func(req *http.Request, s *Settlement, err error)
}

var _ http.RoundTripper = (*Transport)(nil)

// RoundTrip reserves, sends req with Base, and settles.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	rule, err := t.rule()
	if err != nil {
		closeBody(req)
		return nil, err
	}
	out := req.Clone(ctx)
	if rule.Actual != nil && rule.Actual.JSON != "" {
		// The answer is metered: let Base ask for gzip itself and hand it
		// on decoded, as the proxy does. An encoding the caller asks for
		// would reach the rule still encoded, and settle the estimate.
		out.Header.Del("Accept-Encoding")
	}
	header, err := pricedHeader(req.Header)
	if err != nil {
		closeBody(req)
		return nil, fmt.Errorf("client: transport: %w", err)
	}
	var body []byte
	if needsBody(rule, header) && req.Body != nil && req.Body != http.NoBody {
		if coding := codedBody(req.Header); coding != "" {
			// An API that decodes request bodies serves what the decoded
			// body asks for, which the rule cannot read in the coded
			// bytes: the proxy refuses such a body, and so does this.
			req.Body.Close()
			return nil, fmt.Errorf("client: transport: the request body is in a content coding (%s) and its rule reads the body, which it reads only uncompressed: send it without Content-Encoding", coding)
		}
		body, err = readBounded(req.Body, t.maxBody())
		req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("client: transport: request body: %w", err)
		}
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
	}
	est, err := rule.Estimate(costmodel.GenericRequest{
		Method: req.Method, Path: req.URL.Path, Query: pricedQuery(req.URL), Header: header, Body: body,
	})
	if err != nil {
		closeBody(out)
		return nil, fmt.Errorf("client: transport: %w", err)
	}
	cost := Cost{Requests: 1, Units: est.Usage.Units}
	if t.Upstream == "" {
		cost.USD = est.Cost
	}
	res, err := t.Client.Reserve(ctx, ReserveRequest{Cost: cost, Upstream: t.Upstream, Route: t.Route, TTL: t.TTL})
	if err != nil {
		closeBody(out)
		return nil, err
	}
	sendonce.Prepare(out) // one request the upstream bills, one charge (TestResendAtk*)
	// Whether the request reached the API: one written whole may have
	// been served (and billed) even when its answer never comes back.
	var wrote atomic.Bool
	out = out.WithContext(httptrace.WithClientTrace(out.Context(), &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				wrote.Store(true)
			}
		},
	}))
	resp, err := t.base().RoundTrip(out)
	if err == nil && resp == nil {
		// Outside the RoundTripper contract, as http.Client answers it:
		// a call that may have been served, with no answer.
		err = fmt.Errorf("client: transport: %T returned a nil *Response with a nil error", t.base())
	}
	if err != nil {
		if wrote.Load() {
			// No answer to a request the API has: it is charged as the
			// proxy charges a generic upstream's request that got no
			// answer in time, the most the rule lets the answer report
			// (its actual's max), else what was reserved for it.
			t.end(ctx, req, res, t.usage(rule, rule.Unreported(est.Usage.Units), nil, nil), nil)
		} else {
			t.release(ctx, req, res)
		}
		return nil, err
	}
	return t.settle(ctx, req, res, rule, est.Usage.Units, resp)
}

// settle reads resp's body up to the bound, settles what the response
// reports, and returns resp with a body that reads what was read first.
func (t *Transport) settle(ctx context.Context, req *http.Request, res *Reservation, rule costmodel.Rule, estimated int64, resp *http.Response) (*http.Response, error) {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The body is the upgraded connection: it has no end to read to,
		// and the caller needs it as it is. Its header may state units.
		t.end(ctx, req, res, t.usage(rule, estimated, resp.Header, nil), nil)
		return resp, nil
	}
	if resp.Body == nil {
		// Outside the contract too: http.Client reads it as an empty
		// body, unless its length promised bytes, which never came.
		resp.Body = http.NoBody
		if resp.ContentLength > 0 && req.Method != http.MethodHead {
			resp.Body = missingBody{}
		}
	}
	limit := t.maxBody()
	buf, readErr := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	whole := readErr == nil && int64(len(buf)) <= limit

	var u Usage
	var opts []SettleOption
	if resp.StatusCode >= 400 {
		u.Free = true // as the proxy charges nothing for a generic upstream's error
		opts = append(opts, Failed())
	} else {
		var read []byte // a cut body says nothing; the header still may
		if whole {
			read, _ = decodeAnswer(resp.Header, buf, limit) // nil when it cannot be decoded
		}
		u = t.usage(rule, estimated, resp.Header, read)
	}
	t.end(ctx, req, res, u, opts)

	switch {
	case readErr != nil:
		resp.Body.Close()
		return nil, fmt.Errorf("client: transport: read response: %w", readErr)
	case whole:
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(buf))
	default:
		resp.Body = &joinedBody{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), rest: resp.Body}
	}
	return resp, nil
}

// maxUnits and maxCharge bound what a settlement states: the ledger
// charges one entry at most 2^53 nano-dollars, and costgate refuses a
// dollar amount it cannot represent, which would leave the reservation
// to expire at its estimate.
const (
	maxUnits  = 1 << 53
	maxCharge = costmodel.NanoUSD(1 << 53)
)

// usage is what a successful answer is charged by rule (see
// costmodel.Rule.Charge), as the proxy charges it; body is nil for an
// answer not kept whole, or not decoded.
func (t *Transport) usage(rule costmodel.Rule, estimated int64, h http.Header, body []byte) Usage {
	units, _, _ := rule.Charge(h, body, estimated)
	u := Usage{Units: min(units, maxUnits)}
	if t.Upstream == "" {
		// Priced here: a call that cost nothing says so (Free), as a
		// zero USD means "not stated" and would leave the estimate
		// charged.
		u.USD = min(rule.Price().Cost(costmodel.Usage{Units: u.Units}), maxCharge)
		u.Free = u.USD == 0
	}
	return u
}

// decodeAnswer returns body decoded from the content coding its header
// h declares, when a Base handed it on coded (it asked for the coding
// itself): gunzipped, up to limit bytes, for gzip; ok is false for an
// answer the Transport cannot decode (another coding, several, a broken
// or longer gzip stream), whose report is then not read.
func decodeAnswer(h http.Header, body []byte, limit int64) (decoded []byte, ok bool) {
	codings := costmodel.ContentCodings(h)
	switch {
	case len(codings) == 0:
		return body, true
	case len(codings) > 1 || !strings.EqualFold(codings[0], "gzip") && !strings.EqualFold(codings[0], "x-gzip"):
		return nil, false
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	out, err := readBounded(zr, limit)
	if err != nil {
		return nil, false
	}
	return out, true
}

// end settles res with u and reports it to the Settled hook.
func (t *Transport) end(ctx context.Context, req *http.Request, res *Reservation, u Usage, opts []SettleOption) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	var s *Settlement
	err := retryEnd(sctx, func(ctx context.Context) (err error) {
		s, err = t.Client.Settle(ctx, res.ID, u, opts...)
		return err
	})
	cancel()
	if t.Settled != nil {
		t.Settled(req, s, err)
	}
}

// release releases res after a call that never reached the API.
func (t *Transport) release(ctx context.Context, req *http.Request, res *Reservation) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	err := retryEnd(rctx, func(ctx context.Context) error { return t.Client.Release(ctx, res.ID) })
	cancel()
	if t.Settled != nil {
		t.Settled(req, nil, err)
	}
}

// endAttempts bounds the attempts at one settle or release.
const endAttempts = 3

// retryEnd calls end, a settle or a release, again after a failure that
// may pass (a network error, an answer cut short, costgate unavailable),
// up to endAttempts times while ctx lasts. Both calls are idempotent, and
// one lost would leave the reservation held until it expires and is
// charged its estimate, whatever the call used.
func retryEnd(ctx context.Context, end func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := end(ctx)
		if err == nil || attempt == endAttempts || !transient(err) {
			return err
		}
		wait := time.Duration(attempt) * 100 * time.Millisecond
		var re *RefusedError
		if errors.As(err, &re) {
			wait = max(wait, re.RetryAfter)
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
			return err // no time left for the wait asked
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// transient tells whether err, from a settle or a release call, may pass:
// not an answer of costgate's that decides (a 4xx other than 408 and
// 429, which ask to try again: a gateway in front of costgate sends them),
// nor a body that could not be written.
func transient(err error) bool {
	var ae *APIError
	var re *RefusedError
	var me *json.MarshalerError
	switch {
	case errors.As(err, &ae):
		return ae.Status >= 500 || ae.Status == http.StatusRequestTimeout || ae.Status == http.StatusTooManyRequests
	case errors.As(err, &re):
		return re.Status == http.StatusTooManyRequests
	case errors.As(err, &me):
		return false
	}
	return true
}

// rule is the Rule to price with, checked.
func (t *Transport) rule() (costmodel.Rule, error) {
	if t.Client == nil {
		return costmodel.Rule{}, errors.New("client: transport: no Client")
	}
	r := t.Rule
	if t.Upstream != "" && r.PerCall == 0 && r.PerUnit == 0 {
		r.Free = true // costgate prices the units
	}
	if err := r.Validate(); err != nil {
		return costmodel.Rule{}, fmt.Errorf("client: transport: %w", err)
	}
	return r, nil
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func (t *Transport) maxBody() int64 {
	if t.MaxBody > 0 {
		return t.MaxBody
	}
	return DefaultMaxBody
}

// pricedHeader is h as the rule reads it: its Content-Type under the
// canonical name when the caller's map holds it under another case
// (req.Header["content-type"], which Go sends as it is and servers read
// in any case). Two different Content-Types are an error: which one the
// API reads is its choice.
func pricedHeader(h http.Header) (http.Header, error) {
	var key string
	var vs []string
	for k, v := range h {
		if !strings.EqualFold(k, "Content-Type") || len(v) == 0 {
			continue
		}
		for _, x := range v {
			if len(vs) > 0 && x != vs[0] {
				return nil, fmt.Errorf("the request states two Content-Types, %q and %q", vs[0], x)
			}
			vs = append(vs, x)
		}
		key = k
	}
	if vs == nil || key == "Content-Type" {
		return h, nil
	}
	h = h.Clone()
	h["Content-Type"] = vs[:1]
	return h, nil
}

// pricedQuery is u's query as the rule prices it: as Go reads it, which
// drops a pair holding ';', or, when the query holds one, as it reads
// split at '&' and ';' both, as APIs that take ';' for a separator do
// (Rack before 3, Python's parse_qs before 3.9.2, Perl's CGI): that
// reading holds every pair of the other and the ones it dropped.
func pricedQuery(u *url.URL) url.Values {
	if !strings.Contains(u.RawQuery, ";") {
		return u.Query()
	}
	q := url.Values{}
	for k, v := range costmodel.FormPairs(u.RawQuery) {
		q.Add(k, v)
	}
	return q
}

// needsBody tells whether r reads the body of a request with header h: a
// JSON field or a complexity score, or a form field named as its query
// parameter in a form body (costmodel reads one there, as frameworks that
// merge the query and the form do).
func needsBody(r costmodel.Rule, h http.Header) bool {
	switch {
	case r.Complexity != nil || r.Units != nil && r.Units.JSON != "":
		return true
	case r.Units != nil && r.Units.Query != "":
		mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
		mt = strings.TrimSpace(mt)
		return strings.EqualFold(mt, "application/x-www-form-urlencoded") || strings.EqualFold(mt, "multipart/form-data")
	}
	return false
}

// codedBody returns the first content coding other than identity that h
// declares the body in (costmodel.ContentCodings), or "" for none.
func codedBody(h http.Header) string {
	if cs := costmodel.ContentCodings(h); len(cs) > 0 {
		return cs[0]
	}
	return ""
}

// readBounded reads all of r, failing when it holds more than limit bytes.
func readBounded(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("over %d bytes", limit)
	}
	return b, nil
}

func closeBody(r *http.Request) {
	if r.Body != nil {
		r.Body.Close()
	}
}

// joinedBody reads the buffered start of a body, then the rest; Close
// closes the rest.
type joinedBody struct {
	io.Reader
	rest io.Closer
}

func (b *joinedBody) Close() error { return b.rest.Close() }

// missingBody is the body of an answer a Base gave none whose length
// promised one: it ends before its first byte.
type missingBody struct{}

func (missingBody) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
func (missingBody) Close() error             { return nil }
