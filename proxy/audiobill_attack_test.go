package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBillAtkAudioStreamWithoutReport: a chat stream with audio output
// carries it in delta.audio (base64 audio and its transcript), which the
// stream meter does not count. Such a stream that ends without its usage
// report (cut by the upstream's timeout, or from an upstream that does not
// send one) was billed the text it counted, none: 4,000 audio tokens
// served for nothing. It is billed at least what was reserved (the output
// limit, as audio), as any request with output costgate cannot count.
func TestBillAtkAudioStreamWithoutReport(t *testing.T) {
	const chunks = 4000
	chunk := `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini-audio-preview","choices":[{"index":0,"delta":{"audio":{"id":"a","transcript":" word","data":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}}],"usage":null}` + "\n\n"
	for _, c := range []struct {
		name    string
		timeout time.Duration
		end     func(w http.ResponseWriter)
	}{
		{"upstream-timeout", 400 * time.Millisecond, func(w http.ResponseWriter) {
			time.Sleep(time.Second) // still generating when costgate's timeout cuts it
			fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini-audio-preview","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":%d,"completion_tokens_details":{"audio_tokens":%d}}}`+"\n\ndata: [DONE]\n\n", 2*chunks, 2*chunks)
		}},
		{"no-report", 0, func(w http.ResponseWriter) {
			io.WriteString(w, "data: [DONE]\n\n") // an upstream that ignores stream_options
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				for range chunks {
					io.WriteString(w, chunk)
				}
				w.(http.Flusher).Flush()
				c.end(w)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up, upstreamTimeout: c.timeout})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := s.post(t, ctx, "/v1/chat/completions", fmt.Sprintf(`{"model":"gpt-4o-mini-audio-preview","stream":true,"modalities":["text","audio"],"audio":{"voice":"alloy","format":"pcm16"},"max_completion_tokens":%d,"messages":[{"role":"user","content":"read me a long story"}]}`, 2*chunks))
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			e := s.settled(t, 1)[0]
			t.Logf("ledger: %+v, %v (reserved %v)", e.Actual, e.ActualCost, e.EstimatedCost)
			if e.Actual.AudioOutputTokens < chunks || e.ActualCost < e.EstimatedCost {
				t.Errorf("billed %d output tokens (%d audio), %v; the stream carried %d audio tokens, and %v was reserved",
					e.Actual.OutputTokens, e.Actual.AudioOutputTokens, e.ActualCost, chunks, e.EstimatedCost)
			}
		})
	}
}

// TestBillAtkAnthropicServerToolStreamCut: an Anthropic request with a
// server tool other than web search and web fetch (code execution, tool
// search) has the upstream add content the request does not hold (the
// code's output, the tools it loads), which the upstream bills as input
// and the stream meter does not count. Its stream, cut by the upstream's
// timeout before message_delta's report, was billed message_start's 30
// input tokens and the text counted; it is billed at least what was
// reserved and its output limit, as a web search request is.
func TestBillAtkAnthropicServerToolStreamCut(t *testing.T) {
	for name, tool := range map[string]string{
		"code-execution": `{"type":"code_execution_20250825","name":"code_execution"}`,
		"tool-search":    `{"type":"tool_search_tool_regex_20251119","name":"tool_search_tool_regex"}`,
	} {
		t.Run(name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"usage\":{\"input_tokens\":30,\"output_tokens\":1}}}\n\n")
				io.WriteString(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"server_tool_use\",\"id\":\"s\",\"name\":\"bash_code_execution\",\"input\":{}}}\n\n")
				io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"command\\\":\\\"seq 1 20000\\\"}\"}}\n\n")
				io.WriteString(w, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
				// 20,000 lines of output: the model reads them, billed as input.
				io.WriteString(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"bash_code_execution_tool_result\",\"tool_use_id\":\"s\",\"content\":{\"type\":\"bash_code_execution_result\",\"stdout\":\""+strings.Repeat("12345\\n", 20000)+"\",\"stderr\":\"\",\"return_code\":0}}}\n\n")
				io.WriteString(w, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n")
				io.WriteString(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
				io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"text_delta\",\"text\":\"The sum is\"}}\n\n")
				w.(http.Flusher).Flush()
				time.Sleep(time.Second) // still working when costgate's timeout cuts it
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up, upstreamTimeout: 400 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := s.post(t, ctx, "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":2000,"stream":true,"tools":[`+tool+`],"messages":[{"role":"user","content":"print 1 to 20000, then sum them"}]}`)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			e := s.settled(t, 1)[0]
			t.Logf("ledger: %+v, %v (reserved %v)", e.Actual, e.ActualCost, e.EstimatedCost)
			if e.ActualCost < e.EstimatedCost || e.Actual.OutputTokens < 2000 {
				t.Errorf("billed %d input / %d output tokens, %v; reserved %v: the code's output, billed as input, was not counted",
					e.Actual.InputTokens, e.Actual.OutputTokens, e.ActualCost, e.EstimatedCost)
			}
		})
	}
}
