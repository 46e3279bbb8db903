package costmodel

import (
	"strings"
	"testing"
)

// TestReservedCallsSaturate: the counts a body gives for what the upstream
// adds to a prompt (max_tool_calls, max_uses, max_content_tokens), at
// int64's end or past it, never wrap a reservation small: the estimate is
// refused, or saturates at a cost no budget admits. Negative counts take
// the defaults, as absent ones do.
func TestReservedCallsSaturate(t *testing.T) {
	e := estimatorWith(t, Config{})
	const max = "9223372036854775807"
	cases := []struct {
		name string
		kind Kind
		body string
	}{
		{"responses max_tool_calls", Responses, `{"model":"gpt-4.1-mini","input":"hi","max_tool_calls":` + max + `,"tools":[{"type":"web_search"},{"type":"file_search","vector_store_ids":["vs"]}]}`},
		{"anthropic web_search max_uses", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":` + max + `}]}`},
		{"anthropic web_fetch max_content_tokens", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"web_fetch_20250910","name":"web_fetch","max_uses":` + max + `,"max_content_tokens":` + max + `}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			est, err := e.Estimate(c.kind, []byte(c.body))
			if err == nil && est.Cost < NanoUSD(1)<<52 {
				t.Errorf("estimate %v for %s; want a refusal or a saturated cost", est.Cost, c.name)
			}
			neg := strings.Replace(c.body, max, "-5", -1)
			low, err := e.Estimate(c.kind, []byte(neg))
			if err != nil || low.Cost <= 0 {
				t.Errorf("negative counts: %v %v; want the defaults' reservation", low.Cost, err)
			}
		})
	}
}
