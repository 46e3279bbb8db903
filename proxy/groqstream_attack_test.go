package proxy_test

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// TestBillAtkGroqStreamUsage: Groq reports a stream's usage in its last
// chunk's x_groq.usage, not in a top-level usage member. costgate did
// not read it: such a stream was charged as one without a report, the
// prompt's estimate and the streamed text counted, 1 output token where
// the upstream reports and bills 3,000 (the reasoning a Groq model was
// asked to hide, reasoning_format "hidden", is never streamed). The
// x_groq report is read as a usage report.
func TestBillAtkGroqStreamUsage(t *testing.T) {
	const (
		text = `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}` + "\n\n"
		last = `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],` +
			`"x_groq":{"id":"req_01","usage":{"queue_time":0.02,"prompt_tokens":9,"prompt_time":0.001,"completion_tokens":3000,"completion_time":1.2,"total_tokens":3009,"total_time":1.201}}}` + "\n\n"
		done = "data: [DONE]\n\n"
	)
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, text+last+done)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	st := s.client("cg-test-acme").Chat.Completions.NewStreaming(context.Background(), chatParams("hi", 4000))
	for st.Next() {
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	e := s.settled(t, 1)[0]
	if e.Actual.OutputTokens < 3000 {
		t.Errorf("charged %d output tokens (%v); the upstream reported in x_groq.usage and bills 3000", e.Actual.OutputTokens, e.ActualCost)
	}
}
