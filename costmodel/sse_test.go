package costmodel

import (
	"bytes"
	"strings"
	"testing"
)

const chatStream = `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"}}],"usage":null}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" there, how can I help?"}}],"usage":null}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}

data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":8,"total_tokens":27,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}

data: [DONE]

`

const anthropicStream = "event: message_start\r\n" +
	`data: {"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}` + "\r\n\r\n" +
	"event: content_block_start\r\n" +
	`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\r\n\r\n" +
	"event: content_block_delta\r\n" +
	`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello, world"}}` + "\r\n\r\n" +
	"event: content_block_stop\r\n" +
	`data: {"type":"content_block_stop","index":0}` + "\r\n\r\n" +
	"event: message_delta\r\n" +
	`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}` + "\r\n\r\n" +
	"event: message_stop\r\n" +
	`data: {"type":"message_stop"}` + "\r\n\r\n"

const responsesStream = `event: response.created
data: {"type":"response.created","response":{"id":"r","status":"in_progress","usage":null}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"Hi"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":" there"}

event: response.completed
data: {"type":"response.completed","response":{"id":"r","status":"completed","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":10},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":123}}}

`

func TestStreamMeterReported(t *testing.T) {
	e := newTestEstimator(t)
	cases := []struct {
		name   string
		kind   Kind
		model  string
		stream string
		want   Usage
	}{
		{"chat", ChatCompletions, "gpt-4o", chatStream, Usage{InputTokens: 19, OutputTokens: 8}},
		{"anthropic", AnthropicMessages, "claude-sonnet-4-5", anthropicStream, Usage{InputTokens: 2125, CachedInputTokens: 2000, CacheWriteTokens: 100, OutputTokens: 15}},
		{"responses", Responses, "gpt-4.1", responsesStream, Usage{InputTokens: 36, CachedInputTokens: 10, OutputTokens: 87, ReasoningTokens: 64}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, step := range []int{1, 2, 7, 64, len(c.stream)} {
				m := e.NewStreamMeter(c.kind, c.model)
				for i := 0; i < len(c.stream); i += step {
					if n, err := m.Write([]byte(c.stream[i:min(i+step, len(c.stream))])); err != nil || n != min(step, len(c.stream)-i) {
						t.Fatalf("Write = %d, %v", n, err)
					}
				}
				u, reported := m.Usage()
				if !reported || u != c.want {
					t.Errorf("step %d: Usage = %+v, %v; want %+v, true", step, u, reported, c.want)
				}
				if m.Malformed() != 0 {
					t.Errorf("step %d: %d malformed events", step, m.Malformed())
				}
			}
		})
	}
}

// A stream cut before its usage report is settled from the text it
// carried, counted with the model's tokenizer.
func TestStreamMeterCut(t *testing.T) {
	e := newTestEstimator(t)
	cut := chatStream[:strings.Index(chatStream, `data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage"`)]
	m := e.NewStreamMeter(ChatCompletions, "gpt-4o")
	m.Write([]byte(cut))
	u, reported := m.Usage()
	want := e.CountText("gpt-4o", "Hello there, how can I help?")
	if reported || u.OutputTokens != want || u.InputTokens != 0 {
		t.Errorf("Usage = %+v, %v; want %d output tokens, not reported", u, reported, want)
	}

	// With the estimate's input tokens set, a cut stream reports them.
	m2 := e.NewStreamMeter(ChatCompletions, "gpt-4o")
	m2.SetInputTokens(19)
	m2.Write([]byte(cut))
	if u, reported := m2.Usage(); reported || u.InputTokens != 19 || u.OutputTokens != want {
		t.Errorf("with input estimate: %+v, %v", u, reported)
	}
	// A reported usage is never replaced.
	m3 := e.NewStreamMeter(ChatCompletions, "gpt-4o")
	m3.SetInputTokens(1000)
	m3.Write([]byte(chatStream))
	if u, reported := m3.Usage(); !reported || u.InputTokens != 19 {
		t.Errorf("reported usage replaced: %+v, %v", u, reported)
	}

	// Anthropic: cut after message_start keeps its input usage.
	cutA := anthropicStream[:strings.Index(anthropicStream, "event: message_delta")]
	ma := e.NewStreamMeter(AnthropicMessages, "claude-sonnet-4-5")
	ma.Write([]byte(cutA))
	ua, reported := ma.Usage()
	if reported || ua.InputTokens != 2125 || ua.OutputTokens != e.CountText("claude-sonnet-4-5", "Hello, world") {
		t.Errorf("Anthropic cut: Usage = %+v, %v", ua, reported)
	}
}

// Long streamed text is counted in pieces, with bounded memory, and the
// piecewise count equals the count of the whole text.
func TestStreamMeterLongText(t *testing.T) {
	e := newTestEstimator(t)
	words := strings.Fields(strings.Repeat("The quick brown fox jumps over the lazy dog.\nThen it sleeps! ", 4000))
	m := e.NewStreamMeter(ChatCompletions, "gpt-4o")
	var all strings.Builder
	maxPending := 0
	for i, w := range words {
		if i > 0 {
			w = " " + w
		}
		all.WriteString(w)
		m.Write([]byte(`data: {"choices":[{"index":0,"delta":{"content":` + quote(w) + `}}]}` + "\n\n"))
		maxPending = max(maxPending, cap(m.pending))
	}
	u, reported := m.Usage()
	want := e.CountText("gpt-4o", all.String())
	if reported || u.OutputTokens != want {
		t.Errorf("OutputTokens = %d, want %d", u.OutputTokens, want)
	}
	if maxPending > 2*countChunk {
		t.Errorf("pending text grew to %d bytes for a %d-byte stream", maxPending, all.Len())
	}
}

func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// A line longer than the bound is skipped, not buffered.
func TestStreamMeterLongLine(t *testing.T) {
	e := newTestEstimator(t)
	m := e.NewStreamMeter(ChatCompletions, "gpt-4o")
	m.Write([]byte("data: "))
	chunk := []byte(strings.Repeat("x", 64<<10))
	for i := 0; i < 32; i++ {
		m.Write(chunk)
	}
	if len(m.line) > maxSSELine {
		t.Fatalf("line buffer %d bytes", len(m.line))
	}
	m.Write([]byte("\n\n"))
	m.Write([]byte(chatStream))
	if u, reported := m.Usage(); !reported || u.OutputTokens != 8 {
		t.Errorf("after a long line: %+v, %v", u, reported)
	}
}

// An event whose data lines never end (no blank line) keeps at most
// maxSSELine bytes of data, however many lines follow.
func TestStreamMeterLongEvent(t *testing.T) {
	e := newTestEstimator(t)
	m := e.NewStreamMeter(ChatCompletions, "gpt-4o")
	m.Write([]byte("data: " + strings.Repeat("x", maxSSELine-10) + "\n"))
	m.Write(bytes.Repeat([]byte("data: yyyyyyyyyyyyyyyyyyyy\n"), 1000))
	if len(m.data) > maxSSELine {
		t.Fatalf("event data buffer %d bytes, want at most %d", len(m.data), maxSSELine)
	}
	m.Write([]byte("\n"))
	m.Write([]byte(chatStream))
	if u, reported := m.Usage(); !reported || u.OutputTokens != 8 {
		t.Errorf("after a long event: %+v, %v", u, reported)
	}
}

func TestSafeSplit(t *testing.T) {
	e := newTestEstimator(t)
	texts := []string{
		"Hello world, this is text", "line one\nLine two", "a!\nB", "abc  def", "x\n\nY", "don't stop", "foo bar",
	}
	for _, enc := range []string{"gpt-4o", "gpt-4"} {
		for _, s := range texts {
			i := safeSplit([]byte(s))
			if i == 0 {
				continue
			}
			if a, b := e.CountText(enc, s[:i])+e.CountText(enc, s[i:]), e.CountText(enc, s); a != b {
				t.Errorf("%s: split %q at %d: %d tokens in pieces, %d whole", enc, s, i, a, b)
			}
		}
	}
}

// Text without split points (CJK) is still counted in bounded memory, and
// the meter does not rescan it on every delta.
func TestStreamMeterUnbrokenText(t *testing.T) {
	e := newTestEstimator(t)
	m := e.NewStreamMeter(ChatCompletions, "gpt-4o")
	var all strings.Builder
	for i := 0; i < 20000; i++ {
		d := "你好世界"
		all.WriteString(d)
		m.Write([]byte(`data: {"choices":[{"index":0,"delta":{"content":"` + d + `"}}]}` + "\n\n"))
		if len(m.pending) > countHardLimit+64 {
			t.Fatalf("pending %d bytes", len(m.pending))
		}
	}
	u, _ := m.Usage()
	want := e.CountText("gpt-4o", all.String())
	// Forced splits may change the count by a token each.
	if d := u.OutputTokens - want; d < -8 || d > 8 {
		t.Errorf("OutputTokens %d, whole count %d", u.OutputTokens, want)
	}
}
