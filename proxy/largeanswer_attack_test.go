package proxy_test

import (
	"bytes"
	"net/http"
	"testing"
)

// TestBillAtkLargeAnswerHidesItsInput: an answer too large to keep whole
// (9 MiB of logprobs) was charged its estimate at the output limit,
// without reading the usage at its end. For a request whose input the
// upstream adds to (a file search's results, reserved at
// search_result_tokens each), the estimate is not an upper bound: the
// upstream billed 45,000 input tokens of search results, costgate
// charged the 10,000 reserved. The usage report of such an answer is read
// as it passes, and the request is charged no less than it.
func TestBillAtkLargeAnswerHidesItsInput(t *testing.T) {
	const input = 45000
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		var b bytes.Buffer
		b.WriteString(`{"id":"resp_1","object":"response","status":"completed","model":"gpt-4.1-mini","output":[{"type":"file_search_call","id":"fs","status":"completed","queries":["q"]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi","logprobs":[`)
		for i := 0; b.Len() < 9<<20; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"token":" word","logprob":-0.1,"top_logprobs":[{"token":" word","logprob":-0.1},{"token":" other","logprob":-2.3}]}`)
		}
		b.WriteString(`]}]}],"usage":{"input_tokens":45000,"output_tokens":3000,"output_tokens_details":{"reasoning_tokens":0}}}`)
		w.Write(b.Bytes())
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	e, got := oneEntry(t, s, "/v1/responses", `{"model":"gpt-4.1-mini","input":"what do my files say?","max_output_tokens":3000,"max_tool_calls":1,"top_logprobs":20,"include":["message.output_text.logprobs"],"tools":[{"type":"file_search","vector_store_ids":["vs_1"],"max_num_results":50}]}`, nil)
	t.Logf("client got %d bytes; ledger: %+v, %v (reserved %v)", len(got), e.Actual, e.ActualCost, e.EstimatedCost)
	if e.Actual.InputTokens < input || e.Actual.OutputTokens < 3000 {
		t.Errorf("charged %d input / %d output tokens (%v); the upstream billed %d / 3000", e.Actual.InputTokens, e.Actual.OutputTokens, e.ActualCost, input)
	}
	if e.Actual.FileSearchCalls < 1 {
		t.Errorf("charged %d file searches; the answer made one", e.Actual.FileSearchCalls)
	}
}
