package costmodel

import (
	"errors"
	"fmt"
)

// BadRequestError reports a request or response body that costmodel cannot
// read: malformed JSON, or a field of the wrong type. The proxy answers a
// client's bad request with 400 and Error's text. Match it with errors.As.
type BadRequestError struct {
	Kind Kind   // the API shape that was being read
	Msg  string // what is wrong, for the client
	Err  error  // the underlying parse error, if any
}

func (e *BadRequestError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("costmodel: bad %s body: %s: %v", e.Kind, e.Msg, e.Err)
	}
	return fmt.Sprintf("costmodel: bad %s body: %s", e.Kind, e.Msg)
}

// Unwrap returns the underlying parse error.
func (e *BadRequestError) Unwrap() error { return e.Err }

func badRequest(k Kind, err error, format string, args ...any) error {
	return &BadRequestError{Kind: k, Msg: fmt.Sprintf(format, args...), Err: err}
}

// ErrCostOverflow reports a request whose token count or cost does not fit
// in an int64 (max_tokens near 2^63, n near 2^63, a unit count that large).
// All of costmodel's arithmetic saturates at math.MaxInt64 instead of
// wrapping; an estimate (Estimator.Estimate, Rule.Estimate) that reaches
// that bound in a count or in its cost is refused with a *BadRequestError
// wrapping ErrCostOverflow, which the proxy answers with 400
// cost_exceeds_limit. Settlement (Price.Cost of reported usage) cannot
// refuse: its cost saturates at math.MaxInt64.
var ErrCostOverflow = errors.New("costmodel: cost exceeds what can be represented")

// overflowed reports whether an estimate reached the saturation bound.
func overflowed(u Usage, cost NanoUSD) bool {
	const top = 1<<63 - 1
	return cost == top || u.InputTokens == top || u.OutputTokens == top || u.Units == top ||
		u.WebSearchRequests == top || u.FileSearchCalls == top || u.AudioInputTokens == top || u.AudioOutputTokens == top
}

func overflowError(k Kind) error {
	return badRequest(k, ErrCostOverflow, "the request's cost cannot be represented")
}
