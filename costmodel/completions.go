package costmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
)

type completionsRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Suffix        *string         `json:"suffix"`
	MaxTokens     *int64          `json:"max_tokens"`
	N             *int64          `json:"n"`
	BestOf        *int64          `json:"best_of"`
	Echo          bool            `json:"echo"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// completionsDefaultMaxTokens is the legacy completions API's default
// max_tokens.
const completionsDefaultMaxTokens = 16

func (e *Estimator) estimateCompletions(body []byte) (Estimate, error) {
	var req completionsRequest
	if err := decodeBody(Completions, body, &req); err != nil {
		return Estimate{}, err
	}
	if req.Model == "" {
		return Estimate{}, badRequest(Completions, nil, "missing model")
	}
	m := e.resolve(req.Model)
	in, prompts, err := textInputTokens(m, req.Prompt)
	if err != nil {
		return Estimate{}, badRequest(Completions, err, "prompt")
	}
	if req.Prompt == nil {
		prompts = 1 // the API's default prompt is <|endoftext|>
		in = 1
	}
	if req.Suffix != nil {
		in += m.countText(*req.Suffix) * int64(prompts)
	}
	est := Estimate{Stream: req.Stream}
	est.StreamUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	limit := int64(0)
	if req.MaxTokens != nil && *req.MaxTokens > 0 {
		limit = *req.MaxTokens
		est.MaxOutputTokens = limit
	} else {
		limit = completionsDefaultMaxTokens
	}
	choices := int64(1)
	if req.N != nil && *req.N > 1 {
		choices = *req.N
	}
	if req.BestOf != nil && *req.BestOf > choices {
		choices = *req.BestOf
	}
	est.Usage.InputTokens = in
	est.Usage.OutputTokens = mulSat(mulSat(e.reserve(limit), choices), int64(max(prompts, 1)))
	e.finish(m, &est)
	return est, nil
}

type embeddingsRequest struct {
	Model string          `json:"model"`
	Input json.RawMessage `json:"input"`
}

func (e *Estimator) estimateEmbeddings(body []byte) (Estimate, error) {
	var req embeddingsRequest
	if err := decodeBody(Embeddings, body, &req); err != nil {
		return Estimate{}, err
	}
	if req.Model == "" {
		return Estimate{}, badRequest(Embeddings, nil, "missing model")
	}
	if req.Input == nil {
		return Estimate{}, badRequest(Embeddings, nil, "missing input")
	}
	m := e.resolve(req.Model)
	in, _, err := textInputTokens(m, req.Input)
	if err != nil {
		return Estimate{}, badRequest(Embeddings, err, "input")
	}
	est := Estimate{}
	est.Usage.InputTokens = in
	e.finish(m, &est)
	return est, nil
}

// textInputTokens counts a completions prompt or an embeddings input: a
// string, an array of strings, an array of token ids, or an array of arrays
// of token ids. It returns the tokens and the number of prompts.
func textInputTokens(m model, raw json.RawMessage) (int64, int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, 0, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, 0, err
		}
		return m.countText(s), 1, nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return 0, 0, err
		}
		if len(items) == 0 {
			return 0, 0, nil
		}
		first := bytes.TrimSpace(items[0])
		if len(first) > 0 && first[0] != '"' && first[0] != '[' {
			// One prompt of token ids.
			var ids []int64
			if err := json.Unmarshal(raw, &ids); err != nil {
				return 0, 0, err
			}
			return int64(len(ids)), 1, nil
		}
		var n int64
		for i, it := range items {
			it = bytes.TrimSpace(it)
			if len(it) == 0 {
				continue
			}
			switch it[0] {
			case '"':
				var s string
				if err := json.Unmarshal(it, &s); err != nil {
					return 0, 0, fmt.Errorf("[%d]: %w", i, err)
				}
				n += m.countText(s)
			case '[':
				var ids []int64
				if err := json.Unmarshal(it, &ids); err != nil {
					return 0, 0, fmt.Errorf("[%d]: %w", i, err)
				}
				n += int64(len(ids))
			default:
				return 0, 0, fmt.Errorf("[%d]: want a string or an array of token ids", i)
			}
		}
		return n, len(items), nil
	}
	return 0, 0, fmt.Errorf("want a string or an array, got %.20s", raw)
}
