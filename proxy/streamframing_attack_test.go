package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestBillAtkStreamFraming: a stream whose usage report the meter did not
// see as an event, though it passed to the client: after a byte order mark
// that starts the stream (which the SSE format ignores: the report was
// taken for a field named "\ufeffdata"), or on a line of no SSE field
// ("Data:"), where a report is lost. costgate charged the tokens it
// counted, 1 output token, where the upstream reports and bills 3,000. The
// first is read; the second is charged as a stream whose report could not
// be read (its output limit). CRLF lines written a byte at a time held.
func TestBillAtkStreamFraming(t *testing.T) {
	const (
		chat = `{"model":"gpt-4o-mini","max_tokens":4000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
		text = `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n"
		rep  = `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3000}}` + "\n\n"
		done = "data: [DONE]\n\n"
	)
	for _, c := range []struct {
		name, answer string
		perByte      bool
	}{
		{"byte-order-mark", "\ufeff" + rep + text + done, false},
		{"field-in-another-case", "Data: " + strings.TrimPrefix(rep, "data: ") + text + done, false},
		{"crlf-a-byte-at-a-time", strings.ReplaceAll(text+rep+done, "\n", "\r\n"), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				if !c.perByte {
					io.WriteString(w, c.answer)
					return
				}
				for i := range len(c.answer) {
					io.WriteString(w, c.answer[i:i+1])
					w.(http.Flusher).Flush()
				}
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, "/v1/chat/completions", chat, nil)
			if e.Actual.OutputTokens < 3000 {
				t.Errorf("charged %d output tokens (%v); the upstream reported and bills 3000", e.Actual.OutputTokens, e.ActualCost)
			}
		})
	}
}
