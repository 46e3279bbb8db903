package client

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Sentinels for the outcomes callers branch on; errors.Is matches them
// against a *RefusedError or an *APIError.
var (
	// ErrRateLimited is a refusal by a rate limit (429).
	ErrRateLimited = errors.New("client: rate limited")
	// ErrBudgetExceeded is a refusal by a spent budget (402).
	ErrBudgetExceeded = errors.New("client: budget exceeded")
	// ErrForbidden is a refusal by a policy (403).
	ErrForbidden = errors.New("client: forbidden by policy")

	// ErrUnavailable is an answer 503: costgate could not decide (its
	// limiter store or ledger is out). It is not a refusal.
	ErrUnavailable = errors.New("client: costgate unavailable")
	// ErrUnauthorized is an answer 401: the key is missing or unknown.
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrInvalidRequest is an answer 400: costgate could not read or
	// accept the request (negative or overflowing amounts, unknown fields,
	// a TTL out of range).
	ErrInvalidRequest = errors.New("client: invalid request")
	// ErrUnknownReservation is an answer 404 unknown_reservation: the id
	// names no reservation of this tenant (another tenant's reservations
	// are unknown too).
	ErrUnknownReservation = errors.New("client: unknown reservation")
	// ErrReservationExpired is an answer 410 reservation_expired: the
	// reservation's TTL ran out before it was settled; costgate charged
	// its estimate.
	ErrReservationExpired = errors.New("client: reservation expired")
	// ErrReservationReleased is an answer 409 reservation_released to a
	// settlement of a released reservation.
	ErrReservationReleased = errors.New("client: reservation released")
	// ErrReservationSettled is an answer 409 reservation_settled to a
	// release of a settled reservation.
	ErrReservationSettled = errors.New("client: reservation settled")
	// ErrNotJSON is an answer that is not costgate's JSON: a base URL that
	// names another server, or a proxy's error page in between.
	ErrNotJSON = errors.New("client: answer is not JSON")
)

// RefusedError is costgate's refusal of a reservation: a rate limit (429),
// a budget (402) or a policy (403). It unwraps, through Is, to
// ErrRateLimited, ErrBudgetExceeded or ErrForbidden.
type RefusedError struct {
	// Status is the HTTP status: 429, 402 or 403.
	Status int
	// Type is the error type: "rate_limit_exceeded", "budget_exceeded",
	// "permission_denied".
	Type string
	// Code names the limit or budget that refused; empty for a policy.
	Code    string
	Message string
	// Policy is the id of the policy that decided; empty when a limit
	// refused without one.
	Policy string
	// RetryAfter is when a retry may be admitted: the answer's
	// retry_after_ms, else its Retry-After header; 0 when it gives none.
	RetryAfter time.Duration
	// RateLimit and RateLimitPolicy are the answer's RateLimit and
	// RateLimit-Policy header fields, as sent.
	RateLimit       string
	RateLimitPolicy string
}

func (e *RefusedError) Error() string {
	s := fmt.Sprintf("costgate refused (%d %s", e.Status, e.Type)
	if e.Code != "" {
		s += ", " + e.Code
	}
	if e.Policy != "" {
		s += ", policy " + e.Policy
	}
	s += ")"
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return s
}

// Is reports whether target is the sentinel of e's kind of refusal.
func (e *RefusedError) Is(target error) bool {
	switch target {
	case ErrRateLimited:
		return e.Status == http.StatusTooManyRequests
	case ErrBudgetExceeded:
		return e.Status == http.StatusPaymentRequired
	case ErrForbidden:
		return e.Status == http.StatusForbidden
	}
	return false
}

// APIError is an answer of costgate's that is neither a success nor a
// refusal: bad input, a bad key, a reservation in the wrong state, an
// outage, or an answer that is not costgate's JSON. Is matches it against
// the sentinels of this package (ErrUnknownReservation, ErrUnavailable,
// ErrNotJSON, ...).
type APIError struct {
	// Status is the HTTP status.
	Status int
	// Type and Code are the error's type and code as costgate sent them,
	// for example "invalid_request_error" or "unknown_reservation".
	Type    string
	Code    string
	Message string
	// RetryAfter is the Retry-After of a 503; 0 when the answer gives none.
	RetryAfter time.Duration
	// Op is the call that failed, for example "settle".
	Op string

	notJSON bool
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("client: %s: costgate answered %d", e.Op, e.Status)
	if e.notJSON {
		return s + ", not JSON: " + e.Message
	}
	if e.Type != "" {
		s += " " + e.Type
	}
	if e.Code != "" && e.Code != e.Type {
		s += " (" + e.Code + ")"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is reports whether target is the sentinel of e's status and code.
func (e *APIError) Is(target error) bool {
	if target == ErrNotJSON {
		return e.notJSON
	}
	if e.notJSON && e.Status < 500 {
		// Not costgate's answer: its status says nothing of costgate's
		// state (a 404 from another server is no unknown reservation).
		return false
	}
	switch target {
	case ErrUnavailable:
		return e.Status == http.StatusServiceUnavailable
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized
	case ErrInvalidRequest:
		return e.Status == http.StatusBadRequest
	case ErrUnknownReservation:
		// A 404 of another kind (a route this costgate does not serve)
		// says nothing of the reservation.
		return e.Status == http.StatusNotFound && e.names("unknown_reservation")
	case ErrReservationExpired:
		return e.Status == http.StatusGone && e.names("reservation_expired")
	case ErrReservationReleased:
		return e.Status == http.StatusConflict && e.names("reservation_released")
	case ErrReservationSettled:
		return e.Status == http.StatusConflict && e.names("reservation_settled")
	}
	return false
}

// names tells whether the error's code or type is name.
func (e *APIError) names(name string) bool { return e.Code == name || e.Type == name }
