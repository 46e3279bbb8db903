package proxy_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkUsageReportForms: an upstream's usage report in a form
// costgate read as less than the upstream bills. Each kind of usage an
// answer reports counts at its largest report: a stream's later report
// that states less (a usage chunk repeated with smaller counts, one after
// [DONE], an Anthropic message_delta that restates a lower input, a
// Responses stream's completed event repeated); a count given twice in one
// report (encoding/json keeps the last, the SDKs the first); a count as
// the SDKs read it ("3000", 3e3); a report with a negative count is one
// that cannot be read (its output limit), not one of no tokens; and a
// stream whose reports never state the input is charged the prompt's
// count.
func TestBillAtkUsageReportForms(t *testing.T) {
	const (
		chat  = `{"model":"gpt-4o-mini","max_tokens":4000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
		plain = `{"model":"gpt-4o-mini","max_tokens":4000,"messages":[{"role":"user","content":"hi"}]}`
		anth  = `{"model":"claude-haiku-4-5","max_tokens":4000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
		resp  = `{"model":"gpt-4o-mini","max_output_tokens":4000,"stream":true,"input":"hi"}`
		text  = `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n"
		done  = "data: [DONE]\n\n"
	)
	report := func(u string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":` + u + "}\n\n"
	}
	answer := func(u string) string {
		return `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":` + u + `}`
	}
	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	start := func(u string) string {
		return event("message_start", `{"type":"message_start","message":{"id":"m","model":"claude-haiku-4-5","usage":`+u+`}}`)
	}
	delta := func(u string) string {
		return event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":`+u+`}`)
	}
	stop := event("message_stop", `{"type":"message_stop"}`)
	completed := func(u string) string {
		return `data: {"type":"response.completed","response":{"id":"r","model":"gpt-4o-mini","status":"completed","usage":` + u + "}}\n\n"
	}
	for _, c := range []struct {
		name, path, body, answer string
		want                     costmodel.Usage // at least
	}{
		{"chat-later-report-smaller", "/v1/chat/completions", chat,
			text + report(`{"prompt_tokens":9,"completion_tokens":3000}`) + report(`{"prompt_tokens":9,"completion_tokens":5}`) + done,
			costmodel.Usage{InputTokens: 9, OutputTokens: 3000}},
		{"chat-report-after-done", "/v1/chat/completions", chat,
			text + report(`{"prompt_tokens":9,"completion_tokens":3000}`) + done + report(`{"prompt_tokens":9,"completion_tokens":5}`),
			costmodel.Usage{InputTokens: 9, OutputTokens: 3000}},
		{"chat-output-in-a-later-report", "/v1/chat/completions", chat,
			text + report(`{"prompt_tokens":9,"completion_tokens":0}`) + report(`{"completion_tokens":3000}`) + done,
			costmodel.Usage{InputTokens: 9, OutputTokens: 3000}},
		{"chat-count-twice", "/v1/chat/completions", chat,
			text + report(`{"prompt_tokens":9,"completion_tokens":3000,"Completion_Tokens":5}`) + done,
			costmodel.Usage{InputTokens: 9, OutputTokens: 3000}},
		{"chat-negative-count", "/v1/chat/completions", chat,
			text + report(`{"prompt_tokens":9,"completion_tokens":-3000}`) + done,
			costmodel.Usage{OutputTokens: 4000}},
		{"plain-count-twice", "/v1/chat/completions", plain,
			answer(`{"prompt_tokens":9000,"completion_tokens":3000,"prompt_tokens":9,"completion_tokens":5}`),
			costmodel.Usage{InputTokens: 9000, OutputTokens: 3000}},
		{"plain-counts-as-text-and-exponent", "/v1/chat/completions", plain,
			answer(`{"prompt_tokens":"9000","completion_tokens":3e3}`),
			costmodel.Usage{InputTokens: 9000, OutputTokens: 3000}},
		{"plain-negative-count", "/v1/chat/completions", plain,
			answer(`{"prompt_tokens":9,"completion_tokens":-3000}`),
			costmodel.Usage{OutputTokens: 4000}},
		{"anthropic-delta-lowers-input", "/v1/messages", anth,
			start(`{"input_tokens":5000,"output_tokens":1}`) + delta(`{"input_tokens":10,"output_tokens":3000}`) + stop,
			costmodel.Usage{InputTokens: 5000, OutputTokens: 3000}},
		{"anthropic-delta-after-stop", "/v1/messages", anth,
			start(`{"input_tokens":50,"output_tokens":1}`) + delta(`{"output_tokens":3000}`) + stop + delta(`{"output_tokens":5}`),
			costmodel.Usage{InputTokens: 50, OutputTokens: 3000}},
		{"anthropic-start-without-usage", "/v1/messages", anth,
			event("message_start", `{"type":"message_start","message":{"id":"m","model":"claude-haiku-4-5"}}`) + delta(`{"output_tokens":3000}`) + stop,
			costmodel.Usage{InputTokens: 1, OutputTokens: 3000}},
		{"responses-completed-twice", "/v1/responses", resp,
			completed(`{"input_tokens":9,"output_tokens":3000}`) + completed(`{"input_tokens":9,"output_tokens":5}`),
			costmodel.Usage{InputTokens: 9, OutputTokens: 3000}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				ct := "text/event-stream"
				if c.body == plain {
					ct = "application/json"
				}
				w.Header().Set("Content-Type", ct)
				io.WriteString(w, c.answer)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, c.path, c.body, nil)
			a := e.Actual
			if a.InputTokens < c.want.InputTokens || a.OutputTokens < c.want.OutputTokens {
				t.Errorf("charged %d input and %d output tokens (%v); the upstream reported at least %d and %d",
					a.InputTokens, a.OutputTokens, e.ActualCost, c.want.InputTokens, c.want.OutputTokens)
			}
		})
	}
}
