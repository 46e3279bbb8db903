package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkPriorityTierUnreported: a request that asks for the
// "priority" service tier (billed at up to twice the standard rates) whose
// answer names no tier was charged the standard rates: through the proxy,
// plain or streamed, and through the reserve API settled with that answer;
// so was an Anthropic request for US-only inference (110%) whose answer
// names no inference_geo. What must hold: it is charged the tier or the
// geography it asked for, as the speed asked for is, unless the answer
// names the one that served it.
func TestBillAtkPriorityTierUnreported(t *testing.T) {
	const (
		chat   = `{"model":"gpt-4o","service_tier":"priority","max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}`
		chatS  = `{"model":"gpt-4o","service_tier":"priority","max_tokens":2000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
		resp   = `{"model":"gpt-4o","service_tier":"priority","max_output_tokens":2000,"input":"hi"}`
		counts = `{"prompt_tokens":1000,"completion_tokens":1000}`
	)
	answer := func(tier string) string {
		return `{"id":"c","object":"chat.completion","model":"gpt-4o",` + tier + `"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":` + counts + `}`
	}
	est := estimator(t)
	u := costmodel.Usage{InputTokens: 1000, OutputTokens: 1000}
	standard := est.Cost("gpt-4o", u)
	u.ServiceTier = "priority"
	priority := est.Cost("gpt-4o", u)
	for _, c := range []struct {
		name, path, body, answer string
		want                     costmodel.NanoUSD
	}{
		{"chat", "/v1/chat/completions", chat, answer(""), priority},
		{"chat-served-default", "/v1/chat/completions", chat, answer(`"service_tier":"default",`), standard},
		{"chat-stream", "/v1/chat/completions", chatS,
			`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n" +
				`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o","choices":[],"usage":` + counts + "}\n\ndata: [DONE]\n\n", priority},
		{"responses", "/v1/responses", resp,
			`{"id":"r","object":"response","status":"completed","model":"gpt-4o","output":[],"usage":{"input_tokens":1000,"output_tokens":1000}}`, priority},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				ct := "application/json"
				if c.body == chatS {
					ct = "text/event-stream"
				}
				w.Header().Set("Content-Type", ct)
				io.WriteString(w, c.answer)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, c.path, c.body, nil)
			if e.ActualCost != c.want {
				t.Errorf("charged %v (tier %q); want %v", e.ActualCost, e.Actual.ServiceTier, c.want)
			}
		})
	}
	t.Run("anthropic-us-inference", func(t *testing.T) {
		const body = `{"model":"claude-opus-4-6","inference_geo":"us","max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}`
		for _, c := range []struct {
			name, geo string
			want      costmodel.Usage
		}{
			{"unreported", "", costmodel.Usage{InputTokens: 1000, OutputTokens: 1000, InferenceGeo: "us"}},
			{"served-global", `,"inference_geo":"global"`, costmodel.Usage{InputTokens: 1000, OutputTokens: 1000}},
		} {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id":"m","type":"message","role":"assistant","model":"claude-opus-4-6","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":1000,"output_tokens":1000`+c.geo+`}}`)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, _ := oneEntry(t, s, "/v1/messages", body, nil)
			if want := est.Cost("claude-opus-4-6", c.want); e.ActualCost != want {
				t.Errorf("%s: charged %v (inference_geo %q); want %v", c.name, e.ActualCost, e.Actual.InferenceGeo, want)
			}
		}
	})
	t.Run("settle", func(t *testing.T) {
		s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits})
		const acme = "cg-test-acme"
		for _, c := range []struct {
			name, settle string
			want         costmodel.NanoUSD
		}{
			{"its answer", `"kind":"chat_completions","response":` + answer(""), priority},
			{"its answer, served default", `"kind":"chat_completions","response":` + answer(`"service_tier":"default",`), standard},
			{"its counts", `"usage":{"input_tokens":1000,"output_tokens":1000}`, priority},
		} {
			id := reserveOn(t, s, acme, `{"kind":"chat_completions","body":`+chat+`}`)
			code, out := reserveCall(t, s.srv.Handler(), acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,%s}`, id, c.settle))
			if code != http.StatusOK {
				t.Fatalf("settle with %s: %d %v", c.name, code, out)
			}
			if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) != c.want {
				t.Errorf("settled with %s: charged %v; want %v", c.name, costmodel.NanoUSD(got), c.want)
			}
		}
	})
}
