package costmodel

// Counting Anthropic Messages prompts.
//
// Anthropic publishes no tokenizer for Claude 3 and later models, only a
// count_tokens endpoint, which a proxy cannot call on every request without
// doubling latency. costmodel therefore approximates:
//
//   - text is counted with cl100k_base and scaled up (rounded up): by 5/4,
//     or by 3/2 when more than a quarter of its bytes are not ASCII.
//     Published comparisons (Anthropic's own guidance among them) put
//     Claude's counts 15 to 20% above cl100k_base's on English prose and
//     further above on code and non-English text; the scale errs high,
//     because the count is a reservation;
//   - every message adds anthropicPerMessage tokens for its role markers, the
//     system prompt anthropicPerSystem, and the request anthropicBase;
//   - tool definitions add the tool-use system prompt Anthropic documents
//     for the model (for example 346 tokens for Claude 4 models with
//     tool_choice auto or none, 313 with any or tool), plus each tool's name,
//     description and input schema JSON counted as text;
//   - images cost (width × height) / 750 tokens after scaling the long edge
//     to at most 1568 pixels, Anthropic's published rule; when the size is
//     not in the request (a URL, a file), 1600, the rule's largest value;
//   - documents other than plain text are estimated by the upper bound of
//     parts.go; text documents are counted as text;
//   - blocks of other kinds (server tools' results, MCP tool use and
//     results, kinds newer than this code) are counted as the text of
//     their JSON (opaqueTokens, an upper bound) and mark the estimate
//     Uncounted; a redacted_thinking block, sealed by the upstream, is not
//     counted;
//   - a tool's members costgate does not read (input_examples, a server
//     tool's settings) and a structured output's format (output_format,
//     output_config) are counted as the text of their JSON;
//   - a web search tool reserves its max_uses searches (defaultSearches
//     when it sets none), and marks the estimate Uncounted, as does
//     extended thinking ("thinking" enabled), whose tokens a stream shows
//     only as a summary;
//   - another model the request may run reserves what it may bill, at its
//     price (Usage.Steps): an advisor tool (advisor_20260301) its
//     max_uses sub-inferences (defaultAdvisorUses), each reading the
//     prompt and writing its max_tokens (defaultAdvisorOutput); each of
//     fallbacks the whole request, the prompt and its max_tokens (the
//     request's). "default" fallbacks (the model's own, which the request
//     does not name) reserve the whole request once at the default price,
//     as a model the price table does not know, under the name
//     DefaultFallbacks.
//
// What is known of the error is stated in bench/README.md (section
// costmodel) and checked by TestAnthropicApprox. Settlement always uses the
// usage the API reports, so the approximation only affects how much is
// reserved.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

const (
	anthropicScaleNum   = 5 // text tokens = ceil(cl100k × 5/4)
	anthropicScaleDen   = 4
	anthropicWideNum    = 3 // mostly non-ASCII text: ceil(cl100k × 3/2)
	anthropicWideDen    = 2
	anthropicBase       = 1
	anthropicPerSystem  = 1
	anthropicPerMessage = 3
	anthropicImageMax   = 1600
	defaultSearches     = 10 // reserved for a web search tool without max_uses
	// An advisor tool without max_uses reserves defaultAdvisorUses
	// sub-inferences, each of defaultAdvisorOutput output tokens without
	// max_tokens (Anthropic's recommended setting).
	defaultAdvisorUses   = 3
	defaultAdvisorOutput = 2048
)

// anthropicApprox approximates the Claude tokens of text.
func anthropicApprox(text string) int64 {
	if text == "" {
		return 0
	}
	n := int64(encoderFor(EncodingCl100k).Count(text))
	nonASCII := 0
	for i := 0; i < len(text); i++ {
		if text[i] >= 0x80 {
			nonASCII++
		}
	}
	if nonASCII*4 > len(text) {
		return mulDivCeil(n, anthropicWideNum, anthropicWideDen)
	}
	return mulDivCeil(n, anthropicScaleNum, anthropicScaleDen)
}

// anthropicToolPrompt returns the tokens of the tool-use system prompt
// Anthropic adds when tools are given, by model and tool_choice type.
func anthropicToolPrompt(modelName, choice string) int64 {
	anyTool := choice == "any" || choice == "tool"
	m := strings.ToLower(modelName)
	switch {
	case strings.HasPrefix(m, "claude-3-opus"):
		if anyTool {
			return 281
		}
		return 530
	case strings.HasPrefix(m, "claude-3-sonnet"):
		if anyTool {
			return 235
		}
		return 159
	case strings.HasPrefix(m, "claude-3-haiku"), strings.HasPrefix(m, "claude-3-5-haiku"):
		if anyTool {
			return 340
		}
		return 264
	}
	if anyTool {
		return 313
	}
	return 346
}

// cacheControl is a block's or a tool's cache_control.
type cacheControl struct {
	Type string `json:"type"`
	TTL  string `json:"ttl"`
}

// ttl returns the lifetime rank of c: 0 none, 1 five minutes, 2 one hour.
func (c *cacheControl) ttl() int8 {
	switch {
	case c == nil:
		return 0
	case c.TTL == "1h":
		return 2
	}
	return 1
}

type anthropicTool struct {
	Type             string          `json:"type"`
	MaxUses          int64           `json:"max_uses"`
	MaxContentTokens int64           `json:"max_content_tokens"` // a web fetch's
	CacheControl     *cacheControl   `json:"cache_control"`
	Name             string          `json:"name"`
	Description      string          `json:"description"`
	InputSchema      json.RawMessage `json:"input_schema"`
	Strict           *bool           `json:"strict"`     // a boolean, not rendered
	Model            string          `json:"model"`      // an advisor's
	MaxTokens        int64           `json:"max_tokens"` // an advisor's output limit per call
}

// outputConfigRead are the members of output_config that render no text
// (effort, a level); the others (format) are counted as their JSON text.
var outputConfigRead = []string{"effort"}

// anthropicToolRead are the members of a tool that costgate reads; the
// others (input_examples, a server tool's settings, members newer than
// this code) are counted as the text of their JSON.
var anthropicToolRead = []string{"type", "name", "description", "input_schema", "cache_control", "max_uses", "max_content_tokens", "strict", "model", "max_tokens"}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicBlock struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	Thinking string          `json:"thinking"`
	Name     string          `json:"name"`
	Input    json.RawMessage `json:"input"`
	Content  json.RawMessage `json:"content"` // tool_result, search_result: string or blocks
	Source   json.RawMessage `json:"source"`  // an object (image, document), a string (search_result)
	Title    string          `json:"title"`
	Context  string          `json:"context"`
	// CacheControl marks the prompt up to this block for a cache write,
	// billed above the input rate.
	CacheControl *cacheControl `json:"cache_control"`
}

// source decodes a block's source object, nil when it has none or it is
// not an object.
func (b *anthropicBlock) source() *anthropicSource {
	var src *anthropicSource
	if len(b.Source) > 0 && b.Source[0] == '{' && json.Unmarshal(b.Source, &src) == nil {
		return src
	}
	return nil
}

type anthropicSource struct {
	Type      string `json:"type"` // base64, url, text, file
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
}

func (e *Estimator) estimateAnthropic(body []byte) (Estimate, error) {
	const kind = AnthropicMessages
	var (
		fModel     = &topField{name: "model"}
		fSystem    = &topField{name: "system"}
		fMessages  = &topField{name: "messages", collect: true}
		fTools     = &topField{name: "tools"}
		fChoice    = &topField{name: "tool_choice"}
		fMaxTokens = &topField{name: "max_tokens"}
		fStream    = &topField{name: "stream"}
		fThinking  = &topField{name: "thinking"}
		fMCP       = &topField{name: "mcp_servers"}
		fGeo       = &topField{name: "inference_geo"}
		fSpeed     = &topField{name: "speed"}
		fFormat    = &topField{name: "output_format"}
		fOutput    = &topField{name: "output_config"}
		fFallbacks = &topField{name: "fallbacks"}
	)
	if err := scanTop(kind, body, fModel, fSystem, fMessages, fTools, fChoice, fMaxTokens, fStream, fThinking, fMCP, fGeo, fSpeed, fFormat, fOutput, fFallbacks); err != nil {
		return Estimate{}, err
	}
	var (
		modelName string
		maxTokens int64
		stream    bool
		geo       string
		speed     string
		choice    struct {
			Type string `json:"type"`
		}
		thinking struct {
			Type string `json:"type"`
		}
	)
	for _, d := range []struct {
		f *topField
		v any
	}{{fModel, &modelName}, {fMaxTokens, &maxTokens}, {fStream, &stream}, {fChoice, &choice}, {fThinking, &thinking}, {fGeo, &geo}, {fSpeed, &speed}} {
		if err := decodeField(kind, body, d.f, d.v); err != nil {
			return Estimate{}, err
		}
	}
	if err := checkModelName(kind, modelName); err != nil {
		return Estimate{}, err
	}
	if fMessages.raw(body) == nil {
		return Estimate{}, badRequest(kind, nil, "missing messages")
	}
	if len(fMessages.elems) == 0 && body[fMessages.val.start] != '[' {
		return Estimate{}, badRequest(kind, nil, "messages: want an array")
	}
	m := e.resolve(modelName)
	c := tokenCount{n: anthropicBase}
	if sys := fSystem.raw(body); sys != nil {
		sc, err := anthropicContentTokens(m, sys, 0)
		if err != nil {
			return Estimate{}, badRequest(kind, err, "system")
		}
		sc.n = addSat(sc.n, anthropicPerSystem)
		c.add(sc)
	}
	for i, sp := range fMessages.elems {
		mc, err := e.anthropicMessageTokens(m, body[sp.start:sp.end])
		if err != nil {
			return Estimate{}, badRequest(kind, err, "messages[%d]", i)
		}
		c.add(mc)
	}
	if raw := fTools.raw(body); raw != nil {
		tc, err := e.anthropicToolTokens(m, raw)
		if err != nil {
			return Estimate{}, badRequest(kind, err, "tools")
		}
		if tc.n > 0 {
			tc.n = addSat(tc.n, anthropicToolPrompt(m.base, choice.Type))
		}
		c.add(tc)
	}
	// A structured output's format (output_format, or output_config's
	// format): Anthropic tells the model the expected format in a system
	// prompt of its own; the format's JSON text is counted, an upper bound
	// of the schema's rendering.
	if raw := fFormat.raw(body); raw != nil && string(raw) != "null" {
		c.n = addSat(c.n, m.countText(string(raw)))
	}
	if raw := fOutput.raw(body); raw != nil {
		c.n = addSat(c.n, unreadTokens(m, raw, outputConfigRead))
	}
	est := Estimate{Stream: stream, StreamUsage: stream}
	est.Uncounted = c.uncounted || fThinking.raw(body) != nil && thinking.Type != "disabled" || fMCP.raw(body) != nil
	limit := max(maxTokens, 0)
	est.MaxOutputTokens = limit
	// Content the upstream adds: search results, fetched pages, an MCP
	// server's tool list.
	in := addSat(c.n, mulSat(c.searches, e.searchResult))
	in = addSat(in, mulSat(c.fetches, e.serverContext))
	if fMCP.raw(body) != nil {
		in = addSat(in, e.serverContext)
	}
	est.Usage.InputTokens = in
	// A cache write is billed above the input rate: the whole prompt is
	// reserved at the rate of the longest lifetime it asks.
	if c.cacheTTL > 0 {
		est.Usage.CacheWriteTokens = in
	}
	if c.cacheTTL > 1 {
		est.Usage.CacheWrite1hTokens = in
	}
	est.Usage.WebSearchRequests = c.searches
	est.Usage.OutputTokens = e.reserve(e.outputLimit(m, limit))
	others, err := anthropicFallbacks(fFallbacks.raw(body), limit)
	if err != nil {
		return Estimate{}, badRequest(kind, err, "fallbacks")
	}
	if err := e.reserveOthers(&est, kind, append(c.others, others...)); err != nil {
		return Estimate{}, badRequest(kind, err, "tools and fallbacks")
	}
	est.OutputCap, est.Outputs = e.outputLimit(m, limit), 1
	est.Tools = fTools.raw(body) != nil
	// Asked for, priced so until the answer says where and at which speed
	// it was served (usage.inference_geo, usage.speed).
	est.Usage.InferenceGeo, est.Usage.Speed = geo, speed
	e.finish(m, &est)
	return est, nil
}

// anthropicToolTokens counts tool definitions (not the tool-use system
// prompt), through the count cache.
func (e *Estimator) anthropicToolTokens(m model, raw []byte) (tokenCount, error) {
	return e.counted(m, fmtTools, raw, func() (tokenCount, error) { return anthropicToolCount(m, raw) })
}

func anthropicToolCount(m model, raw []byte) (tokenCount, error) {
	// A tool's type and max_uses price it (web searches): each is read
	// one way, or the request is refused.
	if err := checkMembers(raw); err != nil {
		return tokenCount{}, err
	}
	var tools []json.RawMessage
	if err := json.Unmarshal(raw, &tools); err != nil {
		return tokenCount{}, err
	}
	var c tokenCount
	for _, tr := range tools {
		var t anthropicTool
		if err := json.Unmarshal(tr, &t); err != nil {
			return tokenCount{}, err
		}
		c.n += m.countText(t.Name) + m.countText(t.Description) + unreadTokens(m, tr, anthropicToolRead)
		if s := bytes.TrimSpace(t.InputSchema); len(s) > 0 {
			c.n += m.countText(string(s))
		}
		c.cacheTTL = max(c.cacheTTL, t.CacheControl.ttl())
		uses := t.MaxUses
		if uses <= 0 {
			uses = defaultSearches
		}
		switch {
		case strings.HasPrefix(t.Type, "web_search"):
			c.searches = addSat(c.searches, uses) // their results: Estimator.searchResult each
			c.uncounted = true
		case strings.HasPrefix(t.Type, "advisor_"):
			// A sub-inference on another model: reserved at its price by
			// estimateAnthropic.
			uses := t.MaxUses
			if uses <= 0 {
				uses = defaultAdvisorUses
			}
			out := t.MaxTokens
			if out <= 0 {
				out = defaultAdvisorOutput
			}
			c.others = append(c.others, otherModel{model: t.Model, calls: uses, output: out})
			c.uncounted = true
		case strings.HasPrefix(t.Type, "web_fetch"):
			// The fetched page or PDF is billed as input.
			if t.MaxContentTokens > 0 {
				c.n = addSat(c.n, mulSat(uses, t.MaxContentTokens))
			} else {
				c.fetches = addSat(c.fetches, uses)
			}
			c.uncounted = true
		case !anthropicClientTool(t.Type):
			// A server tool of another kind (code execution, tool search,
			// a kind newer than this code) adds what the request does
			// not hold (the code's output, the tools it loads), billed as
			// input and never streamed as text.
			c.uncounted = true
		}
	}
	return c, nil
}

// anthropicClientTool tells whether an Anthropic tool of type typ runs on
// the client: a custom tool ("" or "custom") or one of Anthropic's client
// tools (bash, text editor, computer use, memory), whose results the next
// request carries. Any other type is a server tool.
func anthropicClientTool(typ string) bool {
	if typ == "" || typ == "custom" {
		return true
	}
	for _, p := range []string{"bash_", "text_editor_", "computer_", "memory_"} {
		if strings.HasPrefix(typ, p) {
			return true
		}
	}
	return false
}

func (e *Estimator) anthropicMessageTokens(m model, raw json.RawMessage) (tokenCount, error) {
	return e.counted(m, fmtAnthropicMessage, raw, func() (tokenCount, error) {
		if err := checkMembers(raw); err != nil {
			return tokenCount{}, err
		}
		var msg anthropicMessage
		if err := json.Unmarshal(raw, &msg); err != nil {
			return tokenCount{}, err
		}
		c, err := anthropicContentTokens(m, msg.Content, 0)
		if err != nil {
			return tokenCount{}, err
		}
		c.n = addSat(c.n, anthropicPerMessage)
		return c, nil
	})
}

// anthropicContentTokens counts a content: a string or an array of blocks.
func anthropicContentTokens(m model, raw json.RawMessage, depth int) (tokenCount, error) {
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
	if depth > 2 {
		return tokenCount{}, fmt.Errorf("content nested too deeply")
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return tokenCount{}, err
	}
	var n int64
	var c tokenCount
	var opaque []int // blocks of kinds costgate does not read
	for i, b := range blocks {
		c.cacheTTL = max(c.cacheTTL, b.CacheControl.ttl())
		switch b.Type {
		case "text":
			n += m.countText(b.Text)
		case "thinking":
			n += m.countText(b.Thinking)
		case "tool_use", "server_tool_use":
			n += toolCallExtra + m.countText(b.Name) + m.countText(string(bytes.TrimSpace(b.Input)))
		case "tool_result", "search_result":
			n += m.countText(b.Title)
			if b.Type == "search_result" {
				var src string
				_ = json.Unmarshal(b.Source, &src)
				n += m.countText(src)
			}
			tc, err := anthropicContentTokens(m, b.Content, depth+1)
			if err != nil {
				return tokenCount{}, err
			}
			tc.n = addSat(tc.n, toolCallExtra)
			c.add(tc)
		case "image":
			in, exact := anthropicImageTokens(b.source())
			c.add(tokenCount{n: in, uncounted: !exact})
		case "document":
			n += m.countText(b.Title) + m.countText(b.Context)
			c.add(anthropicDocumentTokens(m, b.source()))
		case "redacted_thinking":
			// Thinking the upstream sealed (its data): not text a client
			// can write, and not billed as input once a turn is over.
		default:
			// Server tools' results (code execution, web fetch, web
			// search), MCP blocks and kinds newer than this code.
			opaque = append(opaque, i)
		}
	}
	if opaque != nil {
		oc, err := opaqueParts(m, raw, opaque)
		if err != nil {
			return tokenCount{}, err
		}
		c.add(oc)
	}
	c.add(tokenCount{n: n})
	return c, nil
}

// anthropicImageTokens returns an image's tokens and whether they follow
// from its size.
func anthropicImageTokens(src *anthropicSource) (int64, bool) {
	if src == nil || src.Type != "base64" {
		return anthropicImageMax, false
	}
	w, h, ok := base64ImageSize(src.Data)
	if !ok {
		return anthropicImageMax, false
	}
	if long := max(w, h); long > 1568 {
		w, h = w*1568/long, h*1568/long
	}
	return min(mulDivCeil(int64(w), int64(h), 750), anthropicImageMax), true
}

func anthropicDocumentTokens(m model, src *anthropicSource) tokenCount {
	switch {
	case src != nil && src.Type == "text":
		return tokenCount{n: m.countText(src.Data)}
	case src != nil && src.Type == "base64":
		return tokenCount{n: documentTokens(src.Data), uncounted: true}
	}
	return tokenCount{n: docMaxTokens, uncounted: true}
}

// DefaultFallbacks is the model name under which a request's "default"
// fallbacks (the model's own, which the request does not name) are
// reserved (Usage.Steps, the policies' request.other_models, the limits
// keyed by model): a price table that does not name it (the built-in
// one does not) prices it at the default price, as any model it does not
// know.
const DefaultFallbacks = "default"

// anthropicFallbacks reads a request's fallbacks: an array of
// {model, max_tokens} (the request's limit when it sets none), each a
// model that may run the whole request; "default" (the model's own
// fallbacks, which the request does not name) one model of those that
// may, DefaultFallbacks; null none.
func anthropicFallbacks(raw []byte, limit int64) ([]otherModel, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	var name string
	if json.Unmarshal(raw, &name) == nil {
		if name != "default" {
			return nil, fmt.Errorf("want an array or \"default\", not %q", name)
		}
		return []otherModel{{model: DefaultFallbacks, calls: 1, output: limit}}, nil
	}
	if err := checkMembers(raw); err != nil {
		return nil, err
	}
	var list []struct {
		Model     string `json:"model"`
		MaxTokens *int64 `json:"max_tokens"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, err
	}
	out := make([]otherModel, 0, len(list))
	for i, f := range list {
		if err := checkModelName(AnthropicMessages, f.Model); err != nil || f.Model == "" {
			return nil, fmt.Errorf("[%d]: want a model", i)
		}
		o := otherModel{model: f.Model, calls: 1, output: limit}
		if f.MaxTokens != nil {
			o.output = max(*f.MaxTokens, 0)
		}
		out = append(out, o)
	}
	return out, nil
}
