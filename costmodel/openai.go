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
// formats) the count is a documented approximation, stated where it is made;
// what a schema or a tool holds beyond the cookbook's walk is counted as
// the text of its JSON (schema.go).

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

type chatTool struct {
	Type     string          `json:"type"`
	Function json.RawMessage `json:"function"` // a functionDef
	Custom   json.RawMessage `json:"custom"`   // a custom tool: its name, description and grammar, counted as text
}

type functionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"` // a boolean, not rendered
	// rest is the tokens of the definition's members costgate does not
	// read (unreadTokens).
	rest int64
}

// The members of a chat tool, of a function definition and of a custom
// tool that costgate reads.
var (
	chatToolRead   = []string{"type", "function"}
	chatCustomRead = []string{"type", "custom"}
	functionRead   = []string{"name", "description", "parameters", "strict"}
)

// functionDefOf decodes raw, a function definition (absent: empty).
func functionDefOf(m model, raw json.RawMessage) (functionDef, error) {
	var d functionDef
	if len(raw) == 0 {
		return d, nil
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return d, err
	}
	d.rest = unreadTokens(m, raw, functionRead)
	return d, nil
}

type chatMessage struct {
	Role         string          `json:"role"`
	Name         *string         `json:"name"`
	Content      json.RawMessage `json:"content"`
	ToolCalls    []toolCall      `json:"tool_calls"`
	ToolCallID   string          `json:"tool_call_id"`
	FunctionCall *functionCall   `json:"function_call"`
	Refusal      *string         `json:"refusal"`
	Audio        *struct {
		ID string `json:"id"`
	} `json:"audio"` // a previous answer's audio, by id: the upstream's to count
}

type toolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function functionCall `json:"function"`
	Custom   struct {
		Name  string `json:"name"`
		Input string `json:"input"`
	} `json:"custom"`
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
	InputAudio *inputAudio `json:"input_audio"`
	File       *struct {
		FileData string `json:"file_data"`
		FileID   string `json:"file_id"`
	} `json:"file"`
}

// inputAudio is an audio content part's payload.
type inputAudio struct {
	Data   string `json:"data"`
	Format string `json:"format"`
}

type span struct{ start, end int }

func (e *Estimator) estimateChat(body []byte) (Estimate, error) {
	const kind = ChatCompletions
	// One allocation for the fields: the scanner's recursion makes
	// anything it is handed escape.
	fs := &struct {
		model, messages, tools, functions, streamOptions, maxTokens, maxCompletion, n, stream, modalities, tier, format, webSearch, prediction topField
		msgBuf                                                                                                                                 [64]span
	}{
		model: topField{name: "model"}, messages: topField{name: "messages", collect: true}, tools: topField{name: "tools"},
		functions: topField{name: "functions"}, streamOptions: topField{name: "stream_options"}, maxTokens: topField{name: "max_tokens"},
		maxCompletion: topField{name: "max_completion_tokens"}, n: topField{name: "n"}, stream: topField{name: "stream"},
		modalities: topField{name: "modalities"}, tier: topField{name: "service_tier"}, format: topField{name: "response_format"},
		webSearch: topField{name: "web_search_options"}, prediction: topField{name: "prediction"},
	}
	fModel, fMessages, fTools, fFunctions, fStreamOptions, fModalities := &fs.model, &fs.messages, &fs.tools, &fs.functions, &fs.streamOptions, &fs.modalities
	fMessages.elems = fs.msgBuf[:0]
	if err := scanTop(kind, body, fModel, fMessages, fTools, fFunctions, fStreamOptions, &fs.maxTokens,
		&fs.maxCompletion, &fs.n, &fs.stream, fModalities, &fs.tier, &fs.format, &fs.webSearch, &fs.prediction); err != nil {
		return Estimate{}, err
	}
	var (
		modelName, tier             string
		maxTokens, maxCompletion, n int64
		stream                      bool
		err                         error
	)
	if modelName, err = decodeString(kind, body, fModel); err != nil {
		return Estimate{}, err
	}
	if tier, err = decodeString(kind, body, &fs.tier); err != nil {
		return Estimate{}, err
	}
	if maxTokens, err = decodeInt(kind, body, &fs.maxTokens); err != nil {
		return Estimate{}, err
	}
	if maxCompletion, err = decodeInt(kind, body, &fs.maxCompletion); err != nil {
		return Estimate{}, err
	}
	if n, err = decodeInt(kind, body, &fs.n); err != nil {
		return Estimate{}, err
	}
	if stream, err = decodeBool(kind, body, &fs.stream); err != nil {
		return Estimate{}, err
	}
	if err := checkModelName(kind, modelName); err != nil {
		return Estimate{}, err
	}
	messages := fMessages.elems
	switch raw := fMessages.raw(body); {
	case raw == nil:
		return Estimate{}, badRequest(kind, nil, "missing messages")
	case raw[0] != '[':
		return Estimate{}, badRequest(kind, nil, "messages: want an array")
	}
	for i, sp := range messages {
		if body[sp.start] != '{' {
			return Estimate{}, badRequest(kind, nil, "messages[%d]: want an object", i)
		}
	}
	m := e.resolve(modelName)
	f := chatFormatFor(m)
	var c tokenCount
	c.n = replyPriming
	for i, sp := range messages {
		mc, err := e.chatMessageTokens(m, f, body[sp.start:sp.end])
		if err != nil {
			return Estimate{}, badRequest(kind, err, "messages[%d]", i)
		}
		c.add(mc)
	}
	tc, err := e.chatToolTokens(m, f, body, fTools.val, fFunctions.val)
	if err != nil {
		return Estimate{}, badRequest(kind, err, "tools")
	}
	c.add(tc)
	// A structured output's schema is rendered into the prompt; its JSON
	// text is counted, an upper bound of its rendering.
	if raw := fs.format.raw(body); raw != nil {
		c.n = addSat(c.n, m.countText(string(raw)))
	}

	est := Estimate{Stream: stream}
	if raw := fStreamOptions.raw(body); raw != nil {
		fInclude := topField{name: "include_usage"}
		if err := scanFields(kind, "stream_options.", raw, []*topField{&fInclude}); err != nil {
			return Estimate{}, err
		}
		if est.StreamUsage, err = decodeBool(kind, raw, &fInclude); err != nil {
			return Estimate{}, err
		}
	}
	audioOut, err := wantsAudio(kind, body, fModalities)
	if err != nil {
		return Estimate{}, err
	}
	// Given both, an upstream may honour either (OpenAI-compatible servers
	// differ): the larger is the limit.
	limit := max(maxCompletion, maxTokens, 0)
	est.MaxOutputTokens = limit
	choices := max(n, 1)
	// A previous answer's audio, by id, is billed as audio input: at most
	// the model's maximum output each.
	refs := mulSat(c.audioRefs, e.outputLimit(m, 0))
	est.Usage.InputTokens = addSat(c.n, refs)
	est.Usage.AudioInputTokens = addSat(c.audio, refs)
	est.Usage.OutputTokens = mulSat(e.reserve(e.outputLimit(m, limit)), choices)
	est.OutputCap, est.Outputs = mulSat(e.outputLimit(m, limit), choices), choices
	est.Tools = fTools.val.end > fTools.val.start || fFunctions.val.end > fFunctions.val.start
	if audioOut {
		// Audio streams as base64 that neither the guard nor the stream
		// meter counts (and is billed at the audio rate): an answer that
		// may be audio is reserved whole, whatever output_reserve says,
		// and a stream of it that ends without its usage report is
		// charged no less than that (Uncounted).
		est.Usage.OutputTokens = est.OutputCap
		est.Usage.AudioOutputTokens = est.Usage.OutputTokens
		c.uncounted = true
	}
	if raw := fs.prediction.raw(body); raw != nil && string(raw) != "null" {
		// A predicted output's tokens that the answer does not use are
		// billed as output on top of the answer, and never streamed: at
		// most the prediction's tokens (its JSON text, an upper bound) per
		// completion, reserved beyond the output limit and counted as
		// tokens the stream does not show.
		est.Usage.OutputTokens = addSat(est.Usage.OutputTokens, mulSat(m.countText(string(raw)), choices))
		c.uncounted = true
	}
	est.Usage.ServiceTier = requestedTier(tier)
	if raw := fs.webSearch.raw(body); raw != nil && string(raw) != "null" || chatSearchModel(modelName) {
		// A search model, or web_search_options, has the upstream search
		// on every request and bill it per call; the answer's usage does
		// not report it.
		est.Usage.WebSearchRequests = 1
	}
	est.Uncounted = c.uncounted
	e.finish(m, &est)
	return est, nil
}

// wantsAudio reports whether a request's modalities include "audio": its
// output may be audio, which is reserved at the audio rate.
func wantsAudio(kind Kind, body []byte, f *topField) (bool, error) {
	var modalities []string
	if err := decodeField(kind, body, f, &modalities); err != nil {
		return false, err
	}
	for _, m := range modalities {
		if m == "audio" {
			return true, nil
		}
	}
	return false, nil
}

// requestedTier is the service tier an estimate is priced at: the one the
// request asks for when it is "flex" or "priority", else the standard one
// (the response says which tier served it; settlement prices that).
func requestedTier(tier string) string {
	switch tier {
	case "flex", "priority":
		return tier
	}
	return ""
}

// chatToolTokens counts the tools and legacy functions of a chat request,
// through the count cache: a conversation resends the same tools on every
// turn.
func (e *Estimator) chatToolTokens(m model, f chatFormat, body []byte, tools, functions span) (tokenCount, error) {
	if tools.end == tools.start && functions.end == functions.start {
		return tokenCount{}, nil
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
	count := func() (tokenCount, error) {
		var defs []functionDef
		var c tokenCount
		if tools.end > tools.start {
			raw := body[tools.start:tools.end]
			if err := checkMembers(raw); err != nil {
				return c, err
			}
			var ts []json.RawMessage
			if err := json.Unmarshal(raw, &ts); err != nil {
				return c, err
			}
			for _, tr := range ts {
				var t chatTool
				if err := json.Unmarshal(tr, &t); err != nil {
					return c, err
				}
				switch t.Type {
				case "", "function":
					d, err := functionDefOf(m, t.Function)
					if err != nil {
						return c, err
					}
					d.rest = addSat(d.rest, unreadTokens(m, tr, chatToolRead))
					defs = append(defs, d)
				case "custom":
					c.n = addSat(c.n, addSat(m.countText(string(t.Custom)), unreadTokens(m, tr, chatCustomRead)))
				default:
					// A kind newer than this code: its JSON as text.
					c.add(tokenCount{n: opaqueTokens(m, tr), uncounted: true})
				}
			}
		}
		if functions.end > functions.start {
			raw := body[functions.start:functions.end]
			if err := checkMembers(raw); err != nil {
				return c, err
			}
			var fs []json.RawMessage
			if err := json.Unmarshal(raw, &fs); err != nil {
				return c, err
			}
			for _, fr := range fs {
				d, err := functionDefOf(m, fr)
				if err != nil {
					return c, err
				}
				defs = append(defs, d)
			}
		}
		n, err := toolTokens(m, f, defs)
		c.n = addSat(c.n, n)
		return c, err
	}
	if raw == nil {
		return count()
	}
	return e.counted(m, fmtTools, raw, count)
}

// chatMessageTokens counts one message, overhead included, through the
// per-message cache.
func (e *Estimator) chatMessageTokens(m model, f chatFormat, raw json.RawMessage) (tokenCount, error) {
	return e.counted(m, fmtChatMessage, raw, func() (tokenCount, error) { return chatMessageCount(m, f, raw) })
}

// chatMessageCount counts one message, overhead included.
func chatMessageCount(m model, f chatFormat, raw json.RawMessage) (tokenCount, error) {
	if err := checkMembers(raw); err != nil {
		return tokenCount{}, err
	}
	var msg chatMessage
	if err := json.Unmarshal(raw, &msg); err != nil {
		return tokenCount{}, err
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
	c, err := contentTokens(m, msg.Content)
	if err != nil {
		return tokenCount{}, err
	}
	var unread []int // tool calls of kinds costgate does not read
	for i, tc := range msg.ToolCalls {
		n += toolCallExtra + m.countText(tc.Function.Name) + m.countText(tc.Function.Arguments) +
			m.countText(tc.Custom.Name) + m.countText(tc.Custom.Input)
		if tc.Type != "" && tc.Type != "function" && tc.Type != "custom" {
			unread = append(unread, i)
		}
	}
	if unread != nil {
		// Counted as the text of their JSON, as parts of unknown kinds are.
		var calls struct {
			ToolCalls json.RawMessage `json:"tool_calls"`
		}
		if err := json.Unmarshal(raw, &calls); err != nil {
			return tokenCount{}, err
		}
		oc, err := opaqueParts(m, calls.ToolCalls, unread)
		if err != nil {
			return tokenCount{}, err
		}
		c.add(oc)
	}
	if fc := msg.FunctionCall; fc != nil {
		n += toolCallExtra + m.countText(fc.Name) + m.countText(fc.Arguments)
	}
	c.add(tokenCount{n: n, uncounted: msg.Audio != nil})
	if msg.Audio != nil {
		c.audioRefs++ // a previous answer's audio: reserved at the model's maximum output
	}
	return c, nil
}

// contentTokens counts a message content: null, a string, or an array of
// parts (text, refusal, image_url, input_audio, file; the last two, and
// images whose size is not inline, by the upper bounds of parts.go; a part
// of another kind as the text of its JSON, opaqueTokens).
func contentTokens(m model, raw json.RawMessage) (tokenCount, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return tokenCount{}, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return tokenCount{}, err
		}
		return tokenCount{n: m.countText(s)}, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return tokenCount{}, err
	}
	var c tokenCount
	var opaque []int // parts of kinds costgate does not read
	for i, p := range parts {
		// Every payload a part carries is counted: an upstream reads a
		// part by its type, and a text part that also carries an
		// image_url must not be priced as the image.
		switch p.Type {
		case "text", "refusal", "image_url", "input_audio", "file":
			c.add(tokenCount{n: m.countText(p.Text) + m.countText(p.Refusal)})
		default:
			opaque = append(opaque, i) // its text and all else, below
		}
		if p.ImageURL != nil {
			n, exact := imageTokens(m, p.ImageURL.URL, p.ImageURL.Detail)
			c.add(tokenCount{n: n, uncounted: !exact})
		}
		if p.InputAudio != nil {
			n := audioTokens(p.InputAudio.Data, p.InputAudio.Format)
			c.add(tokenCount{n: n, audio: n, uncounted: true})
		}
		if p.File != nil {
			c.add(tokenCount{n: documentTokens(p.File.FileData), uncounted: true})
		}
	}
	if opaque != nil {
		// Its members as the text of their JSON, but for the payloads
		// priced above.
		oc, err := opaqueParts(m, raw, opaque, "image_url", "input_audio", "file")
		if err != nil {
			return tokenCount{}, err
		}
		c.add(oc)
	}
	return c, nil
}

// toolTokens counts tool definitions by the cookbook's method, their
// parameters by schemaTokens, plus each definition's members costgate does
// not read (functionDef.rest).
func toolTokens(m model, f chatFormat, tools []functionDef) (int64, error) {
	if len(tools) == 0 {
		return 0, nil
	}
	var n int64
	for _, t := range tools {
		n = addSat(addSat(n, f.funcInit), t.rest)
		n = addSat(n, m.countText(t.Name+":"+strings.TrimSuffix(t.Description, ".")))
		if len(t.Parameters) == 0 {
			continue
		}
		pn, err := schemaTokens(m, t.Parameters)
		if err != nil {
			return 0, err
		}
		n = addSat(n, pn)
	}
	return addSat(n, toolsEnd), nil
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
func mulSat(a, b int64) int64 { return MulSat(a, b) }

// message formats, for cache keys.
const (
	fmtChatMessage = iota + 1
	fmtResponsesItem
	fmtAnthropicMessage
	fmtTools
	fmtResponsesTools
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
	return imageRuleFor(m.base).id<<24 | enc<<16 | format<<8 | uint32(f.perMessage)
}

// chatSearchModel tells whether a chat completions model searches the web
// on every request (gpt-4o-search-preview, gpt-5-search-api).
func chatSearchModel(name string) bool {
	name = strings.ToLower(name)
	return strings.Contains(name, "-search-preview") || strings.Contains(name, "-search-api")
}
