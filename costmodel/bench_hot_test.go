package costmodel

import (
	"strings"
	"sync/atomic"
	"testing"
)

// BenchmarkEstimateParallel estimates the 20-turn conversation of
// BenchmarkConversation from all CPUs at once, each request with a new last
// message, through one shared Estimator (its cache shards and locks under
// contention).
func BenchmarkEstimateParallel(b *testing.B) {
	prefix, newMsg := conversation(b)
	e, err := NewEstimator(Config{})
	if err != nil {
		b.Fatal(err)
	}
	var turn atomic.Int64
	b.ReportAllocs()
	start := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		var buf []byte
		for pb.Next() {
			buf = request(buf, prefix, newMsg, int(turn.Add(1)))
			if _, err := e.Estimate(ChatCompletions, buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportCPU(b, start)
}

// BenchmarkStreamMeter meters a chat stream of 500 content chunks (about
// 1,000 tokens) ending without a usage report, so that the text is counted.
func BenchmarkStreamMeter(b *testing.B) {
	e, err := NewEstimator(Config{})
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	words := strings.Fields(strings.Repeat("Streaming responses pass through the proxy chunk by chunk, and the meter counts them. ", 40))
	for i := 0; i < 500 && i < len(words); i++ {
		sb.WriteString(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" ` + words[i] + `"}}]}` + "\n\n")
	}
	stream := []byte(sb.String())
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	start := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m := e.NewStreamMeter(ChatCompletions, "gpt-4o")
			for i := 0; i < len(stream); i += 1400 { // network-sized writes
				m.Write(stream[i:min(i+1400, len(stream))])
			}
			if u, _ := m.Usage(); u.OutputTokens == 0 {
				b.Error("nothing counted")
				return
			}
		}
	})
	reportCPU(b, start)
}

// toolsSchema is a function's parameters as SDKs generate them for a
// typed model (strict mode: required and additionalProperties, nested
// objects, arrays, enums, anyOf for an optional field).
const toolsSchema = `{"type":"object","properties":{` +
	`"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},` +
	`"unit":{"type":"string","description":"The unit of temperature to return","enum":["celsius","fahrenheit"]},` +
	`"days":{"type":"array","description":"Days to forecast","items":{"type":"object","properties":{"date":{"type":"string","description":"ISO date"},"hourly":{"type":"boolean"}},"required":["date","hourly"],"additionalProperties":false}},` +
	`"note":{"anyOf":[{"type":"string"},{"type":"null"}],"description":"An optional note"}},` +
	`"required":["location","unit","days","note"],"additionalProperties":false}`

// BenchmarkTools estimates a short request with three function tools on
// each API: chat completions and Anthropic count them through the count
// cache, Responses on every request.
func BenchmarkTools(b *testing.B) {
	var chat, responses, anthropic []string
	for _, name := range []string{"get_weather", "get_forecast", "get_alerts"} {
		chat = append(chat, `{"type":"function","function":{"name":"`+name+`","description":"Get the weather","strict":true,"parameters":`+toolsSchema+`}}`)
		responses = append(responses, `{"type":"function","name":"`+name+`","description":"Get the weather","strict":true,"parameters":`+toolsSchema+`}`)
		anthropic = append(anthropic, `{"name":"`+name+`","description":"Get the weather","input_schema":`+toolsSchema+`}`)
	}
	for _, c := range []struct {
		kind Kind
		body string
	}{
		{ChatCompletions, `{"model":"gpt-4.1","messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[` + strings.Join(chat, ",") + `]}`},
		{Responses, `{"model":"gpt-4.1","input":"Weather in Paris?","tools":[` + strings.Join(responses, ",") + `]}`},
		{AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[` + strings.Join(anthropic, ",") + `]}`},
	} {
		b.Run(c.kind.String(), func(b *testing.B) {
			e, err := NewEstimator(Config{})
			if err != nil {
				b.Fatal(err)
			}
			body := []byte(c.body)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := e.Estimate(c.kind, body); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
