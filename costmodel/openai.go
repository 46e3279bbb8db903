package costmodel

// Counting OpenAI prompts.
//
// A chat prompt is rendered by OpenAI as
//
//	<|start|>{role or name}<|message|>{content}<|end|> ... <|start|>assistant<|message|>
//
// which the cookbook's num_tokens_from_messages reproduces, and which this
// file follows: every message costs 3 tokens plus the tokens of its role and
// content (and, as the cookbook encodes every string field of a message, of
// its tool_call_id and refusal), a name adds its tokens plus 1, and the
// reply is primed with 3 more. (gpt-3.5-turbo-0301 used 4 per message and -1 per name.) Tools are
// rendered into a hidden system message as a TypeScript-like namespace; the
// cookbook's num_tokens_for_tools counts it as 7 tokens per function on
// o200k_base models, 10 on cl100k_base ones, plus "name:description", 3 for
// the properties and 3 per property with "name:type:description", minus 3
// for an enum and 3 plus its tokens per enum value, plus 12 once. Both
// reproduce what the API reports in usage.prompt_tokens for the cookbook's
// examples (see the accuracy tests). For what the cookbook does not cover
// (tool calls in assistant messages, nested parameter schemas, response
// formats) the count is a documented approximation, stated where it is made.

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

// chat message formats: per-message and per-name overhead.
type chatFormat struct {
	perMessage, perName int64
	funcInit            int64 // per tool definition
}

func chatFormatFor(m model) chatFormat {
	name := strings.ToLower(m.name)
	if strings.HasPrefix(name, "gpt-3.5-turbo-0301") {
		return chatFormat{perMessage: 4, perName: -1, funcInit: 10}
	}
	if m.encName == EncodingCl100k {
		return chatFormat{perMessage: 3, perName: 1, funcInit: 10}
	}
	return chatFormat{perMessage: 3, perName: 1, funcInit: 7}
}

const (
	replyPriming  = 3  // <|start|>assistant<|message|>
	toolPropInit  = 3  // the parameters' header
	toolPropKey   = 3  // per property
	toolEnumInit  = -3 // a property with an enum
	toolEnumItem  = 3  // per enum value
	toolsEnd      = 12 // the namespace's frame, once
	toolCallExtra = 3  // per tool call in an assistant message (approximation)
)

type chatTool struct {
	Type     string      `json:"type"`
	Function functionDef `json:"function"`
}

type functionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

type chatMessage struct {
	Role         string          `json:"role"`
	Name         *string         `json:"name"`
	Content      json.RawMessage `json:"content"`
	ToolCalls    []toolCall      `json:"tool_calls"`
	ToolCallID   string          `json:"tool_call_id"`
	FunctionCall *functionCall   `json:"function_call"`
	Refusal      *string         `json:"refusal"`
}

type toolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function functionCall `json:"function"`
}

type functionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL *struct {
		URL    string `json:"url"`
		Detail string `json:"detail"`
	} `json:"image_url"`
}

type span struct{ start, end int }

func (e *Estimator) estimateChat(body []byte) (Estimate, error) {
	const kind = ChatCompletions
	s := jsonScanner{b: body}
	if c := s.peek(); c != '{' {
		if c == 0 {
			return Estimate{}, badRequest(kind, nil, "empty body")
		}
		return Estimate{}, badRequest(kind, nil, "want a JSON object")
	}
	var (
		modelName                    string
		messages                     []span
		msgBuf                       [64]span
		sawMessages                  bool
		tools, functions, streamOpts span
		maxTokens, maxCompletion, n  int64
		stream                       bool
	)
	messages = msgBuf[:0]
	err := s.object(1, func(ks, ke int, esc bool) error {
		name := s.b[ks:ke]
		if esc {
			name = []byte(s.key(ks, ke, true))
		}
		var err error
		switch string(name) {
		case "model":
			modelName, _, err = s.stringValue("model")
		case "messages":
			switch s.peek() {
			case '[':
				sawMessages = true
				return s.array(2, func() error {
					if c := s.peek(); c != '{' {
						if _, _, err := s.value(2); err != nil {
							return err
						}
						return wrongType("messages[%d]: want an object", len(messages))
					}
					st, en, err := s.value(2)
					messages = append(messages, span{st, en})
					return err
				})
			case 'n':
				return s.literal("null")
			default:
				return wrongType("messages: want an array")
			}
		case "tools":
			tools.start, tools.end, err = s.value(1)
		case "functions":
			functions.start, functions.end, err = s.value(1)
		case "stream_options":
			streamOpts.start, streamOpts.end, err = s.value(1)
		case "max_tokens":
			maxTokens, _, err = s.intValue("max_tokens")
		case "max_completion_tokens":
			maxCompletion, _, err = s.intValue("max_completion_tokens")
		case "n":
			n, _, err = s.intValue("n")
		case "stream":
			stream, err = s.boolValue("stream")
		default:
			_, _, err = s.value(1)
		}
		return err
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return Estimate{}, badRequest(kind, nil, "%s", fe.msg)
		}
		return Estimate{}, badRequest(kind, err, "invalid JSON")
	}
	if modelName == "" {
		return Estimate{}, badRequest(kind, nil, "missing model")
	}
	if !sawMessages {
		return Estimate{}, badRequest(kind, nil, "missing messages")
	}
	m := e.resolve(modelName)
	f := chatFormatFor(m)
	in := int64(replyPriming)
	for i, sp := range messages {
		n, err := e.chatMessageTokens(m, f, body[sp.start:sp.end])
		if err != nil {
			return Estimate{}, badRequest(kind, err, "messages[%d]", i)
		}
		in += n
	}
	tn, err := e.chatToolTokens(m, f, body, tools, functions)
	if err != nil {
		return Estimate{}, badRequest(kind, err, "tools")
	}
	in += tn

	est := Estimate{Stream: stream}
	if streamOpts.end > streamOpts.start {
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if err := json.Unmarshal(body[streamOpts.start:streamOpts.end], &so); err != nil {
			return Estimate{}, badRequest(kind, err, "stream_options")
		}
		est.StreamUsage = so.IncludeUsage
	}
	limit := int64(0)
	if maxCompletion > 0 {
		limit = maxCompletion
	} else if maxTokens > 0 {
		limit = maxTokens
	}
	est.MaxOutputTokens = limit
	choices := max(n, 1)
	est.Usage.InputTokens = in
	est.Usage.OutputTokens = mulSat(e.reserve(e.outputLimit(m, limit)), choices)
	e.finish(m, &est)
	return est, nil
}

// chatToolTokens counts the tools and legacy functions of a chat request,
// through the count cache: a conversation resends the same tools on every
// turn.
func (e *Estimator) chatToolTokens(m model, f chatFormat, body []byte, tools, functions span) (int64, error) {
	if tools.end == tools.start && functions.end == functions.start {
		return 0, nil
	}
	// Cache the count of a request with tools or functions, not both (rare:
	// their spans are apart).
	var raw []byte
	switch {
	case functions.end == functions.start:
		raw = body[tools.start:tools.end]
	case tools.end == tools.start:
		raw = body[functions.start:functions.end]
	}
	count := func() (int64, error) {
		var defs []functionDef
		if tools.end > tools.start {
			var ts []chatTool
			if err := json.Unmarshal(body[tools.start:tools.end], &ts); err != nil {
				return 0, err
			}
			for _, t := range ts {
				if t.Type == "" || t.Type == "function" {
					defs = append(defs, t.Function)
				}
			}
		}
		if functions.end > functions.start {
			var fs []functionDef
			if err := json.Unmarshal(body[functions.start:functions.end], &fs); err != nil {
				return 0, err
			}
			defs = append(defs, fs...)
		}
		return toolTokens(m, f, defs)
	}
	if raw == nil {
		return count()
	}
	return e.counted(m, fmtTools, raw, count)
}

// chatMessageTokens counts one message, overhead included, through the
// per-message cache.
func (e *Estimator) chatMessageTokens(m model, f chatFormat, raw json.RawMessage) (int64, error) {
	return e.counted(m, fmtChatMessage, raw, func() (int64, error) { return chatMessageCount(m, f, raw) })
}

// chatMessageCount counts one message, overhead included.
func chatMessageCount(m model, f chatFormat, raw json.RawMessage) (int64, error) {
	var msg chatMessage
	if err := json.Unmarshal(raw, &msg); err != nil {
		return 0, err
	}
	n := f.perMessage + m.countText(msg.Role)
	if msg.Name != nil {
		n += m.countText(*msg.Name) + f.perName
	}
	if msg.ToolCallID != "" {
		n += m.countText(msg.ToolCallID)
	}
	if msg.Refusal != nil {
		n += m.countText(*msg.Refusal)
	}
	cn, err := contentTokens(m, msg.Content)
	if err != nil {
		return 0, err
	}
	n += cn
	for _, tc := range msg.ToolCalls {
		n += toolCallExtra + m.countText(tc.Function.Name) + m.countText(tc.Function.Arguments)
	}
	if fc := msg.FunctionCall; fc != nil {
		n += toolCallExtra + m.countText(fc.Name) + m.countText(fc.Arguments)
	}
	return n, nil
}

// contentTokens counts a message content: null, a string, or an array of
// parts (text, refusal, image_url; other parts such as input_audio and file
// are not counted).
func contentTokens(m model, raw json.RawMessage) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
		return m.countText(s), nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, err
	}
	var n int64
	for _, p := range parts {
		switch {
		case p.ImageURL != nil:
			n += imageTokens(m.name, p.ImageURL.URL, p.ImageURL.Detail)
		default:
			n += m.countText(p.Text) + m.countText(p.Refusal)
		}
	}
	return n, nil
}

// toolTokens counts tool definitions by the cookbook's method, extended to
// nested schemas: a property's nested properties (of an object, or of an
// array's items) count like top-level ones.
func toolTokens(m model, f chatFormat, tools []functionDef) (int64, error) {
	if len(tools) == 0 {
		return 0, nil
	}
	var n int64
	for _, t := range tools {
		n += f.funcInit
		n += m.countText(t.Name + ":" + strings.TrimSuffix(t.Description, "."))
		if len(t.Parameters) == 0 || bytes.Equal(bytes.TrimSpace(t.Parameters), []byte("null")) {
			continue
		}
		var schema jsonSchema
		if err := json.Unmarshal(t.Parameters, &schema); err != nil {
			return 0, err
		}
		n += propertiesTokens(m, schema.Properties)
	}
	return n + toolsEnd, nil
}

type jsonSchema struct {
	Type        json.RawMessage   `json:"type"`
	Description string            `json:"description"`
	Enum        []json.RawMessage `json:"enum"`
	Properties  orderedProps      `json:"properties"`
	Items       *jsonSchema       `json:"items"`
}

// orderedProps is a JSON object of property schemas; order does not change
// a count, so a map is enough.
type orderedProps map[string]jsonSchema

func propertiesTokens(m model, props orderedProps) int64 {
	if len(props) == 0 {
		return 0
	}
	n := int64(toolPropInit)
	for name, p := range props {
		n += toolPropKey
		if len(p.Enum) > 0 {
			n += toolEnumInit
			for _, v := range p.Enum {
				n += toolEnumItem + m.countText(jsonScalarText(v))
			}
		}
		n += m.countText(name + ":" + jsonScalarText(p.Type) + ":" + strings.TrimSuffix(p.Description, "."))
		n += propertiesTokens(m, p.Properties)
		if p.Items != nil {
			n += propertiesTokens(m, p.Items.Properties)
		}
	}
	return n
}

// jsonScalarText returns a JSON string's value, or the JSON text of anything
// else (a number, an array of types).
func jsonScalarText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(bytes.TrimSpace(raw))
}

// mulSat multiplies non-negative a and b, saturating.
func mulSat(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return mulDivCeil(a, b, 1)
}

// message formats, for cache keys.
const (
	fmtChatMessage = iota + 1
	fmtResponsesItem
	fmtAnthropicMessage
	fmtTools
)

func formatKey(m model, format uint32) uint32 {
	var enc uint32
	switch m.encName {
	case EncodingO200k:
		enc = 1
	case EncodingCl100k:
		enc = 2
	case EncodingAnthropic:
		enc = 3
	}
	f := chatFormatFor(m)
	return imageRuleFor(m.name).id<<24 | enc<<16 | format<<8 | uint32(f.perMessage)
}
