package costmodel

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/png"
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

// An inline image is priced from the size in its header: (w×h)/750 after
// scaling the long edge to 1568, at most anthropicImageMax.
func TestAnthropicImageTokens(t *testing.T) {
	pngB64 := func(w, h int) string {
		t.Helper()
		var buf bytes.Buffer
		if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
			t.Fatal(err)
		}
		return base64.StdEncoding.EncodeToString(buf.Bytes())
	}
	cases := []struct {
		name string
		src  *anthropicSource
		want int64
	}{
		{"no source", nil, anthropicImageMax},
		{"url", &anthropicSource{Type: "url"}, anthropicImageMax},
		{"small png", &anthropicSource{Type: "base64", MediaType: "image/png", Data: pngB64(300, 200)}, 80},
		{"wide png, scaled", &anthropicSource{Type: "base64", MediaType: "image/png", Data: pngB64(3136, 100)}, 105},
		{"large png, capped", &anthropicSource{Type: "base64", MediaType: "image/png", Data: pngB64(1500, 1500)}, anthropicImageMax},
		{"not an image", &anthropicSource{Type: "base64", MediaType: "image/png", Data: "aGVsbG8gd29ybGQ="}, anthropicImageMax},
	}
	for _, c := range cases {
		if got, _ := anthropicImageTokens(c.src); got != c.want {
			t.Errorf("%s: %d tokens, want %d", c.name, got, c.want)
		}
	}
}
