package costmodel

import (
	"strings"
	"testing"
)

// BenchmarkParseUsage reads the usage of a short and a long chat completion
// with ParseUsage (one scan, the usage member decoded) and with
// encoding/json alone, side by side:
//
//	go test -run XXX -bench ParseUsage -benchmem -count 5 ./costmodel/
func BenchmarkParseUsage(b *testing.B) {
	reply := func(content string) []byte {
		return []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":1764500000,"model":"gpt-4o-mini",` +
			`"choices":[{"index":0,"message":{"role":"assistant","content":"` + content + `"},"finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":14,"completion_tokens":9,"total_tokens":23}}`)
	}
	bodies := []struct {
		name string
		body []byte
	}{
		{"285B", reply("Hello! How can I help you today?")},
		{"8KiB", reply(strings.Repeat("Hello there, friend. ", 400))},
	}
	for _, c := range bodies {
		for _, p := range []struct {
			name string
			f    func(Kind, []byte) (Usage, error)
		}{{"costgate", ParseUsage}, {"encoding-json", parseUsage}} {
			b.Run(c.name+"/"+p.name, func(b *testing.B) {
				b.SetBytes(int64(len(c.body)))
				for b.Loop() {
					if _, err := p.f(ChatCompletions, c.body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
