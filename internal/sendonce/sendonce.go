// Package sendonce makes an outgoing request one that net/http's
// Transport sends at most once.
//
// The Transport sends a request again, unasked, when a kept-alive
// connection breaks after the request was written and before the
// answer's status line, if it takes the request for replayable: a GET,
// HEAD, OPTIONS or TRACE, or one with an Idempotency-Key or
// X-Idempotency-Key header, that has no body or can rewind it (GetBody,
// which http.NewRequest sets for a bytes.Reader), and it tries each
// kept-alive connection it holds before a new one. An upstream that ran
// the first serves, and bills, each; a limiter that debits and settles
// the request once bills one.
package sendonce

import (
	"io"
	"net/http"
	"strings"
)

// Prepare gives out a body the Transport cannot rewind: GetBody goes, and
// a GET, HEAD, OPTIONS, DELETE or TRACE with no body gets an empty one,
// which the Transport reads before it writes the request and sends as no
// body (over HTTP/1.1 no Content-Length, though a TRACE's goes chunked;
// over HTTP/2 an empty end of stream after the headers). Another method
// with no body (an empty one would go chunked, which some servers refuse)
// keeps its Content-Length: 0 and has its idempotency key sent under the
// field's name in lower case, which servers read as the same field and
// the Transport, which looks for the canonical name, does not. Over
// HTTP/2 such a request is still sent again after the server refused its
// stream (REFUSED_STREAM, or a GOAWAY that left it out, which say it was
// not run) or reset it as malformed (PROTOCOL_ERROR).
//
// A request written whole that gets no answer then fails: the caller
// charges it as the upstream may have run it, also when the connection
// was one the upstream was closing as idle and the request never ran, as
// the two cannot be told apart.
func Prepare(out *http.Request) {
	out.GetBody = nil
	if out.Body != nil && out.Body != http.NoBody {
		return
	}
	switch out.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodDelete, http.MethodTrace:
		out.Body = emptyBody{}
	default:
		for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
			if vs, ok := out.Header[name]; ok {
				delete(out.Header, name)
				lower := strings.ToLower(name)
				out.Header[lower] = append(out.Header[lower], vs...)
			}
		}
	}
}

// emptyBody is the body of a request that has none, given by Prepare:
// the Transport cannot rewind it, and reads its end before it writes the
// request.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }
