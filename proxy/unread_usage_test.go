package proxy_test

// Attacks of a tenant who wants to pay less, through the proxy: answers
// whose usage costgate cannot read are charged from the estimate, so an
// estimate below what the upstream bills, or an answer the tenant can make
// come without usage, lowers the bill.

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// payLessBigAnswer writes a chat completion larger than costgate keeps to read
// its usage (logprobs inflate it), ending with usage.
func payLessBigAnswer(w http.ResponseWriter, usage string) {
	w.Header().Set("Content-Type", "application/json")
	var b bytes.Buffer
	b.WriteString(`{"id":"c","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"logprobs":{"content":[`)
	for i := 0; b.Len() < 9<<20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"token":" word","logprob":-0.1,"top_logprobs":[{"token":" word","logprob":-0.1},{"token":" other","logprob":-2.3}]}`)
	}
	b.WriteString(`]},"finish_reason":"stop"}],"usage":` + usage + `}`)
	w.Write(b.Bytes())
}

// TestPayLessOverflowedAnswerBillsTheInputTheUpstreamReads: an answer too
// large to read whole is charged the estimate's input, so the estimate
// counts every prompt the upstream reads (a text part that also carries an
// image_url, a response_format schema): the request pays for the prompt
// the upstream bills, not a fraction of it.
func TestPayLessOverflowedAnswerBillsTheInputTheUpstreamReads(t *testing.T) {
	long := strings.Repeat("hello world ", 5000)
	est := estimator(t)
	prompt := est.CountText("gpt-4o", long) // what the upstream reads at least
	for _, c := range []struct{ name, body string }{
		{"text-part-with-image_url", `{"model":"gpt-4o","max_completion_tokens":100,"logprobs":true,"top_logprobs":20,"messages":[{"role":"user","content":[{"type":"text","text":"` + long + `","image_url":{"url":"https://example.com/a.png","detail":"low"}}]}]}`},
		{"response_format-schema", `{"model":"gpt-4o","max_completion_tokens":100,"logprobs":true,"top_logprobs":20,"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"string","description":"` + long + `"}}}}}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
				payLessBigAnswer(w, fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":100}`, prompt+20))
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, "/v1/chat/completions", c.body, nil)
			if e.Actual.InputTokens < prompt {
				t.Errorf("charged %d input tokens (%v); the upstream reads at least %d (%v)", e.Actual.InputTokens, e.ActualCost,
					prompt, est.Cost("gpt-4o", costmodel.Usage{InputTokens: prompt, OutputTokens: 100}))
			}
		})
	}
}

// TestPayLessBackgroundResponseBilledItsOutputLimit: a Responses request
// with "background": true is answered at once, queued, with no usage; the
// upstream runs it afterwards and bills its whole output. costgate charges
// a success without usage its estimate, which with output_reserve 10 is a
// tenth of the output the request may produce.
func TestPayLessBackgroundResponseBilledItsOutputLimit(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"resp_1","object":"response","status":"queued","background":true,"model":"o3-2025-04-16","output":[],"usage":null}`)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: "\ncosts:\n  output_reserve: 10\n" + roomyLimits, upstream: up})
	e, _ := oneEntry(t, s, "/v1/responses", `{"model":"o3","background":true,"max_output_tokens":20000,"input":"think hard"}`, nil)
	if e.Actual.OutputTokens < 20000 {
		t.Errorf("charged %d output tokens (%v); the queued run may bill up to 20000", e.Actual.OutputTokens, e.ActualCost)
	}
}

// TestPayLessSeveralStreamUsageReports: an OpenAI-compatible stream with
// two usage-only chunks is billed the last.
func TestPayLessSeveralStreamUsageReports(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1}}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" more"}}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3000}}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	e, _ := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, nil)
	if e.Actual.OutputTokens != 3000 {
		t.Errorf("charged %+v; the upstream's last report billed 3000 output tokens", e.Actual)
	}
}
