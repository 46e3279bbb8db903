// Package client is the Go client for costgate's reserve/settle API, for
// programs that call a metered API themselves rather than through
// costgate's proxy, and still draw on the same limits and budgets.
//
// A Client, made with New for costgate's data plane URL and a tenant's
// key, reserves a call's estimated cost (Reserve), then settles what the
// call actually used (Settle, or SettleResponse with an LLM's raw answer)
// or releases the reservation when the call was not made (Release).
// Settling is idempotent; a reservation not settled within its TTL expires
// and is charged its estimate. Money is costmodel.NanoUSD, an integer
// count of nano-dollars, sent as an exact decimal string.
//
// A refusal is a *RefusedError carrying the limit or budget that refused,
// the policy and RetryAfter; errors.Is matches it against ErrRateLimited,
// ErrBudgetExceeded or ErrForbidden. Any other answer of costgate's that
// is not a success is an *APIError, which errors.Is matches against
// ErrUnknownReservation, ErrReservationExpired, ErrUnavailable and the
// other sentinels; an outage (ErrUnavailable) is never a refusal.
//
// Transport is an http.RoundTripper that does all of this around each
// call of an http.Client: it reads the units from the request and the
// response by a costmodel.Rule, the declarative cost rule of a generic
// upstream in costgate's configuration.
//
// A Client and a Transport are safe for concurrent use.
package client
