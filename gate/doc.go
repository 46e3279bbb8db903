// Package gate is costgate's decision pipeline, shared by every front
// door (the HTTP proxy, the reserve/settle API, Envoy's RateLimitService):
// identify the caller, debit every limit and budget that applies in one
// atomic call, ask the policies, record the reservation in the ledger, and
// settle it with what the request really cost.
//
// A front door builds a Request (the caller, the route, the estimate, its
// own extra limits), calls Gate.Reserve, and gets a Decision (a value: an
// admission with its friction, or a refusal with its status, body and
// RateLimit fields) and, when admitted, a Reservation, which it records,
// and later settles or cancels. The gate writes no HTTP and knows nothing
// of forwarding; its tests run without a socket.
//
// The gate keeps the limiter store honest: Redis behind a circuit breaker,
// a local fallback budget per outage (fail-open limits, scaled to this
// replica's share), counters restored from the ledger when the store lost
// them, concurrency leases renewed while held, and budgets reconciled with
// the ledger on a schedule.
package gate
