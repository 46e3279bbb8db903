package proxy_test

// Attacks of a tenant who makes the upstream's usage report unreadable to
// the stream meter while it still gets its answer: each test drives
// costgate on loopback in front of a stub upstream that streams what the
// Responses API streams, and compares the ledger with what the upstream
// billed.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestStreamAtkOverlongCompletedEvent: a Responses stream's
// response.completed event echoes the request's instructions and tools, so
// a tenant whose instructions are over 1 MiB pushes that event, and the
// usage report in it, past the longest line the stream meter keeps. The
// answer still reaches the client whole. For a reasoning model, whose
// hidden reasoning no text shows, with output_reserve 10, the request
// must not be billed the text counted or a tenth of its output limit: the
// upstream billed 15,000 reasoning tokens.
func TestStreamAtkOverlongCompletedEvent(t *testing.T) {
	const reasoning = 15000
	for _, c := range []struct {
		name, model string
		split       bool // the event's data in two lines, which the meter cannot read
		guard       bool // the stream guard on
	}{
		{"reasoning", "o3", false, false},
		{"plain", "gpt-4.1", false, false},
		{"unreadable", "o3", true, false},
		{"guarded", "gpt-4.1", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
				var req struct {
					Instructions string `json:"instructions"`
				}
				json.Unmarshal(body, &req)
				ins, _ := json.Marshal(req.Instructions)
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"model\":%q,\"status\":\"in_progress\",\"instructions\":%s,\"usage\":null}}\n\n", c.model, ins)
				fmt.Fprint(w, streamAtkResponsesEvent("response.output_text.delta", "ok"))
				sep := ""
				if c.split {
					sep = "\ndata: "
				}
				fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"model\":%q,\"status\":\"completed\",\"instructions\":%s,"+sep+"\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"ok\"}]}],\"usage\":{\"input_tokens\":300000,\"output_tokens\":%d,\"output_tokens_details\":{\"reasoning_tokens\":%d},\"total_tokens\":%d}}}\n\n",
					c.model, ins, reasoning+1, reasoning, 300000+reasoning+1)
			}}
			extra := "\ncosts:\n  output_reserve: 10\n" + roomyLimits
			if c.guard {
				extra = guardConfigCosts("  output_reserve: 10\n", "100", 16)
			}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: extra, upstream: up})
			ins, _ := json.Marshal(strings.Repeat("hello world ", 100_000)) // 1.2 MB
			e, got := oneEntry(t, s, "/v1/responses", fmt.Sprintf(`{"model":%q,"stream":true,"max_output_tokens":20000,"instructions":%s,"input":"think hard"}`, c.model, ins), nil)
			if !strings.Contains(string(got), `"usage":{"input_tokens":300000`) {
				t.Fatalf("the client did not get the completed event")
			}
			t.Logf("billed %d output tokens (%v); the upstream billed %d", e.Actual.OutputTokens, e.ActualCost, reasoning+1)
			if e.Actual.OutputTokens < reasoning+1 {
				t.Errorf("billed %d output tokens; the upstream's report, in an event the client got, billed %d", e.Actual.OutputTokens, reasoning+1)
			}
		})
	}
}

// TestStreamAtkBackgroundZeroUsage: a background Responses request is
// answered at once, queued or in progress, and the upstream bills its
// run later. An answer that states its usage as zeros rather than null
// (the run has produced nothing yet) is no report of that run: the
// request is charged its output limit, as one answered with null usage.
func TestStreamAtkBackgroundZeroUsage(t *testing.T) {
	for _, status := range []string{"queued", "in_progress"} {
		t.Run(status, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"resp_1","object":"response","status":%q,"background":true,"model":"o3-2025-04-16","output":[],"usage":{"input_tokens":0,"output_tokens":0,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":0}}`, status)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: "\ncosts:\n  output_reserve: 10\n" + roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, "/v1/responses", `{"model":"o3","background":true,"max_output_tokens":20000,"input":"think hard"}`, nil)
			if e.Actual.OutputTokens < 20000 || e.Actual.InputTokens == 0 {
				t.Errorf("charged %+v (%v); the %s run may bill up to 20000 output tokens", e.Actual, e.ActualCost, status)
			}
		})
	}
}

// TestStreamAtkRunningReportThenCut: a stream of a request whose output
// costgate cannot count (a reasoning model's hidden reasoning) that is cut
// before its final report is charged its output limit; one that carried a
// running usage report first (an OpenAI-compatible chunk with choices and
// usage, as continuous_usage_stats asks; Anthropic's message_delta) is cut
// before its final report too, and is charged no less.
func TestStreamAtkRunningReportThenCut(t *testing.T) {
	for _, c := range []struct{ name, path, body, head, more string }{
		{"openai-running", "/v1/chat/completions", `{"model":"o3","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_completion_tokens":8000,"messages":[{"role":"user","content":"think hard"}]}`,
			`data: {"id":"c","object":"chat.completion.chunk","model":"o3","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":1}}` + "\n\n",
			`data: {"id":"c","object":"chat.completion.chunk","model":"o3","choices":[{"index":0,"delta":{"content":" more"}}]}` + "\n\n"},
		{"anthropic-thinking", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":8000,"stream":true,"thinking":{"type":"enabled","budget_tokens":4000},"messages":[{"role":"user","content":"think hard"}]}`,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":2}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\" more\"}}\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, c.head)
				io.WriteString(w, strings.Repeat(c.more, 1000))
				// The upstream's connection breaks here: no final report.
				panic(http.ErrAbortHandler)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: "\ncosts:\n  output_reserve: 10\n" + roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, c.path, c.body, nil)
			t.Logf("billed %d output tokens (%v)", e.Actual.OutputTokens, e.ActualCost)
			if e.Actual.OutputTokens < 8000 {
				t.Errorf("billed %d output tokens; a cut stream of a request with hidden reasoning is charged its output limit, 8000", e.Actual.OutputTokens)
			}
		})
	}
}

// TestStreamAtkDeepEchoedTool: a Responses stream's response.completed
// echoes the request's tools one level deeper than the request holds
// them, so a tool whose schema nests as deep as costgate reads a request
// makes the event deeper than its stream meter's scanner reads. The usage
// report in it is still read; and a stream with an event the meter could
// not read and no report is charged the reservation with its output limit.
func TestStreamAtkDeepEchoedTool(t *testing.T) {
	const reasoning = 15000
	const depth = 995 // the deepest such schema costgate estimates
	for _, c := range []struct {
		name   string
		report string
	}{
		{"read", fmt.Sprintf(`{"input_tokens":50,"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":%d},"total_tokens":%d}`, reasoning+1, reasoning, reasoning+51)},
		{"garbled", fmt.Sprintf(`{"input_tokens":50,"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":%d},"total_tokens":%d,}`, reasoning+1, reasoning, reasoning+51)},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
				var req struct {
					Tools json.RawMessage `json:"tools"`
				}
				if err := json.Unmarshal(body, &req); err != nil {
					t.Errorf("upstream: %v", err)
				}
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"model\":\"o3\",\"status\":\"in_progress\",\"usage\":null}}\n\n")
				fmt.Fprint(w, streamAtkResponsesEvent("response.output_text.delta", "ok"))
				fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"model\":\"o3\",\"status\":\"completed\",\"tools\":%s,\"usage\":%s}}\n\n", req.Tools, c.report)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: "\ncosts:\n  output_reserve: 10\n" + roomyLimits, upstream: up})
			schema := strings.Repeat(`{"a":`, depth) + `1` + strings.Repeat(`}`, depth)
			e, got := oneEntry(t, s, "/v1/responses", `{"model":"o3","stream":true,"max_output_tokens":20000,"input":"think hard","tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":`+schema+`}}}]}`, nil)
			if !strings.Contains(string(got), `"usage":{"input_tokens":50`) {
				t.Fatalf("the client did not get the completed event: %.300s", got)
			}
			t.Logf("billed %d output tokens (%v); the upstream billed %d", e.Actual.OutputTokens, e.ActualCost, reasoning+1)
			if e.Actual.OutputTokens < reasoning+1 {
				t.Errorf("billed %d output tokens; the upstream's report, in an event the client got, billed %d", e.Actual.OutputTokens, reasoning+1)
			}
		})
	}
}
