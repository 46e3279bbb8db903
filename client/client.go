package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
)

// maxAnswer bounds an answer of costgate's that the client reads; its
// answers are a few hundred bytes.
const maxAnswer = 1 << 20

// Client calls costgate's reserve/settle API with one tenant's key. Its
// zero value is not usable; New makes one. A Client is safe for concurrent
// use.
type Client struct {
	base string // costgate's data plane URL, without a trailing slash
	key  string
	hc   *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its calls with hc instead of
// http.DefaultClient. hc must not itself be gated by a Transport of this
// Client.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// New returns a Client for costgate's data plane at baseURL (for example
// "http://127.0.0.1:8080") that authenticates with the tenant's key.
func New(baseURL, key string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), key: key, hc: http.DefaultClient}
	for _, o := range opts {
		o(c)
	}
	return c
}

// abandonGrace bounds how long a reserve call whose caller's context
// ended goes on, to learn the reservation it made and release it.
const abandonGrace = 10 * time.Second

// Reserve asks costgate to admit req's cost and hold it. A refusal is a
// *RefusedError (errors.Is ErrRateLimited, ErrBudgetExceeded or
// ErrForbidden); other failures are an *APIError or the transport's error.
//
// When ctx ends before costgate answers, Reserve returns ctx's error at
// once, and the call goes on in the background (for at most 10 s more):
// a reservation costgate made all the same is released, since its id,
// which the caller never saw, is the only way to settle or release it
// before it expires and is charged its estimate.
func (c *Client) Reserve(ctx context.Context, req ReserveRequest) (*Reservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("client: reserve: %w", context.Cause(ctx))
	}
	if ctx.Done() == nil {
		return c.reserve(ctx, req) // a context that never ends
	}
	type result struct {
		r   *Reservation
		err error
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan result, 1)
	go func() {
		r, err := c.reserve(wctx, req)
		done <- result{r, err}
	}()
	select {
	case res := <-done:
		cancel()
		return res.r, res.err
	case <-ctx.Done():
	}
	// The caller is gone: finish the call, and release what it reserved.
	stop := time.AfterFunc(abandonGrace, cancel)
	go func() {
		defer cancel()
		defer stop.Stop()
		if res := <-done; res.r != nil {
			res.r.Release(wctx)
		}
	}()
	return nil, fmt.Errorf("client: reserve: %w", context.Cause(ctx))
}

// reserve is Reserve's call to costgate, made with ctx.
func (c *Client) reserve(ctx context.Context, req ReserveRequest) (*Reservation, error) {
	var w reservationWire
	h, err := c.call(ctx, "reserve", "/v1/costgate/reserve", req.wire(), &w)
	if err == nil {
		var r *Reservation
		if r, err = w.reservation(); err == nil {
			r.RateLimit, r.RateLimitPolicy = h.Get("RateLimit"), h.Get("RateLimit-Policy")
			r.c = c
			return r, nil
		}
		err = fmt.Errorf("client: reserve: %w", err)
	}
	if w.ReservationID != "" {
		// costgate made a reservation whose answer cannot be used: the
		// call will not be made, and only its id can end it before it
		// expires and is charged its estimate.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonGrace)
		c.Release(rctx, w.ReservationID)
		cancel()
	}
	return nil, err
}

// SettleOption qualifies a settlement.
type SettleOption func(*settleWire)

// Failed marks the call as failed (the upstream answered an error): the
// settlement charges what the usage says and the ledger entry is marked
// failed.
func Failed() SettleOption { return func(w *settleWire) { w.Status = "failed" } }

// ServedModel names the model the upstream says it served, which prices
// the usage's tokens.
func ServedModel(model string) SettleOption { return func(w *settleWire) { w.Model = model } }

type settleWire struct {
	ReservationID string          `json:"reservation_id"`
	Usage         *Usage          `json:"usage,omitempty"`
	Response      json.RawMessage `json:"response,omitempty"`
	Kind          string          `json:"kind,omitempty"`
	Status        string          `json:"status,omitempty"`
	Model         string          `json:"model,omitempty"`
}

// Settle charges the reservation id with what the call used and returns
// the rest of the reservation to the limits and budgets. Settling again is
// harmless: the answer repeats the first settlement with AlreadySettled
// set. A reservation that expired is ErrReservationExpired, one released
// ErrReservationReleased, and an id that is not this tenant's
// ErrUnknownReservation.
func (c *Client) Settle(ctx context.Context, id string, u Usage, opts ...SettleOption) (*Settlement, error) {
	return c.settle(ctx, settleWire{ReservationID: id, Usage: &u}, opts)
}

// SettleResponse settles the reservation id from raw, the upstream's JSON
// answer to an LLM request of the given kind ("chat_completions", ...):
// costgate reads its usage report as the proxy does.
func (c *Client) SettleResponse(ctx context.Context, id, kind string, raw []byte, opts ...SettleOption) (*Settlement, error) {
	if !json.Valid(raw) {
		return nil, errors.New("client: settle: the response is not valid JSON")
	}
	return c.settle(ctx, settleWire{ReservationID: id, Response: raw, Kind: kind}, opts)
}

func (c *Client) settle(ctx context.Context, w settleWire, opts []SettleOption) (*Settlement, error) {
	for _, o := range opts {
		o(&w)
	}
	var sw settlementWire
	if _, err := c.call(ctx, "settle", "/v1/costgate/settle", w, &sw); err != nil {
		return nil, err
	}
	s, err := sw.settlement()
	if err != nil {
		return nil, fmt.Errorf("client: settle: %w", err)
	}
	return s, nil
}

// Release returns the whole reservation id to the limits and budgets,
// for a call that was not made. Releasing twice is harmless; releasing a
// settled reservation is ErrReservationSettled.
func (c *Client) Release(ctx context.Context, id string) error {
	var out struct {
		Status string `json:"status"`
	}
	_, err := c.call(ctx, "release", "/v1/costgate/release", map[string]string{"reservation_id": id}, &out)
	return err
}

// call POSTs in as JSON to path and decodes a 200 answer into out. It
// returns the answer's header.
func (c *Client) call(ctx context.Context, op, path string, in, out any) (http.Header, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("client: %s: %w", op, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("client: %s: %w", op, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: %s: %w", op, err)
	}
	defer resp.Body.Close()
	if err := readAnswer(op, resp, out, time.Now()); err != nil {
		return nil, err
	}
	return resp.Header, nil
}

// readAnswer reads resp, decoding a 200 answer into out; any other answer
// is a *RefusedError or an *APIError.
func readAnswer(op string, resp *http.Response, out any, now time.Time) error {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return fmt.Errorf("client: %s: read answer: %w", op, err)
	}
	if len(raw) > maxAnswer {
		return &APIError{Op: op, Status: resp.StatusCode, Message: fmt.Sprintf("answer over %d bytes", maxAnswer), notJSON: true}
	}
	if resp.StatusCode != http.StatusOK {
		return answerError(op, resp, raw, now)
	}
	// A 200 that is not labelled JSON is still decoded, so that the
	// caller can release a reservation whose answer it refuses.
	if err := json.Unmarshal(raw, out); !isJSON(resp.Header) || err != nil {
		return notJSON(op, resp, raw)
	}
	return nil
}

// answerError turns an answer other than 200 into a *RefusedError or an
// *APIError.
func answerError(op string, resp *http.Response, raw []byte, now time.Time) error {
	var body struct {
		Error *struct {
			Type         string `json:"type"`
			Code         string `json:"code"`
			Message      string `json:"message"`
			Policy       string `json:"policy"`
			RetryAfterMS int64  `json:"retry_after_ms"`
		} `json:"error"`
	}
	if !isJSON(resp.Header) || json.Unmarshal(raw, &body) != nil || body.Error == nil {
		return notJSON(op, resp, raw)
	}
	e := body.Error
	wait := retryAfter(resp.Header.Get("Retry-After"), now)
	if e.RetryAfterMS > 0 {
		wait = time.Duration(min(e.RetryAfterMS, int64(365*24*3600*1000))) * time.Millisecond
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusPaymentRequired, http.StatusForbidden:
		return &RefusedError{
			Status: resp.StatusCode, Type: e.Type, Code: e.Code, Message: e.Message, Policy: e.Policy,
			RetryAfter: wait, RateLimit: resp.Header.Get("RateLimit"), RateLimitPolicy: resp.Header.Get("RateLimit-Policy"),
		}
	}
	ae := &APIError{Op: op, Status: resp.StatusCode, Type: e.Type, Code: e.Code, Message: e.Message}
	if resp.StatusCode == http.StatusServiceUnavailable {
		ae.RetryAfter = wait
	}
	return ae
}

// notJSON describes an answer that is not costgate's JSON.
func notJSON(op string, resp *http.Response, raw []byte) error {
	const show = 120
	snippet := string(raw)
	if len(snippet) > show {
		snippet = snippet[:show] + "..."
	}
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = "none"
	}
	return &APIError{
		Op: op, Status: resp.StatusCode, notJSON: true,
		Message: fmt.Sprintf("Content-Type %s, body %q (is the base URL costgate's data plane?)", ct, snippet),
	}
}

func isJSON(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
