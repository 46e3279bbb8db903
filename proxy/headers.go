package proxy

import (
	"net/http"
	"strconv"

	"github.com/costgate/costgate/gate"
)

// setRateLimitHeaders writes the RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers-10) of an admitted request, for
// the limit that decided it (see gate.RateLimit): the policy's quota q and
// window w in seconds, the remaining quota r and t, the seconds until the
// limit is back to its full quota (the window's end for a fixed window,
// until the bucket is full for a token bucket or GCRA, until the newest
// lease expires for a concurrency limit).
//
// A concurrency limit's quota is slots in flight, not units per window: q
// is its slots, r the slots free, and w its lease period.
func (x *exchange) setRateLimitHeaders(h http.Header) {
	setRateLimit(h, x.decision.RateLimit)
}

func setRateLimit(h http.Header, rl *gate.RateLimit) {
	if rl == nil {
		return
	}
	// One slice for both fields' values (Set would make one each); a
	// header's values are replaced or appended to, never written in place.
	v := []string{rl.PolicyField(), rl.Field()}
	h["Ratelimit-Policy"], h["Ratelimit"] = v[0:1:1], v[1:2:2]
}

// writeDecision answers a refusal: Retry-After when it has one (the
// draft's t is then the same point in time), the RateLimit fields, and
// the error body.
func writeDecision(w http.ResponseWriter, path string, d gate.Decision) {
	h := w.Header()
	if d.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(d.RetryAfter, 10))
	}
	setRateLimit(h, d.RateLimit)
	if d.Degraded {
		h.Set("Costgate-Degraded", "fail-open")
	}
	e := apiError{Type: "api_error", Message: "refused"}
	if d.Error != nil {
		e = apiError(*d.Error)
	}
	writeError(w, path, d.Status, e)
}

// apiError is the body of an error costgate answers itself, in the shape
// OpenAI's SDKs read ({"error": {...}}) or, on /v1/messages, Anthropic's.
type apiError struct {
	Type         string `json:"type"`
	Code         string `json:"code,omitempty"`
	Message      string `json:"message"`
	Policy       string `json:"policy,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

func writeError(w http.ResponseWriter, path string, status int, e apiError) {
	var body any = struct {
		Error apiError `json:"error"`
	}{e}
	if path == "/v1/messages" {
		body = struct {
			Type  string   `json:"type"`
			Error apiError `json:"error"`
		}{"error", e}
	}
	writeJSON(w, status, body)
}
