package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkAnthropicCompaction: a tenant turns on Anthropic's
// server-side compaction (anthropic-beta: compact-2026-01-12 and
// context_management's compact_20260112, both forwarded as sent). The
// upstream summarizes the conversation in a sampling step of its own
// before the answer and bills it, 150,000 input and 3,000 output tokens;
// its usage reports the step in iterations, and its top-level counts
// (12,000 and 1,000) leave it out. costgate charged the top-level
// counts: $0.085 at claude-opus-4-6 for the $0.91 billed, plain or
// streamed.
func TestBillAtkAnthropicCompaction(t *testing.T) {
	const (
		req        = `{"model":"claude-opus-4-6","max_tokens":4096,"context_management":{"edits":[{"type":"compact_20260112","trigger":{"type":"input_tokens","value":50000}}]},%s"messages":[{"role":"user","content":"Go on."}]}`
		iterations = `"iterations":[{"type":"compaction","input_tokens":150000,"output_tokens":3000},{"type":"message","input_tokens":12000,"output_tokens":1000}]`
		plain      = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-4-6","content":[{"type":"compaction","content":"Summary."},{"type":"text","text":"Done."}],"stop_reason":"end_turn","usage":{"input_tokens":12000,"output_tokens":1000,` + iterations + `}}`
		stream     = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-opus-4-6\",\"content\":[],\"usage\":{\"input_tokens\":12000,\"output_tokens\":1}}}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"compaction\",\"content\":\"\"}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"compaction_delta\",\"content\":\"Summary.\"}}\n\n" +
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1000," + iterations + "}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	)
	billed := costmodel.Usage{InputTokens: 162000, OutputTokens: 4000}
	for _, c := range []struct{ name, field, answer, ct string }{
		{"plain", "", plain, "application/json"},
		{"stream", `"stream":true,`, stream, "text/event-stream"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
				if !strings.Contains(r.Header.Get("Anthropic-Beta"), "compact-2026-01-12") || !strings.Contains(string(body), "compact_20260112") {
					http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"compaction not asked for"}}`, http.StatusBadRequest)
					return
				}
				w.Header().Set("Content-Type", c.ct)
				io.WriteString(w, c.answer)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, "/v1/messages", strings.Replace(req, "%s", c.field, 1), map[string]string{"Anthropic-Beta": "compact-2026-01-12", "Anthropic-Version": "2023-06-01"})
			want := costmodel.BuiltinPrices()["claude-opus-4-6"].Cost(billed)
			if e.Actual.InputTokens < billed.InputTokens || e.Actual.OutputTokens < billed.OutputTokens || e.ActualCost < want {
				t.Errorf("charged %d input and %d output tokens, %v (status %s); the upstream billed %d and %d, %v",
					e.Actual.InputTokens, e.Actual.OutputTokens, e.ActualCost, e.Status, billed.InputTokens, billed.OutputTokens, want)
			}
		})
	}
}
