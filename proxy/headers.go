package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// setRateLimitHeaders writes the RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers-10) of an answer without
// Retry-After, for the limit that decided the request: the policy's quota
// q and window w in seconds, and the remaining quota r and t, the seconds
// until the limit is back to its full quota (the window's end for a fixed
// window, until the bucket is full for a token bucket or GCRA, until the
// newest lease expires for a concurrency limit). A limit in requests says
// qu="requests"; other units use the extension parameter cg-unit (tokens,
// input_tokens, output_tokens, usd in nano-dollars).
//
// A concurrency limit's quota is slots in flight, not units per window: q
// is its slots, r the slots free, and w its lease period (a slot whose
// request neither settles nor renews frees itself w seconds after its last
// renewal).
func (x *exchange) setRateLimitHeaders(h http.Header) {
	if i, ok := x.decider(); ok {
		x.writeRateLimit(h, i, ceilSeconds(x.result.Items[i].ResetAfter))
	}
}

// setRetryAfter writes Retry-After, retry seconds, on a refusal, and the
// RateLimit fields as setRateLimitHeaders does except that t is retry: the
// draft's t is when quota is available again, the same point in time as
// Retry-After.
func (x *exchange) setRetryAfter(h http.Header, retry int64) {
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	if i, ok := x.decider(); ok {
		x.writeRateLimit(h, i, retry)
	}
}

// decider is the index of the limit that decided the request, if any.
func (x *exchange) decider() (int, bool) {
	i := x.result.Decider
	return i, len(x.items) > 0 && i >= 0 && i < len(x.result.Items) && i < len(x.limits)
}

func (x *exchange) writeRateLimit(h http.Header, i int, t int64) {
	l, st := x.limits[i], x.result.Items[i]
	name := strconv.Quote(l.limit.Name)
	var b strings.Builder
	b.WriteString(name)
	b.WriteString(";q=")
	b.WriteString(strconv.FormatInt(st.Capacity, 10))
	b.WriteString(";w=")
	b.WriteString(strconv.FormatInt(int64(l.window(time.Now())/time.Second), 10))
	if l.unit == "requests" {
		b.WriteString(`;qu="requests"`)
	} else {
		b.WriteString(`;cg-unit="`)
		b.WriteString(l.unit)
		b.WriteString(`"`)
	}
	h.Set("RateLimit-Policy", b.String())
	h.Set("RateLimit", name+";r="+strconv.FormatInt(max(st.Remaining, 0), 10)+";t="+strconv.FormatInt(t, 10))
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((max(d, 0) + time.Second - 1) / time.Second)
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
