// Package proxy is costgate's data plane: it wires the cost model, the
// policies, the weighted limiter and the ledger around a reverse proxy.
//
// Every request on a priced route goes through the same stages, in order:
//
//  1. identify: the API key (Bearer or x-api-key) names the tenant, user
//     and plan; the path names the route and its upstream;
//  2. estimate: costmodel counts the prompt tokens, adds the output tokens
//     the request may produce and prices them;
//  3. debit: every limit and budget that applies is debited by the
//     estimate in one atomic call, all or nothing (weighted);
//  4. decide: only a request every limit admitted reaches the policies (a
//     request a limit or budget denies is answered 429 or 402 at step 3).
//     The Rego policies see the caller, the estimate and each limit's and
//     budget's state as it was before this request's debit (the debit's
//     reply with this request's cost added back), and answer allow, soft
//     (friction) or hard; a hard answer cancels the reservation;
//  5. record: the ledger makes the reservation durable;
//  6. forward: httputil.ReverseProxy sends the request, with friction
//     applied, to the upstream with the upstream's own credential; while
//     it runs, the leases of its concurrency limits are renewed every half
//     Period (see weighted.Store.Renew), so that a long stream keeps its
//     slot;
//  7. settle: the usage the upstream reports is priced; the limiter is
//     charged or refunded the difference and the ledger entry finalized.
//
// The debit comes before the policy so that the policy sees each limit's
// remaining quota without a second round trip to the store.
package proxy
