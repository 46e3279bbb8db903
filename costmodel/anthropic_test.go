package costmodel

import (
	"testing"
)

// Anthropic's count_tokens endpoint reported these input tokens for the
// examples of its token-counting documentation (also reproduced in
// LangChain's ChatAnthropic.get_num_tokens_from_messages reference, model
// claude-sonnet-4-5-20250929). The approximation must not count fewer
// (a reservation must cover the bill) and may count at most 10% more.
func TestAnthropicApprox(t *testing.T) {
	e := newTestEstimator(t)
	cases := []struct {
		name string
		body string
		api  int64
	}{
		{"basic", `{"model":"claude-sonnet-4-5-20250929","max_tokens":1,"system":"You are a scientist","messages":[{"role":"user","content":"Hello, Claude"}]}`, 14},
		{"tool", `{"model":"claude-sonnet-4-5-20250929","max_tokens":1,"tools":[{"name":"get_weather","description":"Get the current weather in a given location","input_schema":{"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"}},"required":["location"]}}],"messages":[{"role":"user","content":"What's the weather like in San Francisco?"}]}`, 403},
	}
	for _, c := range cases {
		est, err := e.Estimate(AnthropicMessages, []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		got := est.Usage.InputTokens
		t.Logf("%s: estimate %d, API %d (%+.1f%%)", c.name, got, c.api, float64(got-c.api)*100/float64(c.api))
		if got < c.api || got*10 > c.api*11 {
			t.Errorf("%s: estimate %d outside [%d, %d]", c.name, got, c.api, c.api*11/10)
		}
	}
}
