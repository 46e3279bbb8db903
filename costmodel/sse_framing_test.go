package costmodel

import (
	"strings"
	"testing"
)

// TestSSEFramingEverySplit feeds one OpenAI stream, framed in the ways the SSE
// specification allows, to the meter in every split, and wants the usage
// report each time.
func TestSSEFramingEverySplit(t *testing.T) {
	e, err := NewEstimator(Config{})
	if err != nil {
		t.Fatal(err)
	}
	chunk := `{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"hi"}}]}`
	usage := `{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":4000}}`
	for _, c := range []struct{ name, stream string }{
		{"lf", "data: " + chunk + "\n\ndata: " + usage + "\n\ndata: [DONE]\n\n"},
		{"crlf", "data: " + chunk + "\r\n\r\ndata: " + usage + "\r\n\r\ndata: [DONE]\r\n\r\n"},
		{"cr", "data: " + chunk + "\r\rdata: " + usage + "\r\rdata: [DONE]\r\r"},
		{"nospace+comment", ": keep-alive\n\ndata:" + chunk + "\n\n: ping\ndata:" + usage + "\n\n"},
		{"multiline", "data: " + chunk + "\n\ndata: {\"id\":\"c\",\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4000}}\n\n"},
		{"done-first", "data: " + chunk + "\n\ndata: [DONE]\n\ndata: " + usage + "\n\n"},
		{"event-field", "event: chunk\nid: 1\ndata: " + chunk + "\n\nretry: 10\ndata: " + usage + "\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for cut := 0; cut <= len(c.stream); cut++ {
				m := e.NewStreamMeter(ChatCompletions, "gpt-4o-mini")
				m.Write([]byte(c.stream[:cut]))
				m.Write([]byte(c.stream[cut:]))
				u, rep := m.Usage()
				if !rep || u.OutputTokens != 4000 || u.InputTokens != 10 {
					t.Fatalf("cut at %d (%q): usage %+v reported %v; want 10/4000", cut, strings.TrimSpace(c.stream[:min(cut, 20)]), u, rep)
				}
			}
		})
	}
}

// TestStreamOptionsSpelledExactly: stream_options.include_usage is read
// alike for chat and completions, spelled exactly: a case variant
// ("INCLUDE_USAGE", which encoding/json would take for it and the
// upstream would not) or the field twice is refused, so that costgate
// never takes a report as asked that the upstream will not send.
func TestStreamOptionsSpelledExactly(t *testing.T) {
	e, err := NewEstimator(Config{})
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[Kind]string{
		ChatCompletions: `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":%s}`,
		Completions:     `{"model":"gpt-3.5-turbo-instruct","prompt":"hi","stream":true,"stream_options":%s}`,
	}
	for k, tmpl := range bodies {
		for opt, want := range map[string]string{
			`{"include_usage":true}`:                       "asked",
			`{"include_usage":false}`:                      "not asked",
			`null`:                                         "not asked",
			`{"continuous_usage_stats":true}`:              "not asked",
			`{"INCLUDE_USAGE":true}`:                       "refused",
			`{"Include_Usage":true}`:                       "refused",
			`{"include_usage":true,"include_usage":false}`: "refused",
			`{"include_usage":false,"include_usage":true}`: "refused",
		} {
			est, err := e.Estimate(k, []byte(strings.Replace(tmpl, "%s", opt, 1)))
			got := "not asked"
			switch {
			case err != nil:
				got = "refused"
			case est.StreamUsage:
				got = "asked"
			}
			if got != want {
				t.Errorf("%v stream_options %s: %s (%v), want %s", k, opt, got, err, want)
			}
		}
	}
}
