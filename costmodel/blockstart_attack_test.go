package costmodel

import (
	"strings"
	"testing"
)

// TestStreamAtkBlockStartText: an Anthropic-compatible upstream starts a
// content block with its output in the block itself (a compaction
// block's summary in content, a thinking block's thinking) and streams
// no delta for it, then the stream is cut before its report. The meter
// read a block start's name and text only: 2,000 words of summary or
// thinking were counted as nothing, and such a stream was billed 0
// output tokens for them (and its guard let them through). Must hold:
// the block's text is counted, and a block whose content is not text (a
// tool result's array) breaks nothing.
func TestStreamAtkBlockStartText(t *testing.T) {
	e := newTestEstimator(t)
	words := strings.Repeat(" word", 2000)
	for _, c := range []struct {
		name, block string
		min         int64
	}{
		{"compaction content", `{"type":"compaction","content":"` + words + `"}`, 2000},
		{"thinking", `{"type":"thinking","thinking":"` + words + `","signature":""}`, 2000},
		{"text", `{"type":"text","text":"` + words + `"}`, 2000},
		{"tool result array", `{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","title":"t","url":"https://example.com"}]}`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := e.NewStreamMeter(AnthropicMessages, "claude-haiku-4-5")
			m.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-haiku-4-5\",\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n" +
				"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":" + c.block + "}\n\n"))
			u, _ := m.Usage()
			if u.OutputTokens < c.min {
				t.Errorf("counted %d output tokens; the block carried %d words", u.OutputTokens, c.min)
			}
			if m.Malformed() != 0 {
				t.Errorf("%d events read as malformed", m.Malformed())
			}
			if out, above := m.OutputAbove(c.min / 2); c.min > 0 && !above {
				t.Errorf("the guard counts %d output tokens, not above %d", out, c.min/2)
			}
		})
	}
}
