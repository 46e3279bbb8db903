package costmodel

// A fast path for OpenAI stream chunks.
//
// Every chunk of a chat completion stream carries a few words of text in a
// few hundred bytes of JSON. Decoding it with encoding/json costs about ten
// allocations and a microsecond or two per chunk; this reader walks the
// chunk once with the validating scanner and appends the text it needs
// straight from the chunk's bytes. It reads exactly what openaiChunkJSON
// (the encoding/json reader it replaces, kept as the reference in the
// tests) reads, in the same order: each choice's text, then its delta's
// content, reasoning_content, reasoning, refusal, tool-call names and arguments (a custom tool
// call's name and input) and legacy function call;
// a chunk that is not valid JSON, or has a field of the wrong type,
// contributes nothing. The tests check that both agree on every input
// without repeated or differently-cased keys, which encoding/json merges
// and matches case-insensitively.

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/costgate/costgate/internal/jsonscan"
)

// textSpan is a JSON string value in a chunk: its content span and whether
// it must be decoded (escapes, or bytes that are not UTF-8, which
// encoding/json would replace).
type textSpan struct {
	start, end int
	decode     bool
}

type chunkChoice struct {
	index            int64
	text             textSpan
	content, refusal chunkText
	reasoning        [2]chunkText // reasoning_content, reasoning: OpenAI-compatible servers' visible reasoning
	tools            []textSpan   // per tool call: function name, arguments, custom name, input
	fcName, fcArgs   textSpan
}

// chunkText is a delta's text: a string, or the strings of an array of
// parts ([{"type":"text","text":"..."}], as some OpenAI-compatible
// servers stream content), every one but a "type".
type chunkText struct {
	span  textSpan
	parts []textSpan
}

// openaiChunk reads one chat completion or completion stream chunk.
func (m *StreamMeter) openaiChunk(data []byte) error {
	s := jsonScanner{jsonscan.Scanner{B: data}}
	if s.Peek() != '{' {
		st, en, err := s.Value(0)
		if err == nil {
			err = s.End()
		}
		if err == nil && string(data[st:en]) != "null" {
			err = wrongType("chunk: want an object") // null decodes to nothing, as in encoding/json
		}
		return err
	}
	var (
		choices     [4]chunkChoice
		list        = choices[:0]
		report      Usage
		reported    bool
		inputSaid   bool
		model, tier string
	)
	// readUsage reads a usage member's value, at depth. In any case, as
	// encoding/json and the SDKs read it; a chunk's reports in several
	// members count each kind at its largest.
	readUsage := func(depth int) error {
		st, en, err := s.Value(depth)
		if err != nil {
			return err
		}
		u, ok, said, err := chunkUsage(data[st:en])
		if ok {
			report, reported = maxEach(report, u), true
			inputSaid = inputSaid || said
		}
		return err
	}
	err := s.Object(1, func(ks, ke int, esc bool) error {
		name := s.KeyBytes(ks, ke, esc)
		if named(name, "usage") {
			return readUsage(1)
		}
		if named(name, "x_groq") {
			// Groq reports a stream's usage in its last chunk's
			// x_groq.usage, not in a top-level usage member.
			switch s.Peek() {
			case 'n':
				return s.Literal("null")
			case '{':
				return s.Object(2, func(ks, ke int, esc bool) error {
					if named(s.KeyBytes(ks, ke, esc), "usage") {
						return readUsage(2)
					}
					_, _, err := s.Value(2)
					return err
				})
			}
			return wrongType("x_groq: want an object")
		}
		switch keyText(&s, ks, ke, esc) {
		case "choices":
			list = list[:0] // a repeated key replaces
			switch s.Peek() {
			case 'n':
				return s.Literal("null")
			case '[':
				return s.Array(2, func() error {
					var c chunkChoice
					if err := m.readChoice(&s, &c); err != nil {
						return err
					}
					list = append(list, c)
					return nil
				})
			}
			return wrongType("choices: want an array")
		case "model":
			return readStringInto(&s, &model)
		case "service_tier":
			return readStringInto(&s, &tier)
		}
		_, _, err := s.Value(1)
		return err
	})
	if err == nil {
		err = s.End()
	}
	if err != nil {
		return err
	}
	for i := range list {
		c := &list[i]
		if int(c.index) != m.choice {
			// Another choice's text: the tokenizer must not join it to
			// this one's, neither in the meter's count nor the guard's.
			m.flush(true)
			m.flushGuard()
			m.choice = int(c.index)
		}
		m.addSpan(data, c.text)
		m.addDeltaText(data, &c.content)
		m.addDeltaText(data, &c.reasoning[0])
		m.addDeltaText(data, &c.reasoning[1])
		m.addDeltaText(data, &c.refusal)
		for _, t := range c.tools {
			m.addSpan(data, t)
		}
		m.addSpan(data, c.fcName)
		m.addSpan(data, c.fcArgs)
	}
	if model != "" {
		m.respModel = model
	}
	if tier != "" {
		m.serviceTier = tier
	}
	if reported {
		// Each kind counts at its largest report, and the stream is
		// complete at [DONE] after one (see dispatch): an upstream may
		// send a usage-only chunk more than once, or before its text, and
		// its reports are running totals.
		m.usage, m.reported = maxEach(m.usage, report), true
		m.inputSaid = m.inputSaid || inputSaid
	}
	return nil
}

// chunkUsage reads a stream's usage report raw (see openaiUsage.report);
// null is no report.
func chunkUsage(raw []byte) (u Usage, ok, inputSaid bool, err error) {
	var o *openaiUsage
	if string(raw) == "null" {
		return Usage{}, false, false, nil
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return Usage{}, false, false, err
	}
	return o.report()
}

// report is the usage a stream's report o states: ok is false for one
// with no count; inputSaid tells whether it states the input (a report of
// the output alone still counts it). A report with a negative count is an
// error (the event cannot be read, see StreamMeter.Malformed).
func (o *openaiUsage) report() (u Usage, ok, inputSaid bool, err error) {
	if o.negative() {
		return Usage{}, false, false, errNegativeCount
	}
	inputSaid = o.PromptTokens != nil || o.InputTokens != nil
	if !inputSaid && (o.CompletionTokens != 0 || o.OutputTokens != 0 || o.TotalTokens.ok) {
		o.PromptTokens = new(int64)
	}
	u, ok = o.usage()
	return u, ok, inputSaid, nil
}

// errNegativeCount is a usage report with a count below zero.
var errNegativeCount = wrongType("usage: a count below zero")

func keyText(s *jsonScanner, ks, ke int, esc bool) string {
	if esc {
		return s.Key(ks, ke, true)
	}
	return string(s.B[ks:ke]) // not retained: the compiler does not allocate for a switch
}

// readChoice reads one element of "choices" (an object, or null).
func (m *StreamMeter) readChoice(s *jsonScanner, c *chunkChoice) error {
	switch s.Peek() {
	case 'n':
		return s.Literal("null")
	case '{':
	default:
		return wrongType("choices[]: want an object")
	}
	return s.Object(3, func(ks, ke int, esc bool) error {
		switch keyText(s, ks, ke, esc) {
		case "index":
			v, ok, err := s.intValue("index")
			if ok && int64(int(v)) == v {
				c.index = v
			}
			return err
		case "text":
			return readString(s, &c.text)
		case "delta":
			switch s.Peek() {
			case 'n':
				return s.Literal("null")
			case '{':
			default:
				return wrongType("delta: want an object")
			}
			return s.Object(4, func(ks, ke int, esc bool) error {
				switch keyText(s, ks, ke, esc) {
				case "content":
					return readText(s, &c.content, true)
				case "refusal":
					return readText(s, &c.refusal, true)
				case "reasoning_content", "reasoning":
					// OpenAI-compatible servers (DeepSeek, vLLM, SGLang,
					// OpenRouter) stream a reasoning model's reasoning
					// here, billed as output. A value that is neither
					// a string nor parts is skipped.
					t := &c.reasoning[0]
					if keyText(s, ks, ke, esc) == "reasoning" {
						t = &c.reasoning[1]
					}
					return readText(s, t, false)
				case "tool_calls":
					c.tools = c.tools[:0]
					switch s.Peek() {
					case 'n':
						return s.Literal("null")
					case '[':
						return s.Array(5, func() error { return readToolCall(s, c) })
					}
					return wrongType("tool_calls: want an array")
				case "function_call":
					switch s.Peek() {
					case 'n':
						return s.Literal("null")
					case '{':
						return readCall(s, &c.fcName, &c.fcArgs, "arguments", 5)
					}
					return wrongType("function_call: want an object")
				}
				_, _, err := s.Value(4)
				return err
			})
		}
		_, _, err := s.Value(3)
		return err
	})
}

// readToolCall reads one element of a delta's "tool_calls": a function
// call's name and arguments, and a custom tool call's name and input
// (its "custom" member, which carries a custom tool's output as text).
func readToolCall(s *jsonScanner, c *chunkChoice) error {
	var name, args, customName, input textSpan
	switch s.Peek() {
	case 'n':
		c.tools = append(c.tools, name, args, customName, input)
		return s.Literal("null")
	case '{':
	default:
		return wrongType("tool_calls[]: want an object")
	}
	err := s.Object(6, func(ks, ke int, esc bool) error {
		switch key := keyText(s, ks, ke, esc); key {
		case "function", "custom":
			switch s.Peek() {
			case 'n':
				return s.Literal("null")
			case '{':
				if key == "custom" {
					return readCall(s, &customName, &input, "input", 7)
				}
				return readCall(s, &name, &args, "arguments", 7)
			}
			return wrongType("%s: want an object", key)
		}
		_, _, err := s.Value(6)
		return err
	})
	c.tools = append(c.tools, name, args, customName, input)
	return err
}

// readCall reads a call's object: its name, and its arguments under the
// key argsKey ("arguments" for a function, "input" for a custom tool).
func readCall(s *jsonScanner, name, args *textSpan, argsKey string, depth int) error {
	return s.Object(depth, func(ks, ke int, esc bool) error {
		switch keyText(s, ks, ke, esc) {
		case "name":
			return readString(s, name)
		case argsKey:
			return readString(s, args)
		}
		_, _, err := s.Value(depth)
		return err
	})
}

// readText reads a delta's text at depth 4: a string, null, or parts (an
// array or object, whose strings but its "type"s are the text). Any other
// value is an error when strict, else no text.
func readText(s *jsonScanner, t *chunkText, strict bool) error {
	*t = chunkText{parts: t.parts[:0]} // a repeated key replaces
	switch s.Peek() {
	case '[', '{':
		return readParts(s, &t.parts, 4)
	case '"', 'n':
		return readString(s, &t.span)
	}
	if _, _, err := s.Value(4); err != nil || !strict {
		return err
	}
	return wrongType("want a string or parts")
}

// readParts appends the spans of the strings of the value at s.I, in a
// container at depth, but those of a "type" member.
func readParts(s *jsonScanner, spans *[]textSpan, depth int) error {
	switch s.Peek() {
	case '"':
		var t textSpan
		err := readString(s, &t)
		*spans = append(*spans, t)
		return err
	case '[':
		return s.Array(depth+1, func() error { return readParts(s, spans, depth+1) })
	case '{':
		return s.Object(depth+1, func(ks, ke int, esc bool) error {
			if keyText(s, ks, ke, esc) == "type" {
				_, _, err := s.Value(depth + 1)
				return err
			}
			return readParts(s, spans, depth+1)
		})
	}
	_, _, err := s.Value(depth)
	return err
}

// readString reads a string value, or null as the empty string.
func readString(s *jsonScanner, t *textSpan) error {
	switch s.Peek() {
	case 'n':
		*t = textSpan{}
		return s.Literal("null")
	case '"':
		st, en, esc, err := s.Str()
		if err != nil {
			return err
		}
		*t = textSpan{start: st, end: en, decode: esc || !utf8.Valid(s.B[st:en])}
		return nil
	}
	return wrongType("want a string")
}

// addDeltaText appends a delta's text to the pending text.
func (m *StreamMeter) addDeltaText(data []byte, t *chunkText) {
	m.addSpan(data, t.span)
	for _, p := range t.parts {
		m.addSpan(data, p)
	}
}

// addSpan appends a string value of data to the pending text.
func (m *StreamMeter) addSpan(data []byte, t textSpan) {
	if t.end <= t.start {
		return
	}
	if t.decode {
		var v string
		_ = json.Unmarshal(data[t.start-1:t.end+1], &v) // validated by the scanner
		m.addText(v)
		return
	}
	m.pending = append(m.pending, data[t.start:t.end]...)
	m.textBytes += int64(t.end - t.start)
	if m.guard.on {
		m.guard.text = append(m.guard.text, data[t.start:t.end]...)
	}
	if len(m.pending) >= min(max(countChunk, m.retryAt), countHardLimit) {
		m.flush(false)
	}
}

// The Responses and Anthropic events are decoded into the same structs
// encoding/json would fill (the tests check that they are equal), with the
// scanner for the fields every event carries and encoding/json only for the
// rare usage objects.

// decodeResponsesEvent decodes a Responses API stream event.
func decodeResponsesEvent(data []byte) (responsesEvent, error) {
	var ev responsesEvent
	err := scanEvent(data, func(s *jsonScanner, key string) error {
		switch key {
		case "type":
			return readStringInto(s, &ev.Type)
		case "delta":
			return readStringInto(s, &ev.Delta)
		case "response", "item":
			st, en, err := s.Value(1)
			if err != nil {
				return err
			}
			if key == "item" {
				return json.Unmarshal(data[st:en], &ev.Item)
			}
			return json.Unmarshal(data[st:en], &ev.Response)
		}
		_, _, err := s.Value(1)
		return err
	})
	return ev, err
}

// decodeAnthropicEvent decodes an Anthropic Messages stream event.
func decodeAnthropicEvent(data []byte) (anthropicEvent, error) {
	var ev anthropicEvent
	err := scanEvent(data, func(s *jsonScanner, key string) error {
		switch key {
		case "type":
			return readStringInto(s, &ev.Type)
		case "message", "usage":
			st, en, err := s.Value(1)
			if err != nil {
				return err
			}
			if key == "message" {
				return json.Unmarshal(data[st:en], &ev.Message)
			}
			return json.Unmarshal(data[st:en], &ev.Usage)
		case "delta":
			if s.Peek() == 'n' {
				ev.Delta = nil
				return s.Literal("null")
			}
			if ev.Delta == nil {
				ev.Delta = new(anthropicDelta)
			}
			d := ev.Delta
			return scanObject(s, 2, "delta", func(k string) error {
				switch k {
				case "type":
					return readStringInto(s, &d.Type)
				case "text":
					return readStringInto(s, &d.Text)
				case "partial_json":
					return readStringInto(s, &d.PartialJSON)
				case "thinking":
					return readStringInto(s, &d.Thinking)
				case "content":
					return readStringInto(s, &d.Content)
				}
				_, _, err := s.Value(2)
				return err
			})
		case "content_block":
			if s.Peek() == 'n' {
				ev.ContentBlock = nil
				return s.Literal("null")
			}
			if ev.ContentBlock == nil {
				ev.ContentBlock = new(anthropicBlockStart)
			}
			b := ev.ContentBlock
			return scanObject(s, 2, "content_block", func(k string) error {
				switch k {
				case "type":
					return readStringInto(s, &b.Type)
				case "name":
					return readStringInto(s, &b.Name)
				case "text":
					return readStringInto(s, &b.Text)
				case "thinking":
					return readStringInto(s, &b.Thinking)
				case "content":
					if s.Peek() == '"' {
						return readStringInto(s, (*string)(&b.Content))
					}
				}
				_, _, err := s.Value(2)
				return err
			})
		}
		_, _, err := s.Value(1)
		return err
	})
	return ev, err
}

// scanEvent reads an event's data, which must be a JSON object (null
// decodes to nothing, as in encoding/json), calling member for each key.
func scanEvent(data []byte, member func(s *jsonScanner, key string) error) error {
	s := jsonScanner{jsonscan.Scanner{B: data}}
	if s.Peek() != '{' {
		st, en, err := s.Value(0)
		if err == nil {
			err = s.End()
		}
		if err == nil && string(data[st:en]) != "null" {
			err = wrongType("event: want an object")
		}
		return err
	}
	err := s.Object(1, func(ks, ke int, esc bool) error {
		return member(&s, keyText(&s, ks, ke, esc))
	})
	if err == nil {
		err = s.End()
	}
	return err
}

// scanObject reads an object value at s.I, calling member for each key.
func scanObject(s *jsonScanner, depth int, field string, member func(key string) error) error {
	if s.Peek() != '{' {
		if _, _, err := s.Value(depth); err != nil {
			return err
		}
		return wrongType("%s: want an object", field)
	}
	return s.Object(depth+1, func(ks, ke int, esc bool) error {
		return member(keyText(s, ks, ke, esc))
	})
}

// readStringInto reads a string value into v; null leaves v unchanged, as
// in encoding/json.
func readStringInto(s *jsonScanner, v *string) error {
	switch s.Peek() {
	case 'n':
		return s.Literal("null")
	case '"':
		st, en, esc, err := s.Str()
		if err != nil {
			return err
		}
		if esc || !utf8.Valid(s.B[st:en]) {
			return json.Unmarshal(s.B[st-1:en+1], v)
		}
		*v = string(s.B[st:en])
		return nil
	}
	if _, _, err := s.Value(2); err != nil {
		return err
	}
	return wrongType("want a string")
}
