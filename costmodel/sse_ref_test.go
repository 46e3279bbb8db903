package costmodel

// The encoding/json reader of OpenAI stream chunks that sse_openai.go
// replaces: the reference model the fast path is checked against.

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/costgate/costgate/internal/jsonscan"
)

type chatChunk struct {
	Choices []struct {
		Index int    `json:"index"`
		Text  string `json:"text"`
		Delta struct {
			// A string or parts (see refText).
			Content json.RawMessage `json:"content"`
			Refusal json.RawMessage `json:"refusal"`
			// Visible reasoning of OpenAI-compatible servers; a value
			// that is neither a string nor parts counts nothing.
			ReasoningContent json.RawMessage `json:"reasoning_content"`
			Reasoning        json.RawMessage `json:"reasoning"`
			ToolCalls        []struct {
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
				Custom struct {
					Name  string `json:"name"`
					Input string `json:"input"`
				} `json:"custom"`
			} `json:"tool_calls"`
			FunctionCall *struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function_call"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *openaiUsage `json:"usage"`
	XGroq *struct {
		Usage *openaiUsage `json:"usage"`
	} `json:"x_groq"`
	Model       string `json:"model"`
	ServiceTier string `json:"service_tier"`
}

func (m *StreamMeter) openaiChunkJSON(data []byte) error {
	var c chatChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return err
	}
	type text struct {
		raw    json.RawMessage
		strict bool
	}
	texts := make([][]string, 0, len(c.Choices)*4)
	for _, ch := range c.Choices {
		for _, t := range []text{{ch.Delta.Content, true}, {ch.Delta.ReasoningContent, false}, {ch.Delta.Reasoning, false}, {ch.Delta.Refusal, true}} {
			ss, err := refText(t.raw, t.strict)
			if err != nil {
				return err
			}
			texts = append(texts, ss)
		}
	}
	for i, ch := range c.Choices {
		if ch.Index != m.choice {
			m.flush(true)
			m.choice = ch.Index
		}
		m.addText(ch.Text)
		for _, ss := range texts[i*4 : i*4+4] {
			for _, s := range ss {
				m.addText(s)
			}
		}
		for _, tc := range ch.Delta.ToolCalls {
			m.addText(tc.Function.Name)
			m.addText(tc.Function.Arguments)
			m.addText(tc.Custom.Name)
			m.addText(tc.Custom.Input)
		}
		if fc := ch.Delta.FunctionCall; fc != nil {
			m.addText(fc.Name)
			m.addText(fc.Arguments)
		}
	}
	if c.Model != "" {
		m.respModel = c.Model
	}
	if c.ServiceTier != "" {
		m.serviceTier = c.ServiceTier
	}
	reports := []*openaiUsage{c.Usage}
	if c.XGroq != nil {
		reports = append(reports, c.XGroq.Usage)
	}
	var (
		report              Usage
		reported, inputSaid bool
	)
	for _, r := range reports {
		if r == nil {
			continue
		}
		u, ok, said, err := r.report()
		if err != nil {
			return err
		}
		if ok {
			report, reported = maxEach(report, u), true
			inputSaid = inputSaid || said
		}
	}
	if reported {
		m.usage, m.reported = maxEach(m.usage, report), true
		m.inputSaid = m.inputSaid || inputSaid
	}
	return nil
}

// refText is a delta's text: a string, or the strings of parts (an array
// or object) but those of a "type" member, in order; null or nothing is
// none. Any other value is an error when strict, else no text.
func refText(raw json.RawMessage, strict bool) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return []string{s}, err
	case '[', '{':
	default:
		if strict {
			return nil, wrongType("want a string or parts")
		}
		return nil, nil
	}
	var out []string
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	// Tokens in order: in an object, a key, then its value.
	var next func() (json.Token, bool)
	next = func() (json.Token, bool) {
		tok, err := dec.Token()
		return tok, err == nil
	}
	var value func(tok json.Token)
	value = func(tok json.Token) {
		switch v := tok.(type) {
		case string:
			out = append(out, v)
		case json.Delim:
			switch v {
			case '[':
				for dec.More() {
					t, _ := next()
					value(t)
				}
				next() // ']'
			case '{':
				for dec.More() {
					k, _ := next()
					t, _ := next()
					if k == "type" {
						skip(dec, t)
						continue
					}
					value(t)
				}
				next() // '}'
			}
		}
	}
	t, _ := next()
	value(t)
	return out, nil
}

// skip skips the rest of the value that starts with tok.
func skip(dec *json.Decoder, tok json.Token) {
	if d, ok := tok.(json.Delim); ok && (d == '[' || d == '{') {
		for depth := 1; depth > 0; {
			t, err := dec.Token()
			if err != nil {
				return
			}
			if d, ok := t.(json.Delim); ok {
				if d == '[' || d == '{' {
					depth++
				} else {
					depth--
				}
			}
		}
	}
}

// oddKeys reports whether a JSON document has a repeated key in an object,
// or a key that equals one the readers look for only case-insensitively:
// there encoding/json merges or folds where the fast path does not.
func oddKeys(data []byte) bool {
	known := []string{"choices", "index", "text", "delta", "content", "refusal", "tool_calls", "function", "name", "arguments", "function_call", "custom", "input", "usage", "x_groq", "reasoning_content", "reasoning",
		"type", "response", "message", "content_block", "partial_json", "thinking"}
	odd := false
	var walk func(s *jsonScanner, depth int) error
	walk = func(s *jsonScanner, depth int) error {
		switch s.Peek() {
		case '{':
			seen := map[string]bool{}
			return s.Object(depth+1, func(ks, ke int, esc bool) error {
				k := s.Key(ks, ke, esc)
				if seen[k] {
					odd = true
				}
				seen[k] = true
				for _, w := range known {
					if k != w && strings.EqualFold(k, w) {
						odd = true
					}
				}
				return walk(s, depth+1)
			})
		case '[':
			return s.Array(depth+1, func() error { return walk(s, depth+1) })
		}
		_, _, err := s.Value(depth)
		return err
	}
	s := jsonScanner{jsonscan.Scanner{B: data}}
	if walk(&s, 0) != nil {
		return false
	}
	return odd
}

// FuzzOpenAIChunk checks the fast chunk reader against encoding/json.
func FuzzOpenAIChunk(f *testing.F) {
	for _, line := range strings.Split(chatStream, "\n") {
		if v, ok := strings.CutPrefix(line, "data: "); ok && v != "[DONE]" {
			f.Add([]byte(v))
		}
	}
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"content":"a\u00e9\n","tool_calls":[{"function":{"name":"f","arguments":"{\"x\":1}"}},null]}}]}`,
		`{"choices":[{"index":1,"text":"hi"},{"index":0,"delta":{"refusal":"no","function_call":{"name":"g","arguments":"{}"}}}],"usage":null}`,
		`{"choices":[{"index":1.5,"text":"x"}]}`, `{"choices":[{"delta":{"content":5}}]}`, `{"choices":null,"usage":{"prompt_tokens":3}}`,
		`{"choices":[null],"x":[1,{"y":"z"}]}`, "{\"choices\":[{\"text\":\"\xff\xfe\"}]}", `[]`, `{"choices":{}}`, ` null `, `"x"`,
		`{"choices":[],"x_groq":{"id":"req_1","usage":{"prompt_tokens":9,"completion_tokens":30,"queue_time":0.01}}}`,
		`{"x_groq":{"usage":{"prompt_tokens":-1}},"usage":{"prompt_tokens":3}}`, `{"x_groq":null}`, `{"x_groq":[1]}`, `{"x_groq":{"usage":null}}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"type":"custom","custom":{"name":"sh","input":"ls \u002d"},"function":{"arguments":"{}"}},{"custom":null},{"custom":{"input":5}}]}}]}`,
	} {
		f.Add([]byte(s))
	}
	e, err := NewEstimator(Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if oddKeys(data) {
			return
		}
		fast := e.NewStreamMeter(ChatCompletions, "gpt-4o")
		ref := e.NewStreamMeter(ChatCompletions, "gpt-4o")
		errFast := fast.openaiChunk(data)
		errRef := ref.openaiChunkJSON(data)
		if (errFast == nil) != (errRef == nil) {
			t.Fatalf("fast error %v, encoding/json error %v, for %q", errFast, errRef, data)
		}
		if string(fast.pending) != string(ref.pending) || fast.choice != ref.choice || fast.counted != ref.counted ||
			fast.usage != ref.usage || fast.reported != ref.reported {
			t.Fatalf("fast %q/%d/%d/%+v, encoding/json %q/%d/%d/%+v, for %q", fast.pending, fast.choice, fast.counted, fast.usage,
				ref.pending, ref.choice, ref.counted, ref.usage, data)
		}
	})
}

// FuzzStreamEvents checks the Responses and Anthropic event decoders
// against encoding/json.
func FuzzStreamEvents(f *testing.F) {
	for _, stream := range []string{responsesStream, anthropicStream} {
		for _, line := range strings.Split(stream, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSuffix(line, "\r"), "data: "); ok {
				f.Add([]byte(v))
			}
		}
	}
	for _, s := range []string{
		`{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{\"a\": 1}"}}`,
		`{"type":"content_block_delta","delta":null,"content_block":{"name":"x"}}`, `{"delta":5}`, `{"type":1}`,
		`{"type":"message_delta","usage":{"output_tokens":"x"}}`, `null`, `[]`, `{"response":{"usage":{"input_tokens":1}}}`,
		`{"message":{"usage":null},"delta":{"text":null}}`,
		`{"type":"content_block_delta","delta":{"type":"compaction_delta","content":"Sum\u006dary."}}`, `{"delta":{"content":[1]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if oddKeys(data) {
			return
		}
		var wantR responsesEvent
		errR := json.Unmarshal(data, &wantR)
		gotR, err := decodeResponsesEvent(data)
		if (err == nil) != (errR == nil) || errR == nil && !reflect.DeepEqual(gotR, wantR) {
			t.Fatalf("responses: fast %+v %v, encoding/json %+v %v, for %q", gotR, err, wantR, errR, data)
		}
		var wantA anthropicEvent
		errA := json.Unmarshal(data, &wantA)
		gotA, err := decodeAnthropicEvent(data)
		if (err == nil) != (errA == nil) || errA == nil && !reflect.DeepEqual(gotA, wantA) {
			t.Fatalf("anthropic: fast %+v %v, encoding/json %+v %v, for %q", gotA, err, wantA, errA, data)
		}
	})
}

// stringOrNothing is the JSON string v, or "" when v is not a string.
func stringOrNothing(v json.RawMessage) string {
	var s string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}
