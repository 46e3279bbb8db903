package costmodel

// Counting OpenAI Responses API prompts. The Responses API renders its input
// items into the same chat format as chat completions, so a message item is
// counted as a chat message (3 + role + content), the instructions as a
// developer message, function calls and their outputs like tool calls and
// tool messages, and function tools like chat tools. Items and parts of
// other kinds (hosted tools' calls and outputs, reasoning, kinds newer than
// this code) are counted as the text of their JSON (opaqueTokens), an upper
// bound, and mark the estimate Uncounted; the images some of them carry (a
// computer_call_output's screenshot, an image_generation_call's result)
// are counted as images. OpenAI has published no counting method for this
// API; these counts follow the chat format and are an approximation. Conversation state kept by the server
// (previous_response_id, conversation) is not visible in the request and is
// not counted.

import (
	"bytes"
	"encoding/json"
	"fmt"
)

type responsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`      // a function's: a boolean, not rendered
	Format      json.RawMessage `json:"format"`      // a custom tool's grammar
	Container   json.RawMessage `json:"container"`   // code_interpreter's: {"type": "auto", ...} or a container's id
	Environment json.RawMessage `json:"environment"` // shell's: {"type": "container_auto", ...}, "local", a reference
}

// containerGB returns the gigabytes of the container t has the upstream
// create: a code_interpreter tool's automatic container, or a shell
// tool's; 0 for a container named by its id, a local shell, other tools.
// A memory_limit costgate does not know counts as the largest, 64 GB.
func (t responsesTool) containerGB() (int64, error) {
	var raw json.RawMessage
	var auto string
	switch t.Type {
	case "code_interpreter":
		raw, auto = t.Container, "auto"
	case "shell":
		raw, auto = t.Environment, "container_auto"
	default:
		return 0, nil
	}
	if len(raw) == 0 || raw[0] != '{' {
		return 0, nil // an existing container's id, or none
	}
	var c struct {
		Type        string  `json:"type"`
		MemoryLimit *string `json:"memory_limit"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return 0, err
	}
	if c.Type != auto {
		return 0, nil
	}
	if c.MemoryLimit == nil {
		return 1, nil
	}
	switch *c.MemoryLimit {
	case "1g":
		return 1, nil
	case "4g":
		return 4, nil
	case "16g":
		return 16, nil
	}
	return 64, nil
}

// The members of a Responses tool that costgate reads: a function's, a
// custom tool's, a hosted tool's (its container is priced apart).
var (
	responsesFunctionRead = []string{"type", "name", "description", "parameters", "strict"}
	responsesCustomRead   = []string{"type", "name", "description", "format"}
	responsesHostedRead   = []string{"type", "container", "environment"}
)

type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	CallID    string          `json:"call_id"`
	Output    json.RawMessage `json:"output"`
	Input     string          `json:"input"`  // custom_tool_call
	Result    string          `json:"result"` // image_generation_call: the image, base64
}

type responsesPart struct {
	Type       string      `json:"type"`
	Text       string      `json:"text"`
	Refusal    string      `json:"refusal"`
	ImageURL   string      `json:"image_url"`
	Detail     string      `json:"detail"`
	FileData   string      `json:"file_data"`
	InputAudio *inputAudio `json:"input_audio"`
}

func (e *Estimator) estimateResponses(body []byte) (Estimate, error) {
	const kind = Responses
	var (
		fModel        = &topField{name: "model"}
		fInput        = &topField{name: "input", collect: true}
		fInstructions = &topField{name: "instructions"}
		fTools        = &topField{name: "tools", collect: true}
		fMaxOutput    = &topField{name: "max_output_tokens"}
		fStream       = &topField{name: "stream"}
		fPrevious     = &topField{name: "previous_response_id"}
		fConversation = &topField{name: "conversation"}
		fServiceTier  = &topField{name: "service_tier"}
		fPrompt       = &topField{name: "prompt"}
		fText         = &topField{name: "text"}
		fBackground   = &topField{name: "background"}
		fMaxToolCalls = &topField{name: "max_tool_calls"}
	)
	if err := scanTop(kind, body, fModel, fInput, fInstructions, fTools, fMaxOutput, fStream, fPrevious, fConversation, fServiceTier, fPrompt, fText, fBackground, fMaxToolCalls); err != nil {
		return Estimate{}, err
	}
	var (
		modelName, instructions, tier string
		maxOutput, maxToolCalls       int64
		stream, background            bool
	)
	for _, d := range []struct {
		f *topField
		v any
	}{{fModel, &modelName}, {fInstructions, &instructions}, {fMaxOutput, &maxOutput}, {fStream, &stream}, {fServiceTier, &tier}, {fBackground, &background}, {fMaxToolCalls, &maxToolCalls}} {
		if err := decodeField(kind, body, d.f, d.v); err != nil {
			return Estimate{}, err
		}
	}
	if err := checkModelName(kind, modelName); err != nil {
		return Estimate{}, err
	}
	previous, err := decodeString(kind, body, fPrevious)
	if err != nil {
		return Estimate{}, err
	}
	m := e.resolve(modelName)
	f := chatFormatFor(m)
	in := int64(replyPriming)
	var c tokenCount
	// A stored prompt, like a stored conversation, is the server's to count:
	// it is reserved at Estimator.serverContext (once, with the
	// item_references of the input).
	c.stored = fPrevious.raw(body) != nil || fConversation.raw(body) != nil || fPrompt.raw(body) != nil
	c.uncounted = c.stored
	if raw := fText.raw(body); raw != nil {
		in = addSat(in, m.countText(string(raw))) // a structured output's schema, rendered into the prompt
	}
	if fInstructions.raw(body) != nil {
		in += f.perMessage + m.countText("developer") + m.countText(instructions)
	}
	raw := fInput.raw(body)
	switch {
	case raw == nil:
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return Estimate{}, badRequest(kind, err, "input")
		}
		in += f.perMessage + m.countText("user") + m.countText(s)
	case raw[0] == '[':
		for i, sp := range fInput.elems {
			ic, err := e.responsesItemTokens(m, f, body[sp.start:sp.end])
			if err != nil {
				return Estimate{}, badRequest(kind, err, "input[%d]", i)
			}
			c.add(ic)
		}
	default:
		return Estimate{}, badRequest(kind, nil, "input: want a string or an array of items")
	}
	// A hosted tool is called up to max_tool_calls times, defaultSearches
	// when the request sets none.
	calls := maxToolCalls
	if calls <= 0 {
		calls = defaultSearches
	}
	tc, err := e.responsesTools(m, f, body, fTools)
	if err != nil {
		return Estimate{}, err
	}
	in = addSat(in, tc.n)
	c.uncounted = c.uncounted || tc.uncounted
	searches, fileSearches := mulSat(tc.searches, calls), mulSat(tc.fileSearches, calls)
	mcpTools, containerGB := tc.mcps, tc.containerGB
	est := Estimate{Stream: stream, StreamUsage: stream, Uncounted: c.uncounted}
	limit := max(maxOutput, 0)
	est.MaxOutputTokens = limit
	in = addSat(in, c.n)
	in = addSat(in, mulSat(addSat(searches, fileSearches), e.searchResult))
	in = addSat(in, mulSat(mcpTools, e.serverContext))
	if c.stored {
		in = addSat(in, e.serverContext)
	}
	est.Usage.InputTokens = in
	est.Usage.FileSearchCalls = fileSearches
	est.Usage.AudioInputTokens = c.audio
	est.Usage.WebSearchRequests = searches
	est.Usage.ContainerGB = containerGB
	est.Usage.ServiceTier = requestedTier(tier)
	est.Usage.OutputTokens = e.reserve(e.outputLimit(m, limit))
	est.OutputCap, est.Outputs = e.outputLimit(m, limit), 1
	if background {
		// A background response runs to its end at the upstream whatever
		// happens to its stream (the guard's stop, a cut, a client gone):
		// it is reserved whole, and charged so unless its report is read.
		est.Usage.OutputTokens, est.Uncounted = est.OutputCap, true
	}
	est.Tools = len(fTools.elems) > 0
	est.PreviousResponseID = previous
	e.finish(m, &est)
	return est, nil
}

func (e *Estimator) responsesItemTokens(m model, f chatFormat, raw json.RawMessage) (tokenCount, error) {
	return e.counted(m, fmtResponsesItem, raw, func() (tokenCount, error) { return responsesItemCount(m, f, raw) })
}

func responsesItemCount(m model, f chatFormat, raw json.RawMessage) (tokenCount, error) {
	if err := checkMembers(raw); err != nil {
		return tokenCount{}, err
	}
	var it responsesItem
	if err := json.Unmarshal(raw, &it); err != nil {
		return tokenCount{}, err
	}
	var n int64
	var c tokenCount
	switch it.Type {
	case "", "message":
		n = f.perMessage + m.countText(it.Role)
		content := bytes.TrimSpace(it.Content)
		switch {
		case len(content) == 0 || bytes.Equal(content, []byte("null")):
		case content[0] == '"':
			var s string
			if err := json.Unmarshal(content, &s); err != nil {
				return tokenCount{}, err
			}
			n += m.countText(s)
		case content[0] == '[':
			var parts []responsesPart
			if err := json.Unmarshal(content, &parts); err != nil {
				return tokenCount{}, err
			}
			var opaque []int // parts of kinds costgate does not read
			for i, p := range parts {
				switch p.Type {
				case "input_text", "output_text", "text", "summary_text", "reasoning_text":
					n += m.countText(p.Text)
				case "refusal":
					n += m.countText(p.Refusal)
				case "input_image":
					in, exact := imageTokens(m, p.ImageURL, p.Detail)
					c.add(tokenCount{n: in, uncounted: !exact})
				case "input_file":
					c.add(tokenCount{n: documentTokens(p.FileData), uncounted: true})
				case "input_audio":
					if p.InputAudio != nil {
						a := audioTokens(p.InputAudio.Data, p.InputAudio.Format)
						c.add(tokenCount{n: a, audio: a, uncounted: true})
					}
				default:
					opaque = append(opaque, i)
				}
			}
			if opaque != nil {
				oc, err := opaqueParts(m, content, opaque)
				if err != nil {
					return tokenCount{}, err
				}
				c.add(oc)
			}
		default:
			return tokenCount{}, fmt.Errorf("content: want a string or an array of parts")
		}
	case "function_call":
		n = f.perMessage + toolCallExtra + m.countText(it.Name) + m.countText(it.Arguments)
	case "function_call_output", "custom_tool_call_output":
		n = f.perMessage + m.countText("tool")
		n += m.countText(jsonScalarText(it.Output))
	case "custom_tool_call":
		n = f.perMessage + toolCallExtra + m.countText(it.Name) + m.countText(it.Input)
	case "item_reference":
		c.uncounted, c.stored = true, true // a stored item: the server's to count
	case "reasoning":
		// Its summary and text as text; its encrypted_content is the
		// upstream's own reasoning, sealed, not text a client can write.
		n = f.perMessage + opaqueTokens(m, raw, "encrypted_content")
		c.uncounted = true
	case "computer_call_output":
		var shot struct {
			ImageURL string `json:"image_url"` // or a file_id: the image's upper bound
		}
		skip := []string{"output"}
		if json.Unmarshal(it.Output, &shot) != nil {
			skip = nil // not a screenshot object: all of it as text
		}
		in, _ := imageTokens(m, shot.ImageURL, "")
		n = f.perMessage + in + opaqueTokens(m, raw, skip...)
		c.uncounted = true
	case "image_generation_call":
		w, h, ok := base64ImageSize(it.Result)
		in, _ := imageRuleFor(m.base).tokens(w, h, ok, "")
		n = f.perMessage + in + opaqueTokens(m, raw, "result")
		c.uncounted = true
	default:
		// Hosted tools' calls and outputs (shell, MCP, apply_patch, code
		// interpreter, searches) and kinds newer than this code: their
		// JSON as text, an upper bound.
		n = f.perMessage + opaqueTokens(m, raw)
		c.uncounted = true
	}
	c.add(tokenCount{n: n})
	return c, nil
}

// responsesTools counts the tools of a Responses request, through the
// count cache (a conversation resends the same tools on every turn): in
// n the tokens of its functions and custom tools and of its hosted tools'
// settings, in searches and fileSearches its web and file search tools
// (each reserves its calls' results), in mcps its MCP servers, in
// containerGB the containers its tools create.
func (e *Estimator) responsesTools(m model, f chatFormat, body []byte, fTools *topField) (tokenCount, error) {
	raw := fTools.raw(body)
	if raw == nil {
		return tokenCount{}, nil
	}
	return e.counted(m, fmtResponsesTools, raw, func() (tokenCount, error) { return responsesToolCount(m, f, body, fTools) })
}

// responsesToolCount counts the tools of fTools in body (see
// responsesTools).
func responsesToolCount(m model, f chatFormat, body []byte, fTools *topField) (tokenCount, error) {
	const kind = Responses
	// A tool's type, container and memory limit price it: each is read
	// one way, or the request is refused (one scan, no decoding).
	if err := checkMembers(fTools.raw(body)); err != nil {
		return tokenCount{}, badRequest(kind, err, "tools")
	}
	var rtools []responsesTool
	if err := decodeField(kind, body, fTools, &rtools); err != nil {
		return tokenCount{}, err
	}
	var tools []functionDef
	var c tokenCount
	for i, t := range rtools {
		var raw []byte // the tool's JSON, for the members costgate does not read
		if i < len(fTools.elems) {
			raw = body[fTools.elems[i].start:fTools.elems[i].end]
		}
		gb, err := t.containerGB()
		if err != nil {
			return tokenCount{}, badRequest(kind, err, "tools[%d]", i)
		}
		c.containerGB = addSat(c.containerGB, gb)
		switch t.Type {
		case "function":
			tools = append(tools, functionDef{Name: t.Name, Description: t.Description, Parameters: t.Parameters,
				rest: unreadTokens(m, raw, responsesFunctionRead)})
		case "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11":
			c.searches++
			c.uncounted = true
		case "file_search":
			c.fileSearches++
			c.uncounted = true
		case "mcp":
			c.mcps++ // its server's tool list, billed as input
			c.uncounted = true
		case "custom":
			c.n = addSat(c.n, f.funcInit+m.countText(t.Name+":"+t.Description+string(t.Format)))
			c.n = addSat(c.n, unreadTokens(m, raw, responsesCustomRead))
		case "image_generation":
			// Its images are billed apart from the response's usage, at
			// the image model's rates, which costgate does not price.
			return tokenCount{}, badRequest(kind, nil, "tools[%d]: the image_generation tool is not served through costgate: its images are billed apart from the response's usage", i)
		default:
			// file_search's results, an MCP server's tools and the other
			// hosted tools' input are the server's to count.
			c.uncounted = true
		}
		if t.Type != "function" && t.Type != "custom" {
			// A hosted tool's settings (a location, a server's
			// description, kinds newer than this code): their JSON as
			// text, an upper bound of what the upstream renders of them.
			c.n = addSat(c.n, unreadTokens(m, raw, responsesHostedRead))
		}
	}
	tn, err := toolTokens(m, f, tools)
	if err != nil {
		return tokenCount{}, badRequest(kind, err, "tools")
	}
	c.n = addSat(c.n, tn)
	return c, nil
}
