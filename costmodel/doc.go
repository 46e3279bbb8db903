// Package costmodel prices requests before they are served and settles
// them after.
//
// Before a request is forwarded, an Estimator counts its prompt tokens
// exactly with the provider's tokenizer where it is public (OpenAI's
// o200k_base and cl100k_base, counted by this package's own pre-tokenizer
// and BPE, checked against pkoukk/tiktoken-go), adds the message-format
// overhead so that the count equals the usage.prompt_tokens the API reports,
// reserves the output the request may produce (its max_tokens, else the
// model's maximum; all of it or a configured share), and prices the result
// from the price table (an embedded file, prices.yaml, overridden by
// configuration). Model names are found exactly or through the table's
// declared aliases, never by prefix; Estimator.Canonical gives the one name
// per-model limits should key on. Parts it cannot count exactly, and hidden
// reasoning, set Estimate.Uncounted. Claude has no public tokenizer: its count is a documented
// approximation (anthropic.go). Generic metered APIs are priced by a
// declarative Rule per route: per call, per unit read from the request, or
// by a search query's complexity (rule.go, complexity.go).
//
// After the response, ParseUsage (ParseResponse, with the model the upstream
// says it served) reads the usage from a JSON body and a StreamMeter from a
// server-sent event stream as it passes (or, when the stream is cut, counts
// the text it carried), and Estimator.Cost prices it, every billed dimension
// included (long-context tiers, cache lifetimes, service tiers, audio, web
// searches),
// with the same table, so that the limiter and the ledger can settle the
// difference between the reservation and the bill.
//
// Counting is the proxy's hot path. The tokenizer allocates nothing and is
// about twenty times faster than pkoukk/tiktoken-go on English text; request
// bodies are read by a validating scanner that does not decode what it does
// not need; and per-message counts are cached by content hash, so a long
// conversation costs about as much as its newest message. Figures, and the
// commands that measure them, are in bench/README.md.
//
// Money is NanoUSD, an integer; token counts are int64. Arithmetic
// saturates, and an estimate that saturates is refused (ErrCostOverflow). An Estimator is
// safe for concurrent use; a StreamMeter belongs to one response.
package costmodel
