package costmodel

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"
)

// conversation builds the fixed part of a 20-turn chat request: 19 earlier
// messages of about 400 tokens each, and a template for the new message of
// about 200 tokens whose text is made unique per request by a counter.
func conversation(tb testing.TB) (prefix []byte, newMsg string) {
	tb.Helper()
	prose, err := os.ReadFile("testdata/prose_contract.md")
	if err != nil {
		tb.Fatal(err)
	}
	src := string(prose)
	for _, f := range []string{"encoder.go", "sse.go", "openai.go", "anthropic.go", "pretokenize.go"} {
		code, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		src += string(code)
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{Role: "system", Content: "You are a careful assistant that answers questions about an HTTP proxy's design."}}
	off := 0
	for i := 1; i < 19; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		n := 1700 // about 400 tokens
		msgs = append(msgs, msg{Role: role, Content: src[off : off+n]})
		off += n
	}
	b, err := json.Marshal(struct {
		Model    string `json:"model"`
		Messages []msg  `json:"messages"`
	}{"gpt-4o", msgs})
	if err != nil {
		tb.Fatal(err)
	}
	// Drop the closing "]}" so that the new message can be appended.
	prefix = b[:len(b)-2]
	return prefix, src[off : off+850] // about 200 tokens
}

// request appends the request with new message number i to dst.
func request(dst, prefix []byte, newMsg string, i int) []byte {
	dst = append(dst[:0], prefix...)
	dst = append(dst, `,{"role":"user","content":"Turn `...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, ". "...)
	q, _ := json.Marshal(newMsg)
	dst = append(dst, q[1:len(q)-1]...)
	dst = append(dst, `"}]}`...)
	return dst
}

// BenchmarkConversation estimates a 20-turn conversation (about 8k prompt
// tokens) whose last message (about 200 tokens) is new on every request:
// with the per-message count cache, without it (counting it whole), and
// counting it whole with pkoukk/tiktoken-go by the same method.
func BenchmarkConversation(b *testing.B) {
	prefix, newMsg := conversation(b)
	cached, err := NewEstimator(Config{})
	if err != nil {
		b.Fatal(err)
	}
	whole, err := NewEstimator(Config{CacheEntries: -1})
	if err != nil {
		b.Fatal(err)
	}
	body := request(nil, prefix, newMsg, 0)
	ec, _ := cached.Estimate(ChatCompletions, body)
	ew, _ := whole.Estimate(ChatCompletions, body)
	if ec.Usage.InputTokens != ew.Usage.InputTokens {
		b.Fatalf("cached count %d, whole %d", ec.Usage.InputTokens, ew.Usage.InputTokens)
	}
	if pk := pkoukkChatTokens(b, body); pk != ew.Usage.InputTokens {
		b.Fatalf("pkoukk count %d, ours %d", pk, ew.Usage.InputTokens)
	}
	b.Logf("prompt tokens: %d, body %d bytes", ew.Usage.InputTokens, len(body))
	if _, err := cached.Estimate(AnthropicMessages, body); err != nil {
		b.Fatal(err)
	}
	run := func(name string, f func(body []byte)) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var buf []byte
			i := 1
			start := cpuTime()
			for b.Loop() {
				buf = request(buf, prefix, newMsg, i)
				i++
				f(buf)
			}
			reportCPU(b, start)
		})
	}
	run("cached", func(body []byte) { cached.Estimate(ChatCompletions, body) })
	run("whole", func(body []byte) { whole.Estimate(ChatCompletions, body) })
	run("pkoukk-whole", func(body []byte) { pkoukkChatTokens(b, body) })
	// The same conversation sent to Anthropic's Messages API.
	run("anthropic-cached", func(body []byte) { cached.Estimate(AnthropicMessages, body) })
	run("anthropic-whole", func(body []byte) { whole.Estimate(AnthropicMessages, body) })
}

// pkoukkChatTokens counts a chat request of plain string messages with
// pkoukk/tiktoken-go by the cookbook's method.
func pkoukkChatTokens(tb testing.TB, body []byte) int64 {
	var req struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		tb.Fatal(err)
	}
	enc := oracle(tb, EncodingO200k)
	n := int64(3)
	for _, m := range req.Messages {
		n += 3 + int64(len(enc.EncodeOrdinary(m.Role))) + int64(len(enc.EncodeOrdinary(m.Content)))
	}
	return n
}
