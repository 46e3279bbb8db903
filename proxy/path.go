package proxy

// A request to a generic upstream, /u/NAME/REST, is read once: REST is
// percent-decoded and its dot-segments removed by genericPath, and that one
// result is what the upstream's price rules match, what the estimate sees
// as GenericRequest.Path and what the upstream receives after its
// base_url's path. A spelling that could be read two ways (an encoded
// slash or backslash, a control character, a double encoding, a
// dot-segment that climbs above /u/NAME) is refused instead of guessed.

import (
	"bytes"
	"fmt"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/costgate/costgate/costmodel"
)

// refusal is an answer costgate gives itself instead of forwarding a
// request: its status, the error body, and for a 405 the Allow header.
type refusal struct {
	status int
	allow  string
	err    apiError
}

// write answers the client with the refusal; path is the route's name,
// which chooses the body's shape.
func (f *refusal) write(w http.ResponseWriter, path string) {
	if f.allow != "" {
		w.Header().Set("Allow", f.allow)
	}
	writeError(w, path, f.status, f.err)
}

// admit checks a request to the generic upstream u: its method must be one
// of u's, and its path must read one way (see genericPath). It returns the
// path after /u/NAME, decoded and cleaned, or why the request is refused.
func (u *upstream) admit(r *http.Request) (string, *refusal) {
	if !slices.Contains(u.methods, r.Method) {
		return "", &refusal{status: http.StatusMethodNotAllowed, allow: strings.Join(u.methods, ", "), err: apiError{
			Type: "invalid_request_error", Code: "method_not_allowed",
			Message: fmt.Sprintf("upstream %s does not take %s requests through costgate (allowed: %s)",
				u.name, r.Method, strings.Join(u.methods, ", ")),
		}}
	}
	// A method-override header would have the upstream run another method
	// than the one checked above and priced, under costgate's credential.
	// A path-override header, likewise, another path than the one priced.
	for h := range r.Header {
		if isMethodOverride(h) {
			return "", &refusal{status: http.StatusBadRequest, err: apiError{
				Type: "invalid_request_error", Code: "method_override",
				Message: fmt.Sprintf("%s is not forwarded: send the request with its own method", h),
			}}
		}
		if isPathOverride(h) {
			return "", &refusal{status: http.StatusBadRequest, err: apiError{
				Type: "invalid_request_error", Code: "path_override",
				Message: fmt.Sprintf("%s is not forwarded: send the request to its own path", h),
			}}
		}
	}
	p, err := genericPath(requestPath(r), u.name)
	if err != nil {
		return "", &refusal{status: http.StatusBadRequest, err: apiError{
			Type: "invalid_request_error", Code: "invalid_path", Message: err.Error(),
		}}
	}
	return p, nil
}

// isMethodOverride tells whether a header is one by which servers
// (Google's APIs, many web frameworks) let a request name the method they
// run instead of its own, in any of its spellings (costmodel.HeaderIs).
func isMethodOverride(name string) bool {
	return costmodel.HeaderIs(name, "x-http-method-override") || costmodel.HeaderIs(name, "x-http-method") || costmodel.HeaderIs(name, "x-method-override")
}

// isPathOverride tells whether a header is one by which servers run
// another path than the request line's, in any of its spellings
// (costmodel.HeaderIs): X-Original-URL and X-Rewrite-URL, which IIS's URL
// Rewrite sets for ASP.NET behind it, and Zend and older Symfony read.
func isPathOverride(name string) bool {
	return costmodel.HeaderIs(name, "x-original-url") || costmodel.HeaderIs(name, "x-rewrite-url")
}

// methodOverrideParam returns the name of a query parameter or form
// field by which servers let a POST name the method they run instead
// (_method: Rails' Rack::MethodOverride, Laravel and Symfony, Express's
// method-override), in any case, or "" when the request has none: of the
// query q, or of body, a form when its Content-Type ct says so.
func methodOverrideParam(q url.Values, ct string, body []byte) string {
	for k := range q {
		if isMethodParam(k) {
			return k
		}
	}
	mt, _, _ := strings.Cut(ct, ";")
	switch mt = strings.TrimSpace(mt); {
	case strings.EqualFold(mt, "application/x-www-form-urlencoded"):
		for k := range costmodel.FormPairs(string(body)) {
			if isMethodParam(k) {
				return k
			}
		}
	case strings.EqualFold(mt, "multipart/form-data"):
		_, params, err := mime.ParseMediaType(ct)
		if err != nil || params["boundary"] == "" {
			return "" // no upstream reads its fields either
		}
		mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
		for {
			p, err := mr.NextPart()
			if err != nil {
				return ""
			}
			// Named as servers name it, whatever its disposition's
			// type (a rule that reads the form refuses a part whose
			// name cannot be read).
			if name, _ := costmodel.PartName(p); isMethodParam(name) {
				return name
			}
		}
	}
	return ""
}

// isMethodParam tells whether a parameter is _method to some server, in
// any of the spellings costmodel.ParamIs reads (any case; PHP's ".method",
// " _method", "_method\x00x").
func isMethodParam(name string) bool {
	return costmodel.ParamIs(name, "_method")
}

// isIdempotencyKey tells whether a header carries a key by which an
// upstream keeps one answer per key of an account: any header whose name
// holds "idempoten", in any of its spellings (costmodel.HeaderIs):
// Idempotency-Key (OpenAI's, Stripe's), X-Idempotency-Key,
// Idempotency-Token, X-Amzn-Idempotency-Token, X_IDEMPOTENCY_KEY.
func isIdempotencyKey(name string) bool {
	const word = "idempoten"
	for i := 0; i+len(word) <= len(name); i++ {
		if c := name[i]; (c == 'i' || c == 'I') && costmodel.HeaderIs(name[i:i+len(word)], word) {
			return true
		}
	}
	return false
}

// requestPath is the request's path as the client sent it, still escaped:
// the request line's target without its query. Go has already decoded
// r.URL.Path, and its EscapedPath re-encodes a path that held characters a
// path may not hold, so it could hide an encoded slash; the request line
// cannot.
func requestPath(r *http.Request) string {
	u := r.RequestURI
	if u == "" { // a request that did not come from a server
		return r.URL.EscapedPath()
	}
	if !strings.HasPrefix(u, "/") {
		// The absolute form, http://host/path: drop the scheme and host.
		if i := strings.Index(u, "://"); i >= 0 {
			u = u[i+3:]
		}
		if i := strings.IndexByte(u, '/'); i >= 0 {
			u = u[i:]
		} else {
			u = "/"
		}
	}
	if i := strings.IndexByte(u, '?'); i >= 0 {
		u = u[:i]
	}
	return u
}

// genericPath reads the escaped path of a request to the generic upstream
// name, /u/NAME/REST, and returns REST percent-decoded, its "." segments
// and empty segments dropped and each ".." removing the segment before it:
// "/x/../expensive", "//expensive" and "/./expensive" all read
// "/expensive". A trailing slash is kept ("/a/" stays "/a/"); an empty
// REST reads "/".
//
// It refuses a path that holds an encoded slash or backslash (%2F, %5C), a
// raw backslash, a NUL or other control character, an invalid or double
// percent-encoding (%252e), a dot-segment with parameters ("..;x"), or a
// ".." that would climb above /u/NAME: each is read differently by
// different servers, and the upstream's own credential goes with the
// request.
func genericPath(raw, name string) (string, error) {
	segs := strings.Split(raw, "/")
	// segs[0] is empty (raw starts with /), segs[1] is "u", segs[2] NAME.
	if len(segs) < 3 || segs[0] != "" {
		return "", fmt.Errorf("the path %q is not /u/%s/...", raw, name)
	}
	for i, want := range []string{"u", name} {
		if d, err := url.PathUnescape(segs[1+i]); err != nil || d != want {
			return "", fmt.Errorf("the path %q is not /u/%s/...", raw, name)
		}
	}
	segs = segs[3:]
	out := make([]string, 0, len(segs))
	trailing := false
	for i, seg := range segs {
		d, err := decodeSegment(seg)
		if err != nil {
			return "", fmt.Errorf("the path after /u/%s is refused: %w", name, err)
		}
		last := i == len(segs)-1
		switch d {
		case "", ".":
			trailing = last
		case "..":
			if len(out) == 0 {
				return "", fmt.Errorf("the path after /u/%s is refused: a .. segment climbs above /u/%s", name, name)
			}
			out = out[:len(out)-1]
			trailing = last
		default:
			out = append(out, d)
			trailing = false
		}
	}
	p := "/" + strings.Join(out, "/")
	if trailing && len(out) > 0 {
		p += "/"
	}
	return p, nil
}

// decodeSegment percent-decodes one path segment, and refuses the
// spellings genericPath does.
func decodeSegment(seg string) (string, error) {
	if strings.IndexByte(seg, '\\') >= 0 {
		return "", fmt.Errorf("a backslash is not allowed in a path")
	}
	lower := strings.ToLower(seg)
	switch {
	case strings.Contains(lower, "%2f"):
		return "", fmt.Errorf("an encoded slash (%%2F) is not allowed in a path")
	case strings.Contains(lower, "%5c"):
		return "", fmt.Errorf("an encoded backslash (%%5C) is not allowed in a path")
	}
	d, err := url.PathUnescape(seg)
	if err != nil {
		return "", fmt.Errorf("invalid percent-encoding in %q", seg)
	}
	for i := 0; i < len(d); i++ {
		if c := d[i]; c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("a control character (%#02x) is not allowed in a path", c)
		}
	}
	dl := strings.ToLower(d)
	if strings.Contains(dl, "%2e") || strings.Contains(dl, "%2f") || strings.Contains(dl, "%5c") {
		return "", fmt.Errorf("a double percent-encoding (%q) is not allowed in a path", seg)
	}
	if strings.IndexByte(d, ';') >= 0 {
		// Tomcat, Jetty and Spring drop a segment's ";params" before
		// routing, others keep them: "/v1;x/premium" is "/v1/premium"
		// to the first, and no price rule's "/v1/premium" here.
		return "", fmt.Errorf("a path parameter (%q) is not allowed in a path", d)
	}
	return d, nil
}

// forwardPath is the path the upstream receives: its base_url's path, then
// the cleaned path after /u/NAME. It never leaves the base path.
func (u *upstream) forwardPath(clean string) string {
	return u.target.Path + clean
}
