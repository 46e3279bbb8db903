// Package costmodel prices requests before and after they are served.
//
// Before a request is forwarded, an Estimator counts its prompt tokens
// exactly (with the provider's tokenizer where it is public), adds the output
// tokens it may produce, and prices the result from the price table; for
// generic metered APIs a declarative rule prices the call from its
// attributes. After the response, the actual usage is read from the body or
// from the server-sent event stream and priced with the same table, so that
// the limiter and the ledger can settle the difference.
//
// Money is NanoUSD, an integer; token counts are int64.
package costmodel
