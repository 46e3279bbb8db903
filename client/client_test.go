package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
)

// answering is a server that answers every call with status, header and
// body, and keeps the last request body it was sent.
func answering(t *testing.T, status int, header map[string]string, body string) (url string, sent *[]byte) {
	t.Helper()
	var last []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		last, _ = io.ReadAll(r.Body)
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &last
}

var jsonCT = map[string]string{"Content-Type": "application/json"}

// TestAnswers: each answer of costgate's becomes the documented result.
func TestAnswers(t *testing.T) {
	type want struct {
		refused  *client.RefusedError
		api      *client.APIError
		is       []error
		isNot    []error
		contains string
	}
	cases := []struct {
		name   string
		status int
		header map[string]string
		body   string
		want   want
	}{
		{
			name:   "rate limited, retry_after_ms wins over Retry-After",
			status: 429,
			header: map[string]string{"Content-Type": "application/json", "Retry-After": "2", "RateLimit": `"rpm";r=0;t=2`, "RateLimit-Policy": `"rpm";q=3;w=60;qu="requests"`},
			body:   `{"error":{"type":"rate_limit_exceeded","code":"rpm","message":"slow down","policy":"p1","retry_after_ms":1500}}`,
			want: want{
				refused: &client.RefusedError{Status: 429, Type: "rate_limit_exceeded", Code: "rpm", Message: "slow down", Policy: "p1", RetryAfter: 1500 * time.Millisecond, RateLimit: `"rpm";r=0;t=2`, RateLimitPolicy: `"rpm";q=3;w=60;qu="requests"`},
				is:      []error{client.ErrRateLimited}, isNot: []error{client.ErrBudgetExceeded, client.ErrUnavailable},
			},
		},
		{
			name:   "budget exceeded, Retry-After in seconds",
			status: 402,
			header: map[string]string{"Content-Type": "application/json; charset=utf-8", "Retry-After": "3600"},
			body:   `{"error":{"type":"budget_exceeded","code":"daily","message":"spent"}}`,
			want: want{
				refused: &client.RefusedError{Status: 402, Type: "budget_exceeded", Code: "daily", Message: "spent", RetryAfter: time.Hour},
				is:      []error{client.ErrBudgetExceeded}, isNot: []error{client.ErrRateLimited},
			},
		},
		{
			name:   "policy forbids",
			status: 403,
			header: jsonCT,
			body:   `{"error":{"type":"permission_denied","message":"no","policy":"weekend"}}`,
			want: want{
				refused: &client.RefusedError{Status: 403, Type: "permission_denied", Message: "no", Policy: "weekend"},
				is:      []error{client.ErrForbidden},
			},
		},
		{
			name:   "unavailable is an outage, not a refusal",
			status: 503,
			header: map[string]string{"Content-Type": "application/json", "Retry-After": "1"},
			body:   `{"error":{"type":"service_unavailable","message":"limiter store unreachable"}}`,
			want: want{
				api: &client.APIError{Op: "reserve", Status: 503, Type: "service_unavailable", Message: "limiter store unreachable", RetryAfter: time.Second},
				is:  []error{client.ErrUnavailable}, isNot: []error{client.ErrRateLimited, client.ErrBudgetExceeded},
			},
		},
		{
			name:   "bad input",
			status: 400,
			header: jsonCT,
			body:   `{"error":{"type":"invalid_request_error","message":"usage.units: negative"}}`,
			want: want{
				api: &client.APIError{Op: "reserve", Status: 400, Type: "invalid_request_error", Message: "usage.units: negative"},
				is:  []error{client.ErrInvalidRequest},
			},
		},
		{
			name:   "bad key",
			status: 401,
			header: jsonCT,
			body:   `{"error":{"type":"authentication_error","message":"unknown key"}}`,
			want:   want{is: []error{client.ErrUnauthorized}, contains: "401 authentication_error: unknown key"},
		},
		{
			name:   "unknown reservation",
			status: 404,
			header: jsonCT,
			body:   `{"error":{"type":"invalid_request_error","code":"unknown_reservation","message":"no such reservation"}}`,
			want:   want{is: []error{client.ErrUnknownReservation}, isNot: []error{client.ErrNotJSON}},
		},
		{
			name:   "a route costgate does not serve is no unknown reservation",
			status: 404,
			header: jsonCT,
			body:   `{"error":{"type":"invalid_request_error","code":"unknown_route","message":"costgate does not serve POST /v1/costgate/reserve"}}`,
			want:   want{isNot: []error{client.ErrUnknownReservation, client.ErrNotJSON}, contains: "404 invalid_request_error (unknown_route)"},
		},
		{
			name:   "expired",
			status: 410,
			header: jsonCT,
			body:   `{"error":{"type":"invalid_request_error","code":"reservation_expired","message":"expired"}}`,
			want:   want{is: []error{client.ErrReservationExpired}},
		},
		{
			name:   "released",
			status: 409,
			header: jsonCT,
			body:   `{"error":{"type":"invalid_request_error","code":"reservation_released","message":"released"}}`,
			want:   want{is: []error{client.ErrReservationReleased}, isNot: []error{client.ErrReservationSettled}},
		},
		{
			name:   "settled",
			status: 409,
			header: jsonCT,
			body:   `{"error":{"type":"reservation_settled","message":"settled"}}`,
			want:   want{is: []error{client.ErrReservationSettled}, isNot: []error{client.ErrReservationReleased}},
		},
		{
			name:   "an HTML page is not JSON, nor an unknown reservation",
			status: 404,
			header: map[string]string{"Content-Type": "text/html"},
			body:   `<html><body>Not Found</body></html>`,
			want:   want{is: []error{client.ErrNotJSON}, isNot: []error{client.ErrUnknownReservation}, contains: "not JSON: Content-Type text/html"},
		},
		{
			name:   "a 200 that is not JSON",
			status: 200,
			header: map[string]string{"Content-Type": "text/plain"},
			body:   `hello`,
			want:   want{is: []error{client.ErrNotJSON}, contains: `body "hello"`},
		},
		{
			name:   "a 200 with a JSON type and a broken body",
			status: 200,
			header: jsonCT,
			body:   `{"reservation_id":`,
			want:   want{is: []error{client.ErrNotJSON}},
		},
		{
			name:   "a 200 JSON without a reservation id",
			status: 200,
			header: jsonCT,
			body:   `{}`,
			want:   want{contains: "no reservation_id"},
		},
		{
			name:   "an error answer without the error object",
			status: 500,
			header: jsonCT,
			body:   `{"message":"boom"}`,
			want:   want{is: []error{client.ErrNotJSON}},
		},
		{
			name:   "estimate amounts that disagree",
			status: 200,
			header: jsonCT,
			body:   `{"reservation_id":"rsv_1","estimate":{"cost_usd":"0.5","cost_nanousd":1}}`,
			want:   want{contains: "disagree"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := answering(t, tc.status, tc.header, tc.body)
			_, err := client.New(url, "k").Reserve(context.Background(), client.ReserveRequest{Cost: client.Cost{Requests: 1}})
			if err == nil {
				t.Fatal("no error")
			}
			if w := tc.want.refused; w != nil {
				var got *client.RefusedError
				if !errors.As(err, &got) {
					t.Fatalf("error %T %v, want *RefusedError", err, err)
				}
				if *got != *w {
					t.Errorf("got  %+v\nwant %+v", *got, *w)
				}
			}
			if w := tc.want.api; w != nil {
				var got *client.APIError
				if !errors.As(err, &got) {
					t.Fatalf("error %T %v, want *APIError", err, err)
				}
				if got.Status != w.Status || got.Type != w.Type || got.Code != w.Code || got.Message != w.Message || got.RetryAfter != w.RetryAfter || got.Op != w.Op {
					t.Errorf("got  %+v\nwant %+v", *got, *w)
				}
			}
			for _, s := range tc.want.is {
				if !errors.Is(err, s) {
					t.Errorf("%v: errors.Is(%v) is false", err, s)
				}
			}
			for _, s := range tc.want.isNot {
				if errors.Is(err, s) {
					t.Errorf("%v: errors.Is(%v) is true", err, s)
				}
			}
			if !strings.Contains(err.Error(), tc.want.contains) {
				t.Errorf("error %q does not contain %q", err, tc.want.contains)
			}
		})
	}
}

// TestWire: what the client sends, and what it reads from a success.
func TestWire(t *testing.T) {
	ctx := context.Background()
	url, sent := answering(t, 200, map[string]string{"Content-Type": "application/json", "RateLimit": `"b";r=9;t=60`, "RateLimit-Policy": `"b";q=10;w=60;qu="requests"`},
		`{"reservation_id":"rsv_x","request_id":"req_x","expires_at":"2030-01-02T03:04:05Z",`+
			`"estimate":{"requests":1,"input_tokens":12,"output_tokens":34,"units":5,"cost_usd":"0.0125","cost_nanousd":12500000},`+
			`"friction":{"delay_ms":250,"cap_max_tokens":64,"downgrade_model":"gpt-4o-mini","warning":"slow down"},"degraded":true}`)
	c := client.New(url+"/", "cg-key")

	r, err := c.Reserve(ctx, client.ReserveRequest{
		Cost:     client.Cost{Requests: 1, Units: 5, USD: 12_500_000},
		Upstream: "search", Route: "search.web", TTL: 90 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(*sent), `{"cost":{"requests":1,"units":5,"usd":"0.0125"},"upstream":"search","route":"search.web","ttl":"1m30s"}`; got != want {
		t.Errorf("reserve sent\n %s\nwant\n %s", got, want)
	}
	want := client.Reservation{
		ID: "rsv_x", RequestID: "req_x", ExpiresAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), Degraded: true,
		Estimate:  client.Estimate{Requests: 1, InputTokens: 12, OutputTokens: 34, Units: 5, Cost: 12_500_000},
		Friction:  &client.Friction{Delay: 250 * time.Millisecond, CapMaxTokens: 64, DowngradeModel: "gpt-4o-mini", Warning: "slow down"},
		RateLimit: `"b";r=9;t=60`, RateLimitPolicy: `"b";q=10;w=60;qu="requests"`,
	}
	if r.ID != want.ID || r.RequestID != want.RequestID || !r.ExpiresAt.Equal(want.ExpiresAt) || r.Degraded != want.Degraded ||
		r.Estimate != want.Estimate || *r.Friction != *want.Friction || r.RateLimit != want.RateLimit || r.RateLimitPolicy != want.RateLimitPolicy {
		t.Errorf("reservation\n %+v %+v\nwant\n %+v %+v", *r, *r.Friction, want, *want.Friction)
	}

	// An LLM request: kind and body, no cost.
	if _, err := c.Reserve(ctx, client.ReserveRequest{Kind: "chat_completions", Body: json.RawMessage(`{"model":"m"}`), Model: "m"}); err != nil {
		t.Fatal(err)
	}
	if got, want := string(*sent), `{"kind":"chat_completions","body":{"model":"m"},"model":"m"}`; got != want {
		t.Errorf("reserve sent %s, want %s", got, want)
	}

	// Money is a decimal string, never a float; zero counts are left out.
	cases := []struct {
		name string
		call func() error
		want string
	}{
		{"usage", func() error {
			_, err := c.Settle(ctx, "rsv_x", client.Usage{InputTokens: 3, OutputTokens: 4, Units: 2, USD: costmodel.Dollar + 1})
			return err
		}, `{"reservation_id":"rsv_x","usage":{"input_tokens":3,"output_tokens":4,"units":2,"usd":"1.000000001"}}`},
		{"free", func() error {
			_, err := c.Settle(ctx, "rsv_x", client.Usage{Units: 2, Free: true})
			return err
		}, `{"reservation_id":"rsv_x","usage":{"units":2,"usd":"0"}}`},
		{"failed with a model", func() error {
			_, err := c.Settle(ctx, "rsv_x", client.Usage{}, client.Failed(), client.ServedModel("gpt-4o"))
			return err
		}, `{"reservation_id":"rsv_x","usage":{},"status":"failed","model":"gpt-4o"}`},
		{"whole dollars", func() error {
			_, err := r.Settle(ctx, client.Usage{USD: 3 * costmodel.Dollar})
			return err
		}, `{"reservation_id":"rsv_x","usage":{"usd":"3"}}`},
		{"negative usage is sent for costgate to refuse", func() error {
			_, err := c.Settle(ctx, "rsv_x", client.Usage{Units: -1, USD: -5})
			return err
		}, `{"reservation_id":"rsv_x","usage":{"units":-1,"usd":"-0.000000005"}}`},
		{"response", func() error {
			_, err := c.SettleResponse(ctx, "rsv_x", "chat_completions", []byte(`{"usage":{"prompt_tokens":1}}`))
			return err
		}, `{"reservation_id":"rsv_x","response":{"usage":{"prompt_tokens":1}},"kind":"chat_completions"}`},
		{"release", func() error { return r.Release(ctx) }, `{"reservation_id":"rsv_x"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.call() // the answer is a reservation's, not a settlement's: only what was sent counts here
			if got := string(*sent); got != tc.want {
				t.Errorf("sent\n %s\nwant\n %s", got, tc.want)
			}
		})
	}

	if _, err := c.Settle(ctx, "rsv_x", client.Usage{USD: 1, Free: true}); err == nil || !strings.Contains(err.Error(), "Free") {
		t.Errorf("a free usage with dollars: %v", err)
	}
	if _, err := c.SettleResponse(ctx, "rsv_x", "chat_completions", []byte(`{"usage":`)); err == nil {
		t.Error("SettleResponse sent a response that is not JSON")
	}
}

// TestSettleAndRelease: the client's reading of settlements and of the
// reservation states, against the fake.
func TestSettleAndRelease(t *testing.T) {
	ctx := context.Background()
	f := newFakeCostgate(t)
	c := client.New(f.url, "cg-key")
	r, err := c.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Settle(ctx, client.Usage{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (client.Settlement{ReservationID: r.ID, RequestID: r.RequestID, Status: "settled", Cost: 123_000}); *s != want {
		t.Errorf("settlement %+v, want %+v", *s, want)
	}
	if s, err = r.Settle(ctx, client.Usage{}); err != nil || !s.AlreadySettled {
		t.Errorf("second settle: %+v %v", s, err)
	}
	if err := r.Release(ctx); !errors.Is(err, client.ErrReservationSettled) {
		t.Errorf("release after settle: %v", err)
	}
	if err := c.Release(ctx, "rsv_nope"); !errors.Is(err, client.ErrUnknownReservation) {
		t.Errorf("release of an unknown id: %v", err)
	}
	f.mu.Lock()
	auth := f.auth[0]
	f.mu.Unlock()
	if auth != "Bearer cg-key" {
		t.Errorf("Authorization %q", auth)
	}

	// The context bounds a call.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Reserve(cctx, client.ReserveRequest{Cost: client.Cost{Requests: 1}}); !errors.Is(err, context.Canceled) {
		t.Errorf("reserve on a cancelled context: %v", err)
	}
}
