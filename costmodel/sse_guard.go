package costmodel

import "unicode/utf8"

// Counting a stream's output while it runs, for a guard that debits it in
// increments: OutputAbove is called after every event, so it must cost
// next to nothing until the output may have passed the guard's mark.
//
// The guard keeps a count of its own beside the meter's (which counts in
// large pieces, for Usage): the tokenizer's count of the text up to the
// last place where counting in pieces equals counting the whole (see
// safeSplit), and the text after it. A token is at least one byte of text
// for the OpenAI encodings, and at most two for the Anthropic
// approximation, so the text streamed since the last count bounds the
// tokens it can add; the text is counted only when that bound passes the
// mark, and then only from the last split on. For the Anthropic
// approximation the pieces are counted in cl100k tokens and scaled once,
// as the whole text would be.

const (
	// guardSlack covers the tokens by which the text since the last count
	// can change the count of the word it continues.
	guardSlack = 2
	// guardHardLimit is the most text the guard holds uncounted: past it,
	// text with no safe split is split anyway (at a rune's start), which
	// can add a token to the guard's count, never to Usage's.
	guardHardLimit = 256
)

// guardCount is the guard's own count of a stream's output.
type guardCount struct {
	on       bool
	text     []byte // text after the last split, not yet in raw
	raw      int64  // the tokenizer's count (cl100k for the Anthropic approximation) of the text before it
	nonASCII int64  // bytes >= 0x80 of that text
	length   int64  // bytes of that text
	known    int64  // output tokens of the text before text, at the last count
	at       int64  // StreamMeter.textBytes where text starts, at the last count
}

// OutputAbove tells whether the output the stream has carried so far is
// more than n tokens, and, when it is, how many it is: the text up to its
// last safe split is counted once, and the rest (a word or so) again at
// each call that finds the output near n. It counts nothing until a cheap
// upper bound of the output passes n. Reasoning tokens a stream does not
// show are not seen. Like Write, it is for the meter's one goroutine.
func (m *StreamMeter) OutputAbove(n int64) (int64, bool) {
	g := &m.guard
	if !g.on {
		// Text seen before the first call is counted whole by the meter.
		g.on = true
		g.text = append(g.text, m.pending...)
		m.guardBase = m.counted
		g.known, g.at = m.counted, m.textBytes-int64(len(m.pending))
	}
	perByte := m.textPerByte()
	if g.known+perByte*(m.textBytes-g.at)+guardSlack <= n && m.usage.OutputTokens <= n {
		return 0, false
	}
	cut := safeSplit(g.text)
	if cut <= 0 && len(g.text) > guardHardLimit {
		cut = len(g.text) - 1
		for cut > 0 && !utf8.RuneStart(g.text[cut]) {
			cut--
		}
	}
	if cut > 0 {
		g.raw += m.rawCount(g.text[:cut])
		g.nonASCII += nonASCII(g.text[:cut])
		g.length += int64(cut)
		g.text = g.text[:copy(g.text, g.text[cut:])]
	}
	counted := m.guardBase + m.scale(g.raw, g.nonASCII, g.length)
	g.known, g.at = counted, m.textBytes-int64(len(g.text))
	out := counted + perByte*int64(len(g.text))
	if out > n && len(g.text) > 0 {
		// Near the mark: count the rest too (a word or so, at most
		// guardHardLimit bytes).
		out = m.guardBase + m.scale(g.raw+m.rawCount(g.text), g.nonASCII+nonASCII(g.text), g.length+int64(len(g.text)))
	}
	out = max(out, m.usage.OutputTokens)
	return out, out > n
}

// flushGuard counts all of the guard's uncounted text, when the guard is
// on: the text that follows belongs to another choice, whose tokens the
// upstream counts apart.
func (m *StreamMeter) flushGuard() {
	g := &m.guard
	if !g.on || len(g.text) == 0 {
		return
	}
	g.raw += m.rawCount(g.text)
	g.nonASCII += nonASCII(g.text)
	g.length += int64(len(g.text))
	g.text = g.text[:0]
	g.known, g.at = m.guardBase+m.scale(g.raw, g.nonASCII, g.length), m.textBytes
}

// Searches returns the web searches and file searches the stream has shown
// so far (web_search_call and file_search_call items of a Responses
// stream, Anthropic's web_search server tool uses), or its report's when
// larger. Like Write, it is for the meter's one goroutine.
func (m *StreamMeter) Searches() (web, file int64) {
	return max(m.webSearches, m.usage.WebSearchRequests), max(m.fileSearches, m.usage.FileSearchCalls)
}

// rawCount is the tokenizer's count of text: cl100k for the Anthropic
// approximation, which scale turns into its tokens.
func (m *StreamMeter) rawCount(text []byte) int64 {
	if len(text) == 0 {
		return 0
	}
	if m.model.encName == EncodingAnthropic {
		return int64(encoderFor(EncodingCl100k).Count(string(text)))
	}
	return m.model.countText(string(text))
}

// scale turns a raw count of text of length bytes, wide of them non-ASCII,
// into the model's tokens (see anthropicApprox).
func (m *StreamMeter) scale(raw, wide, length int64) int64 {
	if m.model.encName != EncodingAnthropic {
		return raw
	}
	if wide*4 > length {
		return mulDivCeil(raw, anthropicWideNum, anthropicWideDen)
	}
	return mulDivCeil(raw, anthropicScaleNum, anthropicScaleDen)
}

func nonASCII(b []byte) int64 {
	var n int64
	for _, c := range b {
		if c >= 0x80 {
			n++
		}
	}
	return n
}

// textPerByte bounds the tokens one byte of text can add.
func (m *StreamMeter) textPerByte() int64 {
	if m.model.encName == EncodingAnthropic {
		return 2
	}
	return 1
}
