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
