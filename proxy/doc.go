// Package proxy is costgate's HTTP front door: the OpenAI- and
// Anthropic-compatible routes, the generic /u/{upstream}/... routes, the
// reserve/settle API and the tenant's usage view, on the gate (package
// gate), which takes every decision.
//
// A proxied request goes through these stages:
//
//  1. identify (gate): the API key (Bearer or x-api-key) names the tenant,
//     user and plan; the path names the route and its upstream;
//  2. estimate: costmodel counts the prompt tokens, adds the output tokens
//     the request may produce and prices them; a generic upstream's cost
//     rule prices the rest;
//  3. debit and decide (gate.Reserve): every limit and budget that applies
//     is debited by the estimate in one atomic call, all or nothing; only
//     a request every limit admitted reaches the Rego policies, which
//     answer allow, soft (friction, applied here to the body) or hard;
//  4. record (gate.Reservation.Record): the ledger makes the reservation
//     durable;
//  5. forward: httputil.ReverseProxy sends the request to the upstream
//     with the upstream's own credential, and the answer is metered as it
//     passes (streams included);
//  6. settle (gate.Reservation.Bill and Settle): the usage the upstream
//     reports is priced; the ledger entry is finalized as soon as the
//     answer says what it cost, and the limits are charged or refunded
//     the difference.
//
// The front door writes every answer; the gate returns decisions as
// values (gate.Decision), which writeDecision turns into the OpenAI- or
// Anthropic-shaped error, Retry-After and the RateLimit fields.
package proxy
