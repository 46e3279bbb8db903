package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/sendonce"
)

// upstream is one configured dependency and the reverse proxy that reaches
// it.
type upstream struct {
	name       string
	kind       string
	target     *url.URL
	credential string
	authHeader string   // generic: the credential's header, as is
	authQuery  string   // generic: the credential's query parameter
	methods    []string // generic: the methods forwarded; others are 405
	timeout    time.Duration
	rp         *httputil.ReverseProxy

	cost  *costmodel.Rule   // generic: the default rule
	paths []config.PathCost // generic: per-prefix rules, longest prefix first
}

// rule returns the cost rule of a generic upstream for a path: the part
// after /u/NAME as genericPath reads it, which is also what is forwarded.
func (u *upstream) rule(path string) *costmodel.Rule {
	if pc := u.pathCost(path); pc != nil {
		return &pc.Cost
	}
	return u.cost
}

// pathCost returns the longest of u's path prefixes that path begins
// with, in any case (hasPrefixFold), or nil: ASP.NET Core and Express
// route a path in any case by default, and run /EXPENSIVE as /expensive.
func (u *upstream) pathCost(path string) *config.PathCost {
	for i := range u.paths {
		if hasPrefixFold(path, u.paths[i].Prefix) {
			return &u.paths[i]
		}
	}
	return nil
}

// hasPrefixFold tells whether s begins with prefix in any case, as
// strings.EqualFold compares them (Unicode simple folding: "ſ" is "s",
// as ASP.NET Core's OrdinalIgnoreCase takes it). It does not allocate.
func hasPrefixFold(s, prefix string) bool {
	for prefix != "" {
		if s == "" {
			return false
		}
		_, np := utf8.DecodeRuneInString(prefix)
		_, ns := utf8.DecodeRuneInString(s)
		if !strings.EqualFold(prefix[:np], s[:ns]) {
			return false
		}
		prefix, s = prefix[np:], s[ns:]
	}
	return true
}

// transport is shared by all upstreams: a keep-alive pool sized for many
// concurrent streams to few hosts.
var transport = &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	ForceAttemptHTTP2:     true,
	MaxIdleConns:          1024,
	MaxIdleConnsPerHost:   512,
	IdleConnTimeout:       90 * time.Second,
	TLSHandshakeTimeout:   10 * time.Second,
	ExpectContinueTimeout: time.Second,
}

// newUpstream makes the reverse proxy to base, the upstream's URL (its
// own, or its simulator's).
func newUpstream(cfg config.UpstreamConfig, base string) (*upstream, error) {
	target, err := url.Parse(strings.TrimSuffix(base, "/"))
	if err != nil {
		return nil, fmt.Errorf("proxy: upstream %s: base_url: %w", cfg.Name, config.RedactErr(err))
	}
	u := &upstream{name: cfg.Name, kind: cfg.Kind, target: target, credential: cfg.Credential(), timeout: cfg.Timeout,
		authHeader: cfg.AuthHeader, authQuery: cfg.AuthQuery, cost: cfg.Cost}
	if cfg.Simulated() {
		u.credential = "" // the simulator is no place for a real key
	}
	if cfg.Kind == "generic" {
		u.methods = slices.Clone(cfg.Methods)
		u.paths = slices.Clone(cfg.Paths)
		slices.SortStableFunc(u.paths, func(a, b config.PathCost) int { return len(b.Prefix) - len(a.Prefix) })
	}
	u.rp = &httputil.ReverseProxy{
		Rewrite:    u.rewrite,
		Transport:  transport,
		BufferPool: bufferPool{},
		// ReverseProxy flushes text/event-stream and bodies of unknown
		// length after every write by itself; other bodies go out when
		// the copy ends. (-1 here would start a flush timer per response.)
		FlushInterval:  0,
		ModifyResponse: modifyResponse,
		ErrorHandler:   errorHandler,
	}
	return u, nil
}

// rewrite points the request at the upstream, drops the client's
// credential and injects the upstream's.
func (u *upstream) rewrite(pr *httputil.ProxyRequest) {
	out := pr.Out
	out.URL.Scheme = u.target.Scheme
	out.URL.Host = u.target.Host
	x := exchangeFrom(pr.In.Context())
	switch {
	case u.kind != "generic":
		out.URL.Path = u.target.Path + pr.In.URL.Path
	case x != nil:
		// The path price rules saw (see genericPath), never the raw one.
		out.URL.Path = u.forwardPath(x.subpath)
	default:
		out.URL.Path = u.target.Path + "/"
	}
	out.URL.RawPath = ""
	out.Host = u.target.Host
	// The answer is metered as it passes: the transport asks for gzip
	// itself and hands it on decoded. A client's Accept-Encoding would
	// have the upstream compress what costgate reads for its usage.
	out.Header.Del("Accept-Encoding")
	out.Header.Del("Authorization")
	out.Header.Del("X-Api-Key")
	out.Header.Del("X-Request-Id")
	// The organization and project costgate's credential acts as (and is
	// billed under) are costgate's to choose, not the tenant's: in every
	// spelling a server may read as theirs (openai_organization, which Go
	// keeps apart from the canonical OpenAI-Organization). A method or
	// path override would have an OpenAI-compatible server that obeys it
	// run another operation than the one priced (a generic upstream's
	// request that carries one was refused: upstream.admit).
	for name := range out.Header {
		if costmodel.HeaderIs(name, "openai-organization") || costmodel.HeaderIs(name, "openai-project") ||
			isMethodOverride(name) || isPathOverride(name) {
			delete(out.Header, name)
		}
	}
	// The client's trailers would reach the upstream after a body that
	// costgate has read and priced, unchecked (a trailer named X-Api-Key).
	out.Trailer = nil
	// An upgrade (a WebSocket) would make the exchange a tunnel whose
	// frames costgate never reads, under its credential: the upstream is
	// asked for a plain answer.
	out.Header.Del("Upgrade")
	out.Header.Del("Connection")
	if u.authHeader != "" {
		out.Header.Del(u.authHeader)
	}
	if u.authQuery != "" {
		q := out.URL.Query()
		q.Del(u.authQuery)
		if u.credential != "" {
			q.Set(u.authQuery, u.credential)
		}
		out.URL.RawQuery = q.Encode()
	}
	if u.credential != "" {
		switch {
		case u.authQuery != "":
		case u.authHeader != "":
			out.Header.Set(u.authHeader, u.credential)
		case u.kind == "anthropic":
			out.Header.Set("X-Api-Key", u.credential)
		default:
			out.Header.Set("Authorization", "Bearer "+u.credential)
		}
	}
	if x != nil {
		out.Header.Set("X-Request-Id", x.id)
		// The upstream keeps one answer per idempotency key of costgate's
		// one account: a key the client chose, in any header that names
		// one (isIdempotencyKey), is scoped by its tenant, so that two
		// tenants' keys never meet there. (out.Header is the request's
		// clone: its values are the outgoing request's own.)
		for name, vs := range out.Header {
			if isIdempotencyKey(name) {
				for i, v := range vs {
					sum := sha256.Sum256([]byte(x.caller.Tenant + "\x00" + v))
					vs[i] = hex.EncodeToString(sum[:])
				}
			}
		}
	}
	sendonce.Prepare(out) // one request the upstream bills, one charge (TestResendAtk*)
}

// errUnaskedUpgrade is an upstream's 101 Switching Protocols to a request
// that asked for no upgrade (rewrite drops the client's Upgrade).
var errUnaskedUpgrade = errors.New("proxy: the upstream switched protocols unasked")

// cutAnswer is a plain answer the upstream did not send whole (its
// timeout, a broken connection) before costgate wrote any of it: the
// client is answered an error, and the request is settled from what was
// read.
type cutAnswer struct{ err error }

func (c *cutAnswer) Error() string { return "proxy: the upstream's answer was cut: " + c.err.Error() }
func (c *cutAnswer) Unwrap() error { return c.err }

func modifyResponse(resp *http.Response) error {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// ReverseProxy closes the body (the connection) only when
		// ModifyResponse fails: its own refusal of an unasked upgrade
		// leaves the connection open.
		return errUnaskedUpgrade
	}
	x := exchangeFrom(resp.Request.Context())
	if x == nil {
		return nil
	}
	x.status = resp.StatusCode
	x.respHeader = resp.Header
	x.setRateLimitHeaders(resp.Header)
	// Costgate- fields are costgate's word to the client (its friction,
	// its degraded mode, its warnings): none comes from the upstream.
	for k := range resp.Header {
		if ownField(k) && k != "X-Request-Id" { // X-Request-Id is renamed below
			delete(resp.Header, k)
		}
	}
	// X-Request-Id is costgate's own; the upstream's is kept under
	// another name.
	if up := resp.Header.Get("X-Request-Id"); up != "" {
		resp.Header.Del("X-Request-Id")
		resp.Header.Set("Costgate-Upstream-Request-Id", up)
	}
	resp.Body = x.meter(resp)
	if m := x.body; m.stream == nil {
		if err := m.fill(); err != nil {
			return &cutAnswer{err}
		}
	}
	// Before ReverseProxy announces the trailers: those announced, and a
	// plain answer's, read whole above. A stream's come at Close.
	dropOwnTrailers(resp)
	return nil
}

// dropOwnTrailers deletes the trailers of resp that are costgate's to
// write (see ownField).
func dropOwnTrailers(resp *http.Response) {
	for k := range resp.Trailer {
		if ownField(k) {
			delete(resp.Trailer, k)
		}
	}
}

// ownField tells whether a header field (in canonical form) is
// costgate's to write: X-Request-Id and the Costgate- fields.
func ownField(k string) bool {
	return k == "X-Request-Id" || strings.HasPrefix(k, "Costgate-")
}

// errorHandler answers when the upstream could not be reached, did not
// answer in time, or cut a plain answer short (cutAnswer). An unreachable
// upstream's request is not charged; one that reached it is settled as
// exchange.actualUsage says. The error's detail names the
// upstream's address (and, for a query credential, its URL): it is logged
// with the request id, redacted, and never shown to the client.
func errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeFrom(r.Context())
	var cut *cutAnswer
	if errors.As(err, &cut) {
		// The upstream answered, and the request is settled from what it
		// sent (x.status is its status); the client learns it was cut.
		status, code, msg := http.StatusBadGateway, "upstream_cut", "the upstream's answer broke off"
		if errors.Is(err, context.DeadlineExceeded) {
			status, code, msg = http.StatusGatewayTimeout, "upstream_timeout", "the upstream's answer did not arrive whole in time"
		}
		if r.Context().Err() == nil || errors.Is(err, context.DeadlineExceeded) {
			writeError(w, r.URL.Path, status, apiError{Type: "upstream_error", Code: code,
				Message: msg + "; the request is charged the usage it reports, or its output limit (X-Request-Id names it in costgate's log)"})
		}
		return
	}
	status, code := http.StatusBadGateway, "upstream_unreachable"
	msg := "costgate could not reach the upstream"
	if errors.Is(err, context.DeadlineExceeded) {
		status, code = http.StatusGatewayTimeout, "upstream_timeout"
		msg = "the upstream did not answer in time"
	}
	charged := "; the request is not charged"
	gone := r.Context().Err() != nil && !errors.Is(err, context.DeadlineExceeded)
	if x != nil {
		x.upstreamErr = err
		x.status = status
		if x.unanswered() {
			// The upstream has the request and bills its run (see
			// actualUsage).
			charged = "; the request is charged as an answer whose usage cannot be read (its output limit, or the most its cost rule lets it report), as the upstream bills its run"
			if code == "upstream_unreachable" {
				code, msg = "upstream_cut", "the upstream's connection broke before its answer"
			}
		}
		x.setRateLimitHeaders(w.Header())
		msg += " " + x.upstream.name
		if !gone {
			x.s.log.Warn("upstream request failed", "request_id", x.id, "upstream", x.upstream.name, "status", status, "err", config.RedactErr(err))
		}
	}
	if gone {
		return // the client went away; nobody reads an answer
	}
	writeError(w, r.URL.Path, status, apiError{
		Type: "upstream_error", Code: code,
		Message: msg + charged + " (X-Request-Id names it in costgate's log)",
	})
}

// bufferPool lends the 32 KiB buffers ReverseProxy copies bodies through.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
