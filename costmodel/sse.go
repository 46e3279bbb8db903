package costmodel

// Metering server-sent event streams.
//
// A StreamMeter reads the bytes of an SSE response as the proxy passes them
// to the client, in whatever pieces the network delivers. It splits lines
// itself, so it holds at most one line (bounded by maxSSELine) plus the
// streamed text not yet counted. Each event's data is decoded on its own:
//
//   - OpenAI chat completions and completions: the content, refusal and tool
//     call deltas of each choice (content, refusal and reasoning as a
//     string or an array of parts) (a function's arguments, a custom tool's
//     input; and the reasoning_content or reasoning
//     deltas of OpenAI-compatible servers), and the final chunk's usage (present when
//     stream_options.include_usage is set; Groq's, in its x_groq member);
//   - OpenAI Responses: the output text, refusal and function-call argument
//     deltas (and those of reasoning, custom tools' input, the code
//     interpreter's code, MCP calls' arguments and shell commands), and
//     the usage of response.completed (or .incomplete, .failed);
//   - Anthropic: message_start's usage (input and cache tokens), the text
//     a content block starts with (its text, thinking, a compaction's
//     content), the text, thinking, tool-input and compaction deltas, and
//     message_delta's cumulative usage.
//
// When the stream carried a usage report, Usage returns it (reported=true;
// of several, each kind at its largest; the input SetInputTokens set when
// none states it or it is 0, and the output counted from the text seen
// when none states it or it is 0: an upstream that reports no count of a
// kind, or zero for a prompt or for text it streamed, says nothing of it).
// When it did not (the stream was cut, or the client did not ask), Usage
// counts the text seen with the model's tokenizer (reported=false); input
// tokens are then whatever the stream said (Anthropic's message_start), else
// what SetInputTokens set (the estimate's exact count), else 0. Reasoning tokens that a stream
// does not show cannot be counted.
//
// The streamed text is counted in pieces once it passes countChunk bytes. It
// is split where the tokenizers always split (before a space or after a
// newline that is followed by a letter), so piecewise counting equals
// counting the whole; only a run of countHardLimit bytes with no such place
// (long unbroken CJK text, for instance) is split anywhere, which can change
// the count by a token per split.

import (
	"bytes"
	"encoding/json"
	"unicode"
	"unicode/utf8"
)

const (
	maxSSELine     = 1 << 20  // longest data line kept; longer ones are skipped
	countChunk     = 16 << 10 // pending text counted from this size on
	countHardLimit = 64 << 10 // pending text split anywhere from this size on
)

// StreamMeter measures the usage of one streamed response. Write it the raw
// SSE bytes; read Usage at the end. It is not safe for concurrent use: one
// goroutine writes and then reads it. The zero value is not usable; get one
// from Estimator.NewStreamMeter.
type StreamMeter struct {
	kind       Kind
	model      model
	responseID string // a Responses stream's answer id (ResponseID)

	line     []byte    // current incomplete line
	afterCR  bool      // the last write ended a line with "\r": a "\n" next is part of it
	begun    bool      // the stream's first line was handled
	skipLine bool      // the current line is over maxSSELine: drop it
	longTap  *UsageTap // a skipped data line of a Responses stream: its report, read as it passes
	skipped  int       // data lines skipped whose usage, if any, was not read
	data     []byte    // data lines of the current event

	pending []byte // text not yet counted
	counted int64  // tokens of text already counted
	choice  int    // choice index of pending text (chat, completions)
	retryAt int    // pending length at which to look for a split again

	reported  bool  // a usage report was seen (each kind counts at its largest, see maxEach)
	final     bool  // the report that ends the stream was seen (see Reported)
	ended     bool  // the stream's terminal event was seen (see Ended)
	usage     Usage // reported usage, or the parts the stream told (Anthropic)
	sawStart  bool  // Anthropic message_start seen
	malformed int   // events whose data was not valid JSON
	events    int
	inputEst  int64 // input tokens to report when the stream tells none
	inputSaid bool  // a report stated the input tokens
	// outputSaid is the largest output count an Anthropic message_delta
	// stated, its iterations' included (message_start's count is the
	// stream's first, not its output); 0, stated or not, states nothing.
	outputSaid int64

	textBytes int64      // bytes of text added so far
	guard     guardCount // OutputAbove's count
	guardBase int64      // the meter's count of the text before OutputAbove's first call

	respModel    string // the model the stream says served it
	serviceTier  string // the service tier the stream reports (OpenAI)
	webSearches  int64  // web_search_call items completed (Responses), web_search server tool uses (Anthropic)
	fileSearches int64  // file_search_call items completed (Responses)
}

// Reported tells whether the stream has carried its final usage report:
// OpenAI's [DONE] after a usage report (its usage chunk, choices empty, is
// not the end: an OpenAI-compatible upstream may send one more than once,
// or before its text), a Responses stream's completed, incomplete or failed
// event, Anthropic's message_stop after a usage report. Reports before it (an
// OpenAI-compatible server's usage on every chunk, continuous_usage_stats;
// Anthropic's message_delta, which may come more than once) are running
// totals, and the stream goes on. Of all its reports, before or after the
// final one, Usage counts each kind at its largest: a report that states
// less takes nothing off.
func (m *StreamMeter) Reported() bool { return m.final }

// Ended tells whether the stream's terminal event has been read: "data:
// [DONE]" (of any API), Anthropic's message_stop, or a Responses stream's
// completed, incomplete or failed event. Nothing after it is part of the
// stream, and a proxy should pass none of it on: the SDKs stop at it, or
// should, and output after it is not guarded, nor billed once the final
// report is in. Write still reads what follows (an upstream may send its
// report after its end), and counts each kind of report at its largest.
func (m *StreamMeter) Ended() bool { return m.ended }

// ResponseID is the id of the Responses answer the stream carries, from
// its first event that names it (response.created); "" until then.
func (m *StreamMeter) ResponseID() string { return m.responseID }

// Model returns the model the stream says served the request (the "model"
// of OpenAI chunks and Responses events, of Anthropic's message_start), or
// "" when it has named none so far, or none that can be a model's name
// (see servedModel). Settlement should price that model.
func (m *StreamMeter) Model() string { return servedModel(m.respModel) }

// SetInputTokens sets the input tokens Usage reports for a stream that ends
// without saying how many it had (an OpenAI stream cut before its usage
// chunk): normally the Estimate's InputTokens, which were counted exactly.
// Without it such a stream reports 0 input tokens.
func (m *StreamMeter) SetInputTokens(n int64) { m.inputEst = max(n, 0) }

// NewStreamMeter returns a meter for a streamed response of the given kind
// and model.
func (e *Estimator) NewStreamMeter(kind Kind, model string) *StreamMeter {
	return &StreamMeter{kind: kind, model: e.resolve(model)}
}

// Write consumes raw SSE bytes. It never fails: malformed events are counted
// (see Malformed) and skipped, so that metering never breaks a stream.
//
// A line ends at "\r\n", "\n" or a lone "\r", as the SSE format has it;
// a "\r" that ends one write and a "\n" that starts the next are one end.
func (m *StreamMeter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if m.afterCR {
			m.afterCR = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := LineEnd(p)
		if i < 0 {
			m.appendLine(p)
			break
		}
		m.appendLine(p[:i])
		m.afterCR = p[i] == '\r'
		p = p[i+1:]
		if m.skipLine {
			m.skipLine = false
			m.line = m.line[:0]
			m.endLongLine()
			continue
		}
		m.handleLine(m.line)
		m.line = m.line[:0]
	}
	return n, nil
}

// LineEnd is the index of the first '\r' or '\n' of p (where an SSE line
// ends), or -1: two IndexByte scans, which a stream's long lines of text
// make much faster than bytes.IndexAny's byte loop.
func LineEnd(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	head := p
	if i >= 0 {
		head = p[:i]
	}
	if j := bytes.IndexByte(head, '\r'); j >= 0 {
		return j
	}
	return i
}

func (m *StreamMeter) appendLine(p []byte) {
	if m.skipLine {
		if m.longTap != nil {
			m.longTap.Write(p)
		}
		return
	}
	if len(m.line)+len(p) > maxSSELine {
		m.skipLine = true
		m.startLongLine(p)
		m.line = m.line[:0]
		return
	}
	m.line = append(m.line, p...)
}

// startLongLine begins to skip a line longer than maxSSELine, of which
// m.line holds the start and p the next piece. A Responses stream's
// final event echoes the request's instructions and tools, so a request
// can make it that long: its usage report is read as the line passes
// (see UsageTap), without keeping it.
func (m *StreamMeter) startLongLine(p []byte) {
	const prefix = "data:"
	var head [len(prefix)]byte
	k := copy(head[:], m.line)
	copy(head[k:], p)
	if string(head[:]) != prefix {
		return // not a data line ("event:", a comment): nothing to read
	}
	m.skipped++
	if m.kind != Responses || len(m.data) > 0 {
		return // an event of several data lines is not read
	}
	m.longTap = &UsageTap{under: "response"}
	m.longTap.Write(m.line[min(len(prefix), len(m.line)):])
	m.longTap.Write(p[min(max(len(prefix)-len(m.line), 0), len(p)):])
}

// endLongLine ends a skipped line: the usage report read from it, if
// any, is the stream's final one.
func (m *StreamMeter) endLongLine() {
	t := m.longTap
	if t == nil {
		return
	}
	m.longTap = nil
	if m.tapped(t) {
		m.skipped--
		m.events++
		m.ended = true
	}
}

// tapped takes the usage report t read from a Responses event the meter
// could not read otherwise (too long to keep, nested deeper than its
// scanner goes) as the stream's final report, and tells whether there was
// one. Only the completed, incomplete and failed events carry a usage
// report; the searches are those counted from their items.
func (m *StreamMeter) tapped(t *UsageTap) bool {
	u, ok := t.Usage(Responses)
	if !ok {
		return false
	}
	u.WebSearchRequests, u.FileSearchCalls = max(u.WebSearchRequests, m.webSearches), m.fileSearches
	m.usage, m.reported, m.final, m.inputSaid = maxEach(m.usage, u), true, true, true
	return true
}

func (m *StreamMeter) handleLine(line []byte) {
	if !m.begun {
		// One byte order mark before the stream's first field is
		// ignored, as the SSE format has it.
		m.begun = true
		line = bytes.TrimPrefix(line, byteOrderMark)
	}
	if len(line) == 0 {
		m.dispatch()
		return
	}
	if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
		v = bytes.TrimPrefix(v, []byte(" "))
		// The lines of one event are joined by '\n'; a line that would take
		// the event past maxSSELine is dropped, separator included.
		sep := min(len(m.data), 1)
		if len(m.data)+sep+len(v) > maxSSELine {
			return
		}
		if sep > 0 {
			m.data = append(m.data, '\n')
		}
		m.data = append(m.data, v...)
		return
	}
	// "event:", "id:", "retry:" and comments carry nothing we need: every
	// payload names its own type. A line of another field ("Data:", a
	// field name in another case, a line of JSON) is no field a client
	// reads either, but a usage report in it would be lost: it counts as
	// an event that could not be read (see Malformed).
	name, _, _ := bytes.Cut(line, []byte(":"))
	switch string(name) {
	case "", "event", "id", "retry", "data":
	default:
		m.malformed++
	}
}

// byteOrderMark is UTF-8's byte order mark, U+FEFF.
var byteOrderMark = []byte("\ufeff")

// Close dispatches an event left without its final blank line. Call it when
// the stream ends; Usage calls it too.
func (m *StreamMeter) Close() error {
	if len(m.line) > 0 && !m.skipLine {
		m.handleLine(bytes.TrimSuffix(m.line, []byte("\r")))
		m.line = m.line[:0]
	}
	m.dispatch()
	return nil
}

func (m *StreamMeter) dispatch() {
	data := bytes.TrimSpace(m.data)
	defer func() { m.data = m.data[:0] }()
	if bytes.Equal(data, []byte("[DONE]")) {
		m.final = m.final || m.reported
		m.ended = true
		return
	}
	if len(data) == 0 {
		return
	}
	m.events++
	var err error
	switch m.kind {
	case ChatCompletions, Completions:
		err = m.openaiChunk(data)
	case Responses:
		err = m.responsesEvent(data)
	case AnthropicMessages:
		err = m.anthropicEvent(data)
	}
	if err != nil {
		if m.kind == Responses {
			// Its response echoes the request's instructions and tools,
			// which may nest deeper than the event's scanner reads.
			t := UsageTap{under: "response"}
			t.Write(data)
			if m.tapped(&t) {
				m.ended = true
				return
			}
		}
		m.malformed++
	}
}

type responsesEvent struct {
	Type     string          `json:"type"`
	Delta    string          `json:"delta"`
	Response *openaiResponse `json:"response"`
	Item     *outputItem     `json:"item"`
}

func (m *StreamMeter) responsesEvent(data []byte) error {
	ev, err := decodeResponsesEvent(data)
	if err != nil {
		return err
	}
	switch ev.Type {
	case "response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta",
		"response.reasoning_summary_text.delta", "response.reasoning_text.delta",
		"response.custom_tool_call_input.delta", "response.code_interpreter_call_code.delta",
		"response.mcp_call_arguments.delta", "response.shell_call_command.delta":
		m.addText(ev.Delta)
	case "response.output_item.done":
		switch {
		case ev.Item == nil:
		case ev.Item.Type == "web_search_call":
			m.webSearches++
		case ev.Item.Type == "file_search_call":
			m.fileSearches++
		}
	}
	if r := ev.Response; r != nil {
		if m.responseID == "" {
			m.responseID = r.ID
		}
		if r.Model != "" {
			m.respModel = r.Model
		}
		if r.ServiceTier != "" {
			m.serviceTier = r.ServiceTier
		}
	}
	switch ev.Type {
	case "response.completed", "response.incomplete", "response.failed":
		m.ended = true
		if ev.Response != nil && ev.Response.Usage != nil {
			if ev.Response.Usage.negative() {
				return errNegativeCount
			}
			if u, ok := ev.Response.Usage.usage(); ok {
				// The final output lists every search; count them there
				// when it is given, else keep the items counted so far.
				// A second final report (an upstream that repeats it)
				// counts each kind at the larger.
				u.WebSearchRequests = max(u.WebSearchRequests, countItems(ev.Response.Output, "web_search_call"), m.webSearches)
				u.FileSearchCalls = max(countItems(ev.Response.Output, "file_search_call"), m.fileSearches)
				m.usage, m.reported, m.final, m.inputSaid = maxEach(m.usage, u), true, true, true
			}
		}
	}
	return nil
}

type anthropicEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
		Model string          `json:"model"`
	} `json:"message"`
	Delta        *anthropicDelta      `json:"delta"`
	ContentBlock *anthropicBlockStart `json:"content_block"`
	Usage        *anthropicUsage      `json:"usage"`
}

type anthropicDelta struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	PartialJSON string `json:"partial_json"`
	Thinking    string `json:"thinking"`
	Content     string `json:"content"` // compaction_delta: the summary a compaction step writes, billed as output
}

// anthropicBlockStart is a content_block_start's block. Its text is
// output like its deltas': a block may start with some of it (a
// compaction block with its summary in content, a thinking block with its
// thinking, on an upstream that does not stream them in deltas).
type anthropicBlockStart struct {
	Type     string    `json:"type"`
	Name     string    `json:"name"`
	Text     string    `json:"text"`
	Thinking string    `json:"thinking"`
	Content  blockText `json:"content"` // a compaction block's summary; the content of other blocks (tool results, arrays) is input, not read
}

// blockText is a block's content when it is a string, else "": a tool
// result block's content (an array of results) is no output.
type blockText string

func (t *blockText) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, (*string)(t))
	}
	return nil
}

func (m *StreamMeter) anthropicEvent(data []byte) error {
	ev, err := decodeAnthropicEvent(data)
	if err != nil {
		return err
	}
	if ev.Message != nil && ev.Message.Usage != nil && ev.Message.Usage.negative() || ev.Usage != nil && ev.Usage.negative() {
		return errNegativeCount
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil && ev.Message.Model != "" {
			m.respModel = ev.Message.Model
		}
		if ev.Message != nil && ev.Message.Usage != nil {
			// A second message_start (an upstream that repeats it) takes
			// nothing off the first.
			mu := ev.Message.Usage
			m.usage = maxEach(m.usage, mu.usage())
			m.sawStart = true
			m.inputSaid = m.inputSaid || mu.InputTokens != nil || mu.CacheReadInputTokens != nil || mu.CacheCreationInputTokens != nil
		}
	case "content_block_start":
		if b := ev.ContentBlock; b != nil {
			m.addText(b.Name)
			m.addText(b.Text)
			m.addText(b.Thinking)
			m.addText(string(b.Content))
			if b.Type == "server_tool_use" && b.Name == "web_search" {
				// Billed per search: count it as it runs, for the guard
				// and for a stream cut before message_delta's report.
				m.webSearches++
			}
		}
	case "content_block_delta":
		if d := ev.Delta; d != nil {
			m.addText(d.Text)
			m.addText(d.PartialJSON)
			m.addText(d.Thinking)
			m.addText(d.Content)
		}
	case "message_stop":
		m.final = m.reported
		m.ended = true
	case "message_delta":
		if u := ev.Usage; u != nil {
			// Cumulative: output_tokens so far; input and cache fields,
			// when present, restate message_start's. Each kind counts at
			// its largest report: a later one that states less (a repeat
			// after message_stop, input_tokens lowered) takes nothing off.
			if u.OutputTokens != nil {
				m.usage.OutputTokens = max(m.usage.OutputTokens, *u.OutputTokens)
				m.outputSaid = max(m.outputSaid, *u.OutputTokens)
			}
			if s := u.ServerToolUse; s != nil {
				m.usage.WebSearchRequests = max(m.usage.WebSearchRequests, s.WebSearchRequests)
			}
			if it := u.Iterations; it != nil {
				// The steps the request ran, a compaction among them,
				// added up: billed, and beyond the counts' report.
				m.usage = maxEach(m.usage, it.usage)
				m.inputSaid = m.inputSaid || it.inputSaid
				if it.outputSaid {
					m.outputSaid = max(m.outputSaid, it.usage.OutputTokens)
				}
			}
			// A geography or speed restated as the standard one takes
			// nothing off a dearer one reported before.
			m.usage = maxEach(m.usage, Usage{InferenceGeo: u.InferenceGeo, Speed: u.Speed})
			if u.InputTokens != nil || u.CacheReadInputTokens != nil || u.CacheCreationInputTokens != nil || u.CacheCreation != nil {
				m.inputSaid = true
				in := Usage{}
				merged := anthropicUsage{InputTokens: u.InputTokens, CacheReadInputTokens: u.CacheReadInputTokens,
					CacheCreationInputTokens: u.CacheCreationInputTokens, CacheCreation: u.CacheCreation}
				if merged.CacheCreation == nil {
					// Keep message_start's split by lifetime: message_delta's
					// usage repeats cache_creation_input_tokens without it
					// (the 1-hour writes would be priced as 5-minute ones).
					merged.CacheCreation = &anthropicCacheCreation{Ephemeral5m: m.usage.CacheWriteTokens - m.usage.CacheWrite1hTokens, Ephemeral1h: m.usage.CacheWrite1hTokens}
				}
				if merged.InputTokens == nil {
					v := m.usage.InputTokens - m.usage.CachedInputTokens - m.usage.CacheWriteTokens
					merged.InputTokens = &v
				}
				if merged.CacheReadInputTokens == nil {
					v := m.usage.CachedInputTokens
					merged.CacheReadInputTokens = &v
				}
				if merged.CacheCreationInputTokens == nil {
					v := m.usage.CacheWriteTokens
					merged.CacheCreationInputTokens = &v
				}
				in = merged.usage()
				in.OutputTokens = m.usage.OutputTokens
				in.WebSearchRequests = m.usage.WebSearchRequests
				in.InferenceGeo = m.usage.InferenceGeo
				in.Speed = m.usage.Speed
				m.usage = maxEach(m.usage, in)
			}
			m.reported = true
		}
	}
	return nil
}

// addText appends streamed text and counts what can be counted.
func (m *StreamMeter) addText(s string) {
	if s == "" {
		return
	}
	m.pending = append(m.pending, s...)
	m.textBytes += int64(len(s))
	if m.guard.on {
		m.guard.text = append(m.guard.text, s...)
	}
	if len(m.pending) >= min(max(countChunk, m.retryAt), countHardLimit) {
		m.flush(false)
	}
}

// flush counts the pending text: all of it when all is set, else up to its
// last safe split.
func (m *StreamMeter) flush(all bool) {
	if len(m.pending) == 0 {
		return
	}
	cut := len(m.pending)
	if !all {
		cut = safeSplit(m.pending)
		if cut <= 0 {
			if len(m.pending) < countHardLimit {
				// Look again only after another 4 KB, so that text with
				// no split point is not rescanned on every delta.
				m.retryAt = len(m.pending) + countChunk/4
				return
			}
			cut = len(m.pending)
			for cut > 0 && !utf8.RuneStart(m.pending[cut-1]) {
				cut--
			}
			if cut > 0 {
				cut-- // split before the last rune, which may be incomplete
			}
		}
	}
	if cut <= 0 {
		return
	}
	m.counted += m.model.countText(string(m.pending[:cut]))
	n := copy(m.pending, m.pending[cut:])
	m.pending = m.pending[:n]
	m.retryAt = 0
}

// safeSplit returns the last index i > 0 of b such that counting b[:i] and
// b[i:] separately gives the same tokens as counting b, or 0: before a space
// that follows an ASCII letter and precedes one, or after a newline that
// follows a non-space and precedes a letter.
func safeSplit(b []byte) int {
	for i := len(b) - 2; i > 0; i-- {
		switch b[i] {
		case ' ':
			if isASCIILetter(b[i-1]) && isASCIILetter(b[i+1]) {
				return i
			}
		case '\n':
			if i+1 < len(b) && b[i-1] != '\n' && b[i-1] != '\r' && b[i-1] != ' ' && b[i-1] != '\t' {
				r, _ := utf8.DecodeRune(b[i+1:])
				if unicode.IsLetter(r) {
					return i + 1
				}
			}
		}
	}
	return 0
}

func isASCIILetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// Usage returns the usage the stream reported (reported=true), or else the
// output tokens counted from the text it carried (reported=false); see the
// top of this file. It can be called more than once.
func (m *StreamMeter) Usage() (u Usage, reported bool) {
	m.Close()
	if m.reported && m.final {
		u = m.usage
		u.ServiceTier = m.serviceTier
		if !m.inputSaid || u.InputTokens == 0 {
			// Reports that state the output alone (an Anthropic
			// message_delta after a message_start without usage), or
			// no input for a prompt: the input is what SetInputTokens
			// set.
			u = maxEach(u, Usage{InputTokens: m.inputEst})
		}
		if !m.OutputStated() {
			// Reports that state the input alone (an Anthropic stream
			// whose message_delta states no output_tokens, after
			// message_start's first count), or no output for text the
			// stream carried: the output is no less than that text.
			u = maxEach(u, Usage{OutputTokens: m.countedText()})
		}
		return u, true
	}
	u = m.usage
	u.ServiceTier = m.serviceTier
	u.WebSearchRequests = max(u.WebSearchRequests, m.webSearches)
	u.FileSearchCalls = max(u.FileSearchCalls, m.fileSearches)
	if u.InputTokens == 0 {
		u.InputTokens = m.inputEst
	}
	counted := m.countedText()
	// A running report (a stream cut before its final one) says what was
	// produced up to it: the text streamed after it is charged too.
	u.OutputTokens = max(u.OutputTokens, counted)
	if m.reported {
		return u, true
	}
	return u.clamped(), false
}

// OutputStated tells whether the stream's final report states its
// output: a count above 0 (of an Anthropic stream, in a message_delta:
// message_start's is the stream's first count, so that a message_delta
// of 0 after message_start's 1 states nothing either). When it does not,
// Usage charges the text the stream carried, which holds no hidden
// reasoning.
func (m *StreamMeter) OutputStated() bool {
	return m.final && m.usage.OutputTokens > 0 && (m.kind != AnthropicMessages || m.outputSaid > 0)
}

// countedText is the tokens of the text the stream carried.
func (m *StreamMeter) countedText() int64 {
	if len(m.pending) == 0 {
		return m.counted
	}
	return m.counted + m.model.countText(string(m.pending))
}

// Malformed returns how many events carried data that was not valid JSON
// (or a usage report with a negative count), and how many lines were no
// field of the SSE format: a usage report in either was lost.
func (m *StreamMeter) Malformed() int { return m.malformed }

// Skipped returns how many data lines were longer than the meter keeps
// and not read: a usage report in one of them is lost. (The report in a
// Responses event that long is read as it passes.) See also Malformed.
func (m *StreamMeter) Skipped() int { return m.skipped }

// Events returns how many data events the meter has read.
func (m *StreamMeter) Events() int { return m.events }
