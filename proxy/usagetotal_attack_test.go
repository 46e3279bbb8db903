package proxy_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkReasoningOutsideTheCompletion: an OpenAI-compatible upstream
// that counts a reasoning model's reasoning tokens beside
// completion_tokens (and in total_tokens), as xAI's does, bills 5,010
// output tokens where the answer's completion_tokens says 10. costgate
// charged the 10, in a plain answer and in a stream's usage chunk: a
// tenant asking for long reasoning paid for its visible text alone.
func TestBillAtkReasoningOutsideTheCompletion(t *testing.T) {
	const usage = `{"prompt_tokens":20,"completion_tokens":10,"total_tokens":5030,"completion_tokens_details":{"reasoning_tokens":5000}}`
	for _, c := range []struct {
		name, body string
		answer     func(w http.ResponseWriter)
	}{
		{"plain", `{"model":"gpt-4o-mini","max_tokens":8000,"messages":[{"role":"user","content":"think hard"}]}`, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"42"},"finish_reason":"stop"}],"usage":`+usage+`}`)
		}},
		{"stream", `{"model":"gpt-4o-mini","max_tokens":8000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"think hard"}]}`, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"42"}}]}`+"\n\n")
			io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":`+usage+`}`+"\n\n")
			io.WriteString(w, "data: [DONE]\n\n")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) { c.answer(w) }}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, "/v1/chat/completions", c.body, nil)
			want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 20, OutputTokens: 5010})
			if e.Actual.OutputTokens < 5010 || e.ActualCost < want {
				t.Errorf("charged %d output tokens (%v); the upstream bills 5010 (%v)", e.Actual.OutputTokens, e.ActualCost, want)
			}
		})
	}
}
