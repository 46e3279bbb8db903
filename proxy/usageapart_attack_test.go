package proxy_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkUsageApartFromItsTotal: Perplexity's OpenAI-compatible API
// reports a deep research answer's reasoning tokens, the search results
// its model read (citation_tokens, billed as input) and its searches
// (num_search_queries, billed per search) beside prompt_tokens and
// completion_tokens, and a total_tokens of those two alone. costgate read
// OpenAI's members alone and charged 19 input and 9,287 output tokens, in
// a plain answer and in a stream's usage chunk, where the upstream bills
// 15,238 input tokens, 83,284 output tokens and 19 searches: a tenant
// asking for deep research paid for its visible answer alone.
func TestBillAtkUsageApartFromItsTotal(t *testing.T) {
	const usage = `{"prompt_tokens":19,"completion_tokens":9287,"total_tokens":9306,"citation_tokens":15219,"num_search_queries":19,"reasoning_tokens":73997,"search_context_size":"low"}`
	for _, c := range []struct {
		name, body string
		answer     func(w http.ResponseWriter)
	}{
		{"plain", `{"model":"sonar-deep-research","max_tokens":100000,"messages":[{"role":"user","content":"research it"}]}`, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"c","object":"chat.completion","model":"sonar-deep-research","choices":[{"index":0,"message":{"role":"assistant","content":"42"},"finish_reason":"stop"}],"usage":`+usage+`}`)
		}},
		{"stream", `{"model":"sonar-deep-research","max_tokens":100000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"research it"}]}`, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"sonar-deep-research","choices":[{"index":0,"delta":{"content":"42"}}]}`+"\n\n")
			io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"sonar-deep-research","choices":[],"usage":`+usage+`}`+"\n\n")
			io.WriteString(w, "data: [DONE]\n\n")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) { c.answer(w) }}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, "/v1/chat/completions", c.body, nil)
			bill := costmodel.Usage{InputTokens: 15238, OutputTokens: 83284, WebSearchRequests: 19}
			want := estimator(t).Cost("sonar-deep-research", bill)
			if e.Actual.InputTokens < bill.InputTokens || e.Actual.OutputTokens < bill.OutputTokens || e.ActualCost < want {
				t.Errorf("charged %d input and %d output tokens (%v); the upstream bills %d, %d and %d searches (%v)",
					e.Actual.InputTokens, e.Actual.OutputTokens, e.ActualCost, bill.InputTokens, bill.OutputTokens, bill.WebSearchRequests, want)
			}
		})
	}
}
