package costmodel

// Counting OpenAI prompts.
//
// A chat prompt is rendered by OpenAI as
//
//	<|start|>{role or name}<|message|>{content}<|end|> ... <|start|>assistant<|message|>
//
// which the cookbook's num_tokens_from_messages reproduces, and which this
// file follows: every message costs 3 tokens plus the tokens of its role and
// content, a name adds its tokens plus 1, and the reply is primed with 3
// more. (gpt-3.5-turbo-0301 used 4 per message and -1 per name.) Tools are
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

type chatRequest struct {
	Model               string            `json:"model"`
	Messages            []json.RawMessage `json:"messages"`
	Tools               []chatTool        `json:"tools"`
	Functions           []functionDef     `json:"functions"`
	MaxTokens           *int64            `json:"max_tokens"`
	MaxCompletionTokens *int64            `json:"max_completion_tokens"`
	N                   *int64            `json:"n"`
	Stream              bool              `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

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

func decodeBody(kind Kind, body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest(kind, nil, "empty body")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest(kind, err, "invalid JSON")
	}
	return nil
}

func (e *Estimator) estimateChat(body []byte) (Estimate, error) {
	var req chatRequest
	if err := decodeBody(ChatCompletions, body, &req); err != nil {
		return Estimate{}, err
	}
	if req.Model == "" {
		return Estimate{}, badRequest(ChatCompletions, nil, "missing model")
	}
	if req.Messages == nil {
		return Estimate{}, badRequest(ChatCompletions, nil, "missing messages")
	}
	m := e.resolve(req.Model)
	f := chatFormatFor(m)
	in := int64(replyPriming)
	for i, raw := range req.Messages {
		n, err := e.chatMessageTokens(m, f, raw)
		if err != nil {
			return Estimate{}, badRequest(ChatCompletions, err, "messages[%d]", i)
		}
		in += n
	}
	tools := make([]functionDef, 0, len(req.Tools)+len(req.Functions))
	for _, t := range req.Tools {
		if t.Type == "" || t.Type == "function" {
			tools = append(tools, t.Function)
		}
	}
	tools = append(tools, req.Functions...)
	tn, err := toolTokens(m, f, tools)
	if err != nil {
		return Estimate{}, badRequest(ChatCompletions, err, "tools")
	}
	in += tn

	est := Estimate{Stream: req.Stream}
	est.StreamUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	limit := int64(0)
	if req.MaxCompletionTokens != nil && *req.MaxCompletionTokens > 0 {
		limit = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil && *req.MaxTokens > 0 {
		limit = *req.MaxTokens
	}
	est.MaxOutputTokens = limit
	choices := int64(1)
	if req.N != nil && *req.N > 1 {
		choices = *req.N
	}
	est.Usage.InputTokens = in
	est.Usage.OutputTokens = mulSat(e.reserve(e.outputLimit(m, limit)), choices)
	e.finish(m, &est)
	return est, nil
}

// chatMessageTokens counts one message, overhead included, through the
// per-message cache.
func (e *Estimator) chatMessageTokens(m model, f chatFormat, raw json.RawMessage) (int64, error) {
	var key cacheKey
	if e.cache != nil {
		key = e.cache.key(formatKey(m, fmtChatMessage), raw)
		if n, ok := e.cache.get(key); ok {
			return n, nil
		}
	}
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
	if e.cache != nil {
		e.cache.put(key, n)
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
