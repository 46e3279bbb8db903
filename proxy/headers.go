package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// setRateLimitHeaders writes the RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers-10) for the limit that decided the
// request: its quota q, window w in seconds, remaining r and reset t in
// seconds. A limit in requests says qu="requests"; other units use the
// extension parameter cg-unit (tokens, input_tokens, output_tokens, usd in
// nano-dollars).
func (x *exchange) setRateLimitHeaders(h http.Header) {
	if len(x.items) == 0 || x.result.Decider < 0 || x.result.Decider >= len(x.result.Items) {
		return
	}
	i := x.result.Decider
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
	reset := int64((st.ResetAfter + time.Second - 1) / time.Second)
	h.Set("RateLimit", name+";r="+strconv.FormatInt(max(st.Remaining, 0), 10)+";t="+strconv.FormatInt(reset, 10))
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
