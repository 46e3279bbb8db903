package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkReportWithoutACount: an upstream's usage report that does
// not state a count (input_tokens or output_tokens absent or null), or
// states 0 for a prompt costgate counted or for text the stream carried,
// was read as a report of no such tokens: an Anthropic answer without
// input_tokens was charged no input, a chat, Responses or Anthropic
// answer without its output count no output (600 tokens of text
// streamed, charged 0), an Anthropic stream whose message_delta states
// no output_tokens the 1 of message_start. What must hold: the input is
// never charged below the prompt's count, and the output never below
// the text the stream carried, or, for an answer that does not state it,
// the request's output limit, as for any answer whose usage cannot be
// read.
func TestBillAtkReportWithoutACount(t *testing.T) {
	prompt := strings.Repeat("hello world ", 500)
	const limit = 4000
	body := func(model, field string, stream bool) string {
		s := ""
		if stream {
			s = `"stream":true,`
		}
		return fmt.Sprintf(`{"model":%q,%q:%d,%s"messages":[{"role":"user","content":%q}]}`, model, field, limit, s, prompt)
	}
	var (
		anth    = body("claude-haiku-4-5", "max_tokens", false)
		anthS   = body("claude-haiku-4-5", "max_tokens", true)
		chat    = body("gpt-4o-mini", "max_tokens", false)
		chatS   = strings.Replace(body("gpt-4o-mini", "max_tokens", true), `"stream":true,`, `"stream":true,"stream_options":{"include_usage":true},`, 1)
		resp    = fmt.Sprintf(`{"model":"gpt-4o-mini","max_output_tokens":%d,"input":%q}`, limit, prompt)
		respS   = fmt.Sprintf(`{"model":"gpt-4o-mini","max_output_tokens":%d,"stream":true,"input":%q}`, limit, prompt)
		text    = strings.Repeat("Hi there friend ", 200) // 600 tokens and more, in o200k_base and cl100k_base
		message = func(u string) string {
			return `{"id":"m","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"Hi"}],"usage":` + u + `}`
		}
		completion = func(u string) string {
			return `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":` + u + `}`
		}
		event = func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
		start = func(u string) string {
			return event("message_start", `{"type":"message_start","message":{"id":"m","model":"claude-haiku-4-5","usage":`+u+`}}`)
		}
		anthText = event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+text+`"}}`)
		delta    = func(u string) string {
			return event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":`+u+`}`) + event("message_stop", `{"type":"message_stop"}`)
		}
		chunk  = `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"` + text + `"}}]}` + "\n\n"
		report = func(u string) string {
			return `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":` + u + "}\n\ndata: [DONE]\n\n"
		}
		respText  = `data: {"type":"response.output_text.delta","delta":"` + text + `"}` + "\n\n"
		completed = func(u string) string {
			return `data: {"type":"response.completed","response":{"id":"r","model":"gpt-4o-mini","status":"completed","usage":` + u + "}}\n\n"
		}
	)
	const streamed = 600
	for _, c := range []struct {
		name, path, body, answer string
		in, out                  int64 // at least; -1: the prompt's count, -2: the output limit
	}{
		{"anthropic-no-input", "/v1/messages", anth, message(`{"output_tokens":10}`), -1, 10},
		{"anthropic-null-input", "/v1/messages", anth, message(`{"input_tokens":null,"output_tokens":10}`), -1, 10},
		{"anthropic-zero-input", "/v1/messages", anth, message(`{"input_tokens":0,"output_tokens":10}`), -1, 10},
		{"anthropic-iterations-without-input", "/v1/messages", anth, message(`{"output_tokens":10,"iterations":[{"type":"message","output_tokens":10}]}`), -1, 10},
		{"anthropic-no-output", "/v1/messages", anth, message(`{"input_tokens":1000}`), 1000, -2},
		{"anthropic-null-output", "/v1/messages", anth, message(`{"input_tokens":1000,"output_tokens":null}`), 1000, -2},
		{"chat-zero-prompt", "/v1/chat/completions", chat, completion(`{"prompt_tokens":0,"completion_tokens":10}`), -1, 10},
		{"chat-no-completion", "/v1/chat/completions", chat, completion(`{"prompt_tokens":1008}`), 1008, -2},
		{"chat-null-completion", "/v1/chat/completions", chat, completion(`{"prompt_tokens":1008,"completion_tokens":null}`), 1008, -2},
		{"responses-no-output", "/v1/responses", resp, `{"id":"r","object":"response","status":"completed","model":"gpt-4o-mini","output":[],"usage":{"input_tokens":1008}}`, 1008, -2},
		{"anthropic-stream-zero-input", "/v1/messages", anthS, start(`{"input_tokens":0,"output_tokens":1}`) + anthText + delta(`{"output_tokens":10}`), -1, 10},
		{"anthropic-stream-no-output", "/v1/messages", anthS, start(`{"input_tokens":1000}`) + anthText + delta(`{}`), 1000, streamed},
		{"anthropic-stream-output-of-start", "/v1/messages", anthS, start(`{"input_tokens":1000,"output_tokens":1}`) + anthText + delta(`{"output_tokens":null}`), 1000, streamed},
		{"anthropic-stream-zero-output", "/v1/messages", anthS, start(`{"input_tokens":1000,"output_tokens":1}`) + anthText + delta(`{"output_tokens":0}`), 1000, streamed},
		{"chat-stream-zero-prompt", "/v1/chat/completions", chatS, chunk + report(`{"prompt_tokens":0,"completion_tokens":10}`), -1, 10},
		{"chat-stream-no-completion", "/v1/chat/completions", chatS, chunk + report(`{"prompt_tokens":1008}`), 1008, streamed},
		{"chat-stream-zero-completion", "/v1/chat/completions", chatS, chunk + report(`{"prompt_tokens":1008,"completion_tokens":0}`), 1008, streamed},
		{"responses-stream-no-output", "/v1/responses", respS, respText + completed(`{"input_tokens":1008}`), 1008, streamed},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				ct := "application/json"
				if strings.HasPrefix(c.answer, "event:") || strings.HasPrefix(c.answer, "data:") {
					ct = "text/event-stream"
				}
				w.Header().Set("Content-Type", ct)
				io.WriteString(w, c.answer)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, c.path, c.body, nil)
			in, out := c.in, c.out
			if in == -1 {
				in = e.Estimated.InputTokens
			}
			if out == -2 {
				out = limit
			}
			if e.Actual.InputTokens < in || e.Actual.OutputTokens < out {
				t.Errorf("charged %d input and %d output tokens (%v); want at least %d and %d",
					e.Actual.InputTokens, e.Actual.OutputTokens, e.ActualCost, in, out)
			}
		})
	}
}

// TestSettleAnswerAtkReportWithoutACount: TestBillAtkReportWithoutACount
// through the reserve API, settled with the upstream's raw answer: one
// without input_tokens is charged the prompt the reservation counted, one
// without its output count cannot be read (400 invalid_response), rather
// than one of no tokens.
func TestSettleAnswerAtkReportWithoutACount(t *testing.T) {
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits})
	const acme = "cg-test-acme"
	body := `{"model":"claude-haiku-4-5","max_tokens":4000,"messages":[{"role":"user","content":"` + strings.Repeat("hello world ", 500) + `"}]}`
	message := func(u string) string {
		return `{"id":"m","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"Hi"}],"usage":` + u + `}`
	}
	est := estimator(t)
	e, err := est.Estimate(costmodel.AnthropicMessages, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := est.Cost("claude-haiku-4-5", costmodel.Usage{InputTokens: e.Usage.InputTokens, OutputTokens: 10})
	for _, c := range []struct {
		name, answer string
		code         int
	}{
		{"no-input", message(`{"output_tokens":10}`), http.StatusOK},
		{"zero-input", message(`{"input_tokens":0,"output_tokens":10}`), http.StatusOK},
		{"no-output", message(`{"input_tokens":1000}`), http.StatusBadRequest},
		{"null-output", message(`{"input_tokens":1000,"output_tokens":null}`), http.StatusBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := reserveOn(t, s, acme, `{"kind":"anthropic_messages","body":`+body+`}`)
			code, out := reserveCall(t, s.srv.Handler(), acme, "/v1/costgate/settle",
				fmt.Sprintf(`{"reservation_id":%q,"kind":"anthropic_messages","response":%s}`, id, c.answer))
			if code != c.code {
				t.Fatalf("settle: %d %v; want %d", code, out, c.code)
			}
			if code != http.StatusOK {
				return
			}
			if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) < want {
				t.Errorf("charged %v; the prompt and the output reported cost %v", costmodel.NanoUSD(got), want)
			}
		})
	}
}

// TestBillAtkReasoningStreamReportWithoutOutput: a stream of a request
// whose output holds what a stream does not show (a reasoning model's
// hidden tokens, Claude's thinking), whose final report states no output,
// was charged the text it carried: o3-mini's reasoning, billed as output,
// was off the bill. What must hold: it is charged as a stream whose usage
// cannot be read, at its output limit.
func TestBillAtkReasoningStreamReportWithoutOutput(t *testing.T) {
	const limit = 4000
	var (
		chat  = fmt.Sprintf(`{"model":"o3-mini","max_completion_tokens":%d,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, limit)
		anth  = fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":%d,"thinking":{"type":"enabled","budget_tokens":2048},"stream":true,"messages":[{"role":"user","content":"hi"}]}`, limit)
		resp  = fmt.Sprintf(`{"model":"o3-mini","max_output_tokens":%d,"stream":true,"input":"hi"}`, limit)
		event = func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	)
	for _, c := range []struct{ name, path, body, answer string }{
		{"chat", "/v1/chat/completions", chat,
			`data: {"id":"c","object":"chat.completion.chunk","model":"o3-mini","choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n" +
				`data: {"id":"c","object":"chat.completion.chunk","model":"o3-mini","choices":[],"usage":{"prompt_tokens":9}}` + "\n\ndata: [DONE]\n\n"},
		{"anthropic", "/v1/messages", anth,
			event("message_start", `{"type":"message_start","message":{"id":"m","model":"claude-sonnet-4-5","usage":{"input_tokens":9,"output_tokens":1}}}`) +
				event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`) +
				event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{}}`) + event("message_stop", `{"type":"message_stop"}`)},
		{"anthropic-zero-output", "/v1/messages", anth,
			event("message_start", `{"type":"message_start","message":{"id":"m","model":"claude-sonnet-4-5","usage":{"input_tokens":9,"output_tokens":1}}}`) +
				event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`) +
				event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":0,"iterations":[{"type":"message","output_tokens":0}]}}`) + event("message_stop", `{"type":"message_stop"}`)},
		{"responses", "/v1/responses", resp,
			`data: {"type":"response.output_text.delta","delta":"Hi"}` + "\n\n" +
				`data: {"type":"response.completed","response":{"id":"r","model":"o3-mini","status":"completed","usage":{"input_tokens":9,"output_tokens":0}}}` + "\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, c.answer)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, c.path, c.body, nil)
			if e.Actual.OutputTokens < limit {
				t.Errorf("charged %d output tokens (%v); its report states none, and it may have reasoned up to its limit, %d",
					e.Actual.OutputTokens, e.ActualCost, limit)
			}
		})
	}
}
