package costmodel

import (
	"strings"
	"testing"
)

// TestStreamAtkContentParts: an OpenAI-compatible server streams a chat
// completion's delta text as an array of parts, not a string (content
// [{"type":"text","text":"..."}], a reasoning model's thinking parts
// nested in it, a refusal or reasoning in parts); the stream is cut
// before its usage report. The meter read content and refusal as strings
// only: such a chunk was malformed and counted nothing, so the guard let
// every one through. Must hold: the parts' text is counted, by Usage and
// by the guard, and no chunk is malformed.
func TestStreamAtkContentParts(t *testing.T) {
	e := newTestEstimator(t)
	for _, c := range []struct{ name, delta string }{
		{"content parts", `{"content":[{"type":"text","text":" word"}]}`},
		{"nested thinking parts", `{"content":[{"type":"thinking","thinking":[{"type":"text","text":" word"}]}]}`},
		{"content part object", `{"content":{"type":"text","text":" word"}}`},
		{"refusal parts", `{"refusal":[{"type":"text","text":" word"}]}`},
		{"reasoning parts", `{"reasoning_content":[{"type":"text","text":" word"}]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := e.NewStreamMeter(ChatCompletions, "gpt-4o-mini")
			chunk := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":` + c.delta + `}]}` + "\n\n"
			m.Write([]byte(strings.Repeat(chunk, 2000)))
			if out, above := m.OutputAbove(1000); !above {
				t.Errorf("the guard counts %d output tokens, not above 1000", out)
			}
			u, _ := m.Usage()
			if u.OutputTokens < 2000 {
				t.Errorf("counted %d output tokens; the stream carried 2000", u.OutputTokens)
			}
			if m.Malformed() != 0 {
				t.Errorf("%d chunks read as malformed", m.Malformed())
			}
		})
	}
}
