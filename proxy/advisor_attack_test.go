package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"

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

// TestPolicyAtkAdvisorRunsAnotherModel: a policy keeps a plan off
// claude-opus-4-6 by its model. A tenant asks claude-haiku-4-5 with an
// advisor tool, or fallbacks, naming Opus: the policy saw only
// request.model, and the upstream ran Opus for it. The models a request
// may run besides its own are request.other_models, by their canonical
// names, and the policy that reads them refuses it.
func TestPolicyAtkAdvisorRunsAnotherModel(t *testing.T) {
	pols := fstest.MapFS{"no_opus.rego": {Data: []byte(`package costgate.policies.no_opus

opus(m) if startswith(m, "claude-opus")

decision := {"outcome": "hard", "status": 403, "reason": "no Opus on this plan"} if {
	some m in array.concat([input.request.model], input.request.other_models)
	opus(m)
}
`)}}
	var served atomic.Int64
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":2}}`)
	}}
	s := newStackWith(t, stackOptions{policies: pols, extra: roomyLimits, upstream: up})
	const msgs = `"messages":[{"role":"user","content":"Plan it."}]`
	for _, c := range []struct {
		name, body string
		status     int
	}{
		{"haiku alone", `{"model":"claude-haiku-4-5","max_tokens":100,` + msgs + `}`, 200},
		{"an opus advisor", `{"model":"claude-haiku-4-5","max_tokens":100,"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}],` + msgs + `}`, 403},
		{"an opus advisor by its dated name", `{"model":"claude-haiku-4-5","max_tokens":100,"tools":[{"type":"advisor_20260301","name":"advisor","model":"Claude-Opus-4-5-20251101"}],` + msgs + `}`, 403},
		{"an opus fallback", `{"model":"claude-haiku-4-5","max_tokens":100,"fallbacks":[{"model":"claude-opus-4-6"}],` + msgs + `}`, 403},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := served.Load()
			resp, body := frAtkSend(t, s, "/v1/messages", c.body, map[string]string{"Anthropic-Version": "2023-06-01"})
			if resp.StatusCode != c.status {
				t.Errorf("answered %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			if c.status != 200 && served.Load() != before {
				t.Errorf("the upstream served a request the policy refused")
			}
		})
	}
}
