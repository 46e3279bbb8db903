package proxy_test

// Attacks of a tenant who makes the upstream's usage report unreadable to
// the stream meter while it still gets its answer: each test drives
// costgate on loopback in front of a stub upstream that streams what the
// Responses API streams, and compares the ledger with what the upstream
// billed.

import (
	"encoding/json"
	"fmt"
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
	}{
		{"reasoning", "o3", false},
		{"plain", "gpt-4.1", false},
		{"unreadable", "o3", true},
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
			s := newStackWith(t, stackOptions{policies: allowAll, extra: "\ncosts:\n  output_reserve: 10\n" + roomyLimits, upstream: up})
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
