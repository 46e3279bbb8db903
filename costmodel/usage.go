package costmodel

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrNoUsage reports a response body without a usage report.
var ErrNoUsage = errors.New("costmodel: response has no usage")

// openaiUsage is the usage object of chat completions, completions and
// embeddings responses (prompt_/completion_ names) and of Responses API
// responses (input_/output_ names).
type openaiUsage struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    int64  `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`

	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       int64  `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

func (o *openaiUsage) usage() (Usage, bool) {
	var u Usage
	switch {
	case o.PromptTokens != nil:
		u.InputTokens = *o.PromptTokens
		u.OutputTokens = o.CompletionTokens
		if d := o.PromptTokensDetails; d != nil {
			u.CachedInputTokens = d.CachedTokens
		}
		if d := o.CompletionTokensDetails; d != nil {
			u.ReasoningTokens = d.ReasoningTokens
		}
	case o.InputTokens != nil:
		u.InputTokens = *o.InputTokens
		u.OutputTokens = o.OutputTokens
		if d := o.InputTokensDetails; d != nil {
			u.CachedInputTokens = d.CachedTokens
		}
		if d := o.OutputTokensDetails; d != nil {
			u.ReasoningTokens = d.ReasoningTokens
		}
	default:
		return Usage{}, false
	}
	return u.clamped(), true
}

// anthropicUsage is the usage object of Anthropic messages: input_tokens
// excludes the tokens read from and written to the prompt cache.
type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

func (a *anthropicUsage) usage() Usage {
	var u Usage
	read, write := deref(a.CacheReadInputTokens), deref(a.CacheCreationInputTokens)
	u.InputTokens = addSat(addSat(max(deref(a.InputTokens), 0), max(read, 0)), max(write, 0))
	u.CachedInputTokens = read
	u.CacheWriteTokens = write
	u.OutputTokens = deref(a.OutputTokens)
	return u.clamped()
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// clamped returns u with negative counts set to zero and parts no larger
// than their wholes.
func (u Usage) clamped() Usage {
	u.InputTokens = max(u.InputTokens, 0)
	u.CachedInputTokens = min(max(u.CachedInputTokens, 0), u.InputTokens)
	u.CacheWriteTokens = min(max(u.CacheWriteTokens, 0), u.InputTokens-u.CachedInputTokens)
	u.OutputTokens = max(u.OutputTokens, 0)
	u.ReasoningTokens = min(max(u.ReasoningTokens, 0), u.OutputTokens)
	u.Units = max(u.Units, 0)
	return u
}

// ParseUsage reads the usage an API reported in a JSON response body:
// usage.prompt_tokens and usage.completion_tokens with their cached and
// reasoning details (chat completions, completions, embeddings),
// usage.input_tokens and usage.output_tokens with their details (Responses),
// or Anthropic's usage with its cache read and creation tokens (which
// ParseUsage adds to InputTokens). A body that is not JSON gives a
// *BadRequestError; a body without usage gives ErrNoUsage.
//
// It makes one validating pass over the body (jsonScanner) and decodes the
// usage member alone, instead of encoding/json's two passes over the whole
// body: the answer is the same (FuzzParseUsageFast checks it), and a long
// completion costs a fraction.
func ParseUsage(kind Kind, body []byte) (Usage, error) {
	if u, ok, err := parseUsageFast(kind, body); ok {
		return u, err
	}
	return parseUsage(kind, body)
}

// parseUsageFast is ParseUsage for a body that is one valid JSON object
// whose usage members decode without error; ok is false for any other
// body, which parseUsage then reads (to give its errors).
func parseUsageFast(kind Kind, body []byte) (u Usage, ok bool, err error) {
	switch kind {
	case ChatCompletions, Completions, Embeddings, Responses, AnthropicMessages:
	default:
		return Usage{}, false, nil
	}
	s := jsonScanner{b: body}
	if s.peek() != '{' {
		return Usage{}, false, nil
	}
	// encoding/json matches a member to the field case-insensitively, and
	// decodes every match, in order, into the same field.
	var found [4]span
	matches := found[:0]
	if err := s.object(1, func(ks, ke int, esc bool) error {
		name := s.b[ks:ke]
		if esc {
			name = []byte(s.key(ks, ke, true))
		}
		st, en, err := s.value(1)
		if err == nil && bytes.EqualFold(name, []byte("usage")) {
			matches = append(matches, span{st, en})
		}
		return err
	}); err != nil || s.end() != nil {
		return Usage{}, false, nil
	}
	if kind == AnthropicMessages {
		var a *anthropicUsage
		for _, m := range matches {
			if json.Unmarshal(body[m.start:m.end], &a) != nil {
				return Usage{}, false, nil
			}
		}
		if a == nil || a.InputTokens == nil && a.OutputTokens == nil {
			return Usage{}, true, ErrNoUsage
		}
		return a.usage(), true, nil
	}
	var o *openaiUsage
	for _, m := range matches {
		if json.Unmarshal(body[m.start:m.end], &o) != nil {
			return Usage{}, false, nil
		}
	}
	if o == nil {
		return Usage{}, true, ErrNoUsage
	}
	if u, ok := o.usage(); ok {
		return u, true, nil
	}
	return Usage{}, true, ErrNoUsage
}

// parseUsage is ParseUsage through encoding/json alone.
func parseUsage(kind Kind, body []byte) (Usage, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return Usage{}, ErrNoUsage
	}
	switch kind {
	case ChatCompletions, Completions, Embeddings, Responses:
		var r struct {
			Usage *openaiUsage `json:"usage"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return Usage{}, badRequest(kind, err, "invalid JSON response")
		}
		if r.Usage == nil {
			return Usage{}, ErrNoUsage
		}
		u, ok := r.Usage.usage()
		if !ok {
			return Usage{}, ErrNoUsage
		}
		return u, nil
	case AnthropicMessages:
		var r struct {
			Usage *anthropicUsage `json:"usage"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return Usage{}, badRequest(kind, err, "invalid JSON response")
		}
		if r.Usage == nil || r.Usage.InputTokens == nil && r.Usage.OutputTokens == nil {
			return Usage{}, ErrNoUsage
		}
		return r.Usage.usage(), nil
	}
	return Usage{}, badRequest(kind, nil, "no usage format for %s responses", kind)
}
