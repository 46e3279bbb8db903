package proxy_test

// Attacks with output an upstream streams after its stream's terminal
// event ([DONE], Anthropic's message_stop, a Responses stream's
// response.completed). The stream's final report came before it, so the
// request is settled on that report and the guard lets everything after
// it through: a client that reads on (the Anthropic SDKs do, as does the
// OpenAI SDKs' Responses stream; a raw client always) would get output
// that is neither guarded nor billed.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestStreamEndAttackOutputAfterEnd: on each of the four streamed routes,
// with the guard on (a $0.01 budget) and off, the upstream streams three
// tokens, its report of them and its terminal event, then 10,000 tokens
// more. Must hold: nothing after the terminal event reaches the client,
// and the ledger bills at least what it got.
func TestStreamEndAttackOutputAfterEnd(t *testing.T) {
	const after = 10_000
	chat := func(delta string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"` + delta + `"},"finish_reason":null}]}` + "\n\n"
	}
	text := func(delta string) string {
		return `data: {"id":"c","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"index":0,"text":"` + delta + `","finish_reason":null}]}` + "\n\n"
	}
	anthropic := func(delta string) string {
		return "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + delta + "\"}}\n\n"
	}
	responses := func(delta string) string { return gkResponsesEvent("response.output_text.delta", delta) }
	cases := []struct {
		name, path, body string
		delta            func(string) string
		start, end       string
	}{
		{"chat", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"max_tokens":16000,"messages":[{"role":"user","content":"write"}]}`, chat, "",
			`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":3,"total_tokens":11}}` + "\n\ndata: [DONE]\n\n"},
		{"completions", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","stream":true,"max_tokens":3000,"prompt":"write"}`, text, "",
			`data: {"id":"c","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}}` + "\n\ndata: [DONE]\n\n"},
		{"responses", "/v1/responses", `{"model":"gpt-4.1-mini","stream":true,"max_output_tokens":30000,"input":"write"}`, responses, gkResponsesCreated,
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"object\":\"response\",\"model\":\"gpt-4.1-mini\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":8,\"output_tokens\":3,\"total_tokens\":11}}}\n\n"},
		{"messages", "/v1/messages", `{"model":"claude-haiku-4-5","stream":true,"max_tokens":30000,"messages":[{"role":"user","content":"write"}]}`, anthropic,
			gkAnthropicStart + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	}
	for _, guard := range []bool{true, false} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/guard=%v", c.name, guard), func(t *testing.T) {
				extra := guardConfig("0.01", gkInc)
				if !guard {
					extra = strings.Replace(extra, "enabled: true", "enabled: false", 1)
				}
				up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
					w.Header().Set("Content-Type", "text/event-stream")
					e := &gkEmit{w: w, r: r}
					e.send(c.start)
					for range 3 {
						e.send(c.delta(" word"))
					}
					e.send(c.end)
					for range after {
						if !e.send(c.delta(" after")) {
							return
						}
					}
				}}
				s := newStackWith(t, stackOptions{policies: allowAll, extra: extra, upstream: up})
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				resp := s.post(t, ctx, c.path, c.body)
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d, %v: %.300s", resp.StatusCode, err, got)
				}
				e := s.settled(t, 1)[0]
				shown := int64(bytes.Count(got, []byte(" word")) + bytes.Count(got, []byte(" after")))
				t.Logf("client got %d output tokens; ledger: %d output tokens, %v", shown, e.Actual.OutputTokens, e.ActualCost)
				if n := bytes.Count(got, []byte(" after")); n > 0 {
					t.Errorf("the client got %d events after the stream's terminal event", n)
				}
				if e.Actual.OutputTokens < shown {
					t.Errorf("billed %d output tokens; the client got %d", e.Actual.OutputTokens, shown)
				}
			})
		}
	}
}
