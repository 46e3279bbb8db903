package costmodel

import "fmt"

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
