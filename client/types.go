package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// Cost is what a reservation asks for, in the units costgate's limits and
// budgets count: any subset of them. A zero field is not sent; costgate
// reads an absent count as zero.
type Cost struct {
	// Requests is the number of requests; 0 means costgate's default, 1.
	Requests int64
	// Tokens is input and output tokens together, for a caller that does
	// not split them; InputTokens and OutputTokens split them.
	Tokens       int64
	InputTokens  int64
	OutputTokens int64
	// Units are units of a generic upstream's cost rule (results, credits);
	// with ReserveRequest.Upstream, costgate prices them by that rule.
	Units int64
	// USD is money, in nano-dollars; it is sent as an exact decimal string.
	USD costmodel.NanoUSD
}

// IsZero tells whether c asks for nothing.
func (c Cost) IsZero() bool { return c == Cost{} }

type costWire struct {
	Requests     int64  `json:"requests,omitempty"`
	Tokens       int64  `json:"tokens,omitempty"`
	InputTokens  int64  `json:"input_tokens,omitempty"`
	OutputTokens int64  `json:"output_tokens,omitempty"`
	Units        int64  `json:"units,omitempty"`
	USD          string `json:"usd,omitempty"`
}

// MarshalJSON writes c as the reserve call's "cost" object.
func (c Cost) MarshalJSON() ([]byte, error) {
	return json.Marshal(costWire{
		Requests: c.Requests, Tokens: c.Tokens, InputTokens: c.InputTokens,
		OutputTokens: c.OutputTokens, Units: c.Units, USD: formatUSD(c.USD),
	})
}

// Usage is what a reserved call actually used, as the settle call takes
// it. A zero count is not sent; costgate reads an absent count as zero.
// The reserved request itself is spent and is not part of the usage.
//
// The dollars charged are USD when it is set (or Free), else the counts
// priced by the reservation's generic upstream rule or model, else the
// reservation's estimate.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
	Units        int64
	// USD is money spent, in nano-dollars, for a call priced by the caller;
	// zero means not stated.
	USD costmodel.NanoUSD
	// Free states that the call cost nothing in dollars, whatever its
	// counts would be priced at; USD must then be zero.
	Free bool
}

type usageWire struct {
	InputTokens  int64  `json:"input_tokens,omitempty"`
	OutputTokens int64  `json:"output_tokens,omitempty"`
	Units        int64  `json:"units,omitempty"`
	USD          string `json:"usd,omitempty"`
}

// MarshalJSON writes u as the settle call's "usage" object.
func (u Usage) MarshalJSON() ([]byte, error) {
	if u.Free && u.USD != 0 {
		return nil, fmt.Errorf("usage is Free but states USD %v", u.USD)
	}
	w := usageWire{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, Units: u.Units, USD: formatUSD(u.USD)}
	if u.Free {
		w.USD = "0"
	}
	return json.Marshal(w)
}

// formatUSD writes n as an exact decimal dollar amount without trailing
// zeros ("0.0125"); zero is "", which the wire omits.
func formatUSD(n costmodel.NanoUSD) string {
	if n == 0 {
		return ""
	}
	s := strings.TrimPrefix(n.String(), "-")
	s = strings.TrimPrefix(s, "$")
	s = strings.TrimRight(s, "0")
	s = strings.TrimSuffix(s, ".")
	if n < 0 {
		s = "-" + s
	}
	return s
}

// ReserveRequest is one reservation: either a Cost, or an LLM request
// (Kind and Body) that costgate estimates as its proxy would.
type ReserveRequest struct {
	// Cost is what to reserve; the zero Cost is not sent.
	Cost Cost
	// Kind and Body ask costgate to estimate an LLM request instead:
	// Kind is "chat_completions", "completions", "embeddings", "responses"
	// or "anthropic_messages", and Body the request's JSON.
	Kind string
	Body json.RawMessage
	// Upstream names a configured upstream; a generic one prices
	// Cost.Units by its cost rule. Optional.
	Upstream string
	// Model prices tokens. Optional.
	Model string
	// Route is the name policies and the ledger see as the route.
	// Optional; costgate's default is "/v1/costgate/reserve". Limits keyed
	// by route see it only when it is a route costgate serves.
	Route string
	// Attributes are custom attributes (at most 16; names of a-z, 0-9, _
	// and -): limits keyed by attr.NAME and the policies
	// (input.request.attributes) see them. Optional.
	Attributes map[string]string
	// TTL is how long the reservation holds before it expires and is
	// charged its estimate. 0 means costgate's default, 5 minutes; at most
	// an hour.
	TTL time.Duration
}

type reserveWire struct {
	Cost     *Cost           `json:"cost,omitempty"`
	Kind     string          `json:"kind,omitempty"`
	Body     json.RawMessage `json:"body,omitempty"`
	Upstream string          `json:"upstream,omitempty"`
	Model    string          `json:"model,omitempty"`
	Route    string          `json:"route,omitempty"`
	TTL      string          `json:"ttl,omitempty"`

	Attributes map[string]string `json:"attributes,omitempty"`
}

func (r ReserveRequest) wire() reserveWire {
	w := reserveWire{Kind: r.Kind, Body: r.Body, Upstream: r.Upstream, Model: r.Model, Route: r.Route, Attributes: r.Attributes}
	if !r.Cost.IsZero() || r.Kind == "" {
		w.Cost = &r.Cost
	}
	if r.TTL != 0 {
		w.TTL = r.TTL.String()
	}
	return w
}

// Reservation is an admitted reservation: costgate has debited its
// estimate from the tenant's limits and budgets until it is settled,
// released or expires. Its Settle, SettleResponse and Release methods call
// the Client that made it.
type Reservation struct {
	// ID names the reservation in Settle and Release ("rsv_...").
	ID string
	// RequestID is the id of its ledger entry ("req_...").
	RequestID string
	// ExpiresAt is when an unsettled reservation expires.
	ExpiresAt time.Time
	// Estimate is what costgate reserved.
	Estimate Estimate
	// Friction is what costgate's policies ask of the call; nil when none.
	// costgate has waited its Delay before it answered; the cap and the
	// downgrade are the caller's to apply.
	Friction *Friction
	// Degraded tells that costgate's limiter store was out and the
	// reservation was admitted on its fallback budgets.
	Degraded bool
	// RateLimit and RateLimitPolicy are the answer's RateLimit and
	// RateLimit-Policy header fields for the most constraining limit.
	RateLimit       string
	RateLimitPolicy string

	c *Client
}

// Settle settles r; see Client.Settle.
func (r *Reservation) Settle(ctx context.Context, u Usage, opts ...SettleOption) (*Settlement, error) {
	return r.c.Settle(ctx, r.ID, u, opts...)
}

// SettleResponse settles r from the upstream's answer; see
// Client.SettleResponse.
func (r *Reservation) SettleResponse(ctx context.Context, kind string, raw []byte, opts ...SettleOption) (*Settlement, error) {
	return r.c.SettleResponse(ctx, r.ID, kind, raw, opts...)
}

// Release releases r; see Client.Release.
func (r *Reservation) Release(ctx context.Context) error { return r.c.Release(ctx, r.ID) }

// Estimate is what a reservation holds.
type Estimate struct {
	Requests     int64
	InputTokens  int64
	OutputTokens int64
	Units        int64
	Cost         costmodel.NanoUSD
}

// Friction is what costgate's policies ask of an admitted call.
type Friction struct {
	// Delay is the delay costgate waited before it admitted the call.
	Delay time.Duration
	// CapMaxTokens caps an LLM request's max_tokens; 0 means no cap.
	CapMaxTokens int64
	// DowngradeModel is the model to call instead; empty means keep it.
	DowngradeModel string
	// Warning is a message for the caller's user.
	Warning string
}

// Settlement is what a reservation was charged.
type Settlement struct {
	ReservationID string
	RequestID     string
	// Status is "settled", or "failed" for a settlement with Failed.
	Status string
	// Cost is what the ledger charged, in nano-dollars.
	Cost costmodel.NanoUSD
	// AlreadySettled tells that an earlier Settle settled the reservation;
	// the figures are that settlement's.
	AlreadySettled bool
}

// money is a cost as costgate writes it: an exact decimal string and the
// same amount in nano-dollars.
type money struct {
	USD     string `json:"cost_usd"`
	NanoUSD *int64 `json:"cost_nanousd"`
}

func (m money) amount() (costmodel.NanoUSD, error) {
	if m.NanoUSD != nil {
		n := costmodel.NanoUSD(*m.NanoUSD)
		// costmodel.ParseUSD reads amounts up to about 9.2 billion dollars,
		// a little less than NanoUSD holds: an amount it cannot read is
		// not checked.
		if v, err := costmodel.ParseUSD(m.USD); m.USD != "" && err == nil && v != n {
			return 0, fmt.Errorf("cost_usd %q and cost_nanousd %d disagree", m.USD, *m.NanoUSD)
		}
		return n, nil
	}
	if m.USD == "" {
		return 0, nil
	}
	return costmodel.ParseUSD(m.USD)
}

type reservationWire struct {
	ReservationID string    `json:"reservation_id"`
	RequestID     string    `json:"request_id"`
	ExpiresAt     time.Time `json:"expires_at"`
	Estimate      struct {
		Requests     int64 `json:"requests"`
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
		Units        int64 `json:"units"`
		money
	} `json:"estimate"`
	Friction *struct {
		DelayMS        int64  `json:"delay_ms"`
		CapMaxTokens   int64  `json:"cap_max_tokens"`
		DowngradeModel string `json:"downgrade_model"`
		Warning        string `json:"warning"`
	} `json:"friction"`
	Degraded bool `json:"degraded"`
}

func (w *reservationWire) reservation() (*Reservation, error) {
	if w.ReservationID == "" {
		return nil, fmt.Errorf("answer has no reservation_id")
	}
	cost, err := w.Estimate.amount()
	if err != nil {
		return nil, fmt.Errorf("estimate: %w", err)
	}
	r := &Reservation{
		ID: w.ReservationID, RequestID: w.RequestID, ExpiresAt: w.ExpiresAt, Degraded: w.Degraded,
		Estimate: Estimate{
			Requests: w.Estimate.Requests, InputTokens: w.Estimate.InputTokens,
			OutputTokens: w.Estimate.OutputTokens, Units: w.Estimate.Units, Cost: cost,
		},
	}
	if f := w.Friction; f != nil {
		r.Friction = &Friction{
			Delay:        time.Duration(max(f.DelayMS, 0)) * time.Millisecond,
			CapMaxTokens: f.CapMaxTokens, DowngradeModel: f.DowngradeModel, Warning: f.Warning,
		}
	}
	return r, nil
}

type settlementWire struct {
	ReservationID  string `json:"reservation_id"`
	RequestID      string `json:"request_id"`
	Status         string `json:"status"`
	AlreadySettled bool   `json:"already_settled"`
	money
}

func (w *settlementWire) settlement() (*Settlement, error) {
	cost, err := w.amount()
	if err != nil {
		return nil, err
	}
	return &Settlement{
		ReservationID: w.ReservationID, RequestID: w.RequestID, Status: w.Status,
		Cost: cost, AlreadySettled: w.AlreadySettled,
	}, nil
}

// retryAfter reads a Retry-After header: delay-seconds, or an HTTP date
// relative to now. 0 when absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int64(365*24*3600))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
