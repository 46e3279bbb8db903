package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkAnthropicAdvisor: a tenant asks claude-haiku-4-5 with
// Anthropic's advisor tool naming claude-opus-4-6 (anthropic-beta:
// advisor-tool-2026-03-01). The upstream runs the advisor's
// sub-inference on Opus in the middle of the request and bills it at
// Opus's price; its usage lists the steps in iterations, each with its
// model. costgate priced every token at Haiku's price: $0.069 for the
// $0.265 billed, plain or streamed.
func TestBillAtkAnthropicAdvisor(t *testing.T) {
	const (
		req        = `{"model":"claude-haiku-4-5","max_tokens":4096,"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}],%s"messages":[{"role":"user","content":"Plan the migration."}]}`
		iterations = `"iterations":[` +
			`{"type":"message","model":"claude-haiku-4-5-20251001","input_tokens":6000,"output_tokens":300},` +
			`{"type":"advisor_message","model":"claude-opus-4-6","input_tokens":40000,"output_tokens":1800},` +
			`{"type":"message","model":"claude-haiku-4-5-20251001","input_tokens":4000,"output_tokens":1700}]`
		plain  = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5-20251001","content":[{"type":"text","text":"Done."}],"stop_reason":"end_turn","usage":{"input_tokens":10000,"output_tokens":2000,` + iterations + `}}`
		stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-haiku-4-5-20251001\",\"content\":[],\"usage\":{\"input_tokens\":6000,\"output_tokens\":1}}}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Done.\"}}\n\n" +
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":10000,\"output_tokens\":2000," + iterations + "}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	)
	prices := costmodel.BuiltinPrices()
	want := prices["claude-haiku-4-5"].Cost(costmodel.Usage{InputTokens: 10000, OutputTokens: 2000}) +
		prices["claude-opus-4-6"].Cost(costmodel.Usage{InputTokens: 40000, OutputTokens: 1800})
	for _, c := range []struct{ name, field, answer, ct string }{
		{"plain", "", plain, "application/json"},
		{"stream", `"stream":true,`, stream, "text/event-stream"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
				if !strings.Contains(string(body), "advisor_20260301") {
					http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"no advisor tool"}}`, http.StatusBadRequest)
					return
				}
				w.Header().Set("Content-Type", c.ct)
				io.WriteString(w, c.answer)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, "/v1/messages", strings.Replace(req, "%s", c.field, 1), map[string]string{"Anthropic-Beta": "advisor-tool-2026-03-01", "Anthropic-Version": "2023-06-01"})
			if e.ActualCost != want {
				t.Errorf("charged $%.6f (status %s, %d input and %d output tokens); the upstream billed $%.6f",
					float64(e.ActualCost)/1e9, e.Status, e.Actual.InputTokens, e.Actual.OutputTokens, float64(want)/1e9)
			}
		})
	}
}
