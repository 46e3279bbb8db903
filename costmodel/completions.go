package costmodel

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/costgate/costgate/internal/jsonscan"
)

// completionsDefaultMaxTokens is the legacy completions API's default
// max_tokens.
const completionsDefaultMaxTokens = 16

func (e *Estimator) estimateCompletions(body []byte) (Estimate, error) {
	const kind = Completions
	var (
		fModel   = &topField{name: "model"}
		fPrompt  = &topField{name: "prompt", collect: true}
		fSuffix  = &topField{name: "suffix"}
		fMax     = &topField{name: "max_tokens"}
		fN       = &topField{name: "n"}
		fBestOf  = &topField{name: "best_of"}
		fStream  = &topField{name: "stream"}
		fOptions = &topField{name: "stream_options"}
	)
	if err := scanTop(kind, body, fModel, fPrompt, fSuffix, fMax, fN, fBestOf, fStream, fOptions); err != nil {
		return Estimate{}, err
	}
	var (
		modelName, suffix    string
		maxTokens, n, bestOf int64
		stream               bool
	)
	for _, d := range []struct {
		f *topField
		v any
	}{{fModel, &modelName}, {fSuffix, &suffix}, {fMax, &maxTokens}, {fN, &n}, {fBestOf, &bestOf}, {fStream, &stream}} {
		if err := decodeField(kind, body, d.f, d.v); err != nil {
			return Estimate{}, err
		}
	}
	// include_usage read as chat's is, spelled exactly: encoding/json
	// would take "INCLUDE_USAGE" for it, which the upstream does not, and
	// costgate would not ask for the report itself.
	var streamUsage bool
	if raw := fOptions.raw(body); raw != nil {
		fInclude := topField{name: "include_usage"}
		if err := scanFields(kind, "stream_options.", raw, []*topField{&fInclude}); err != nil {
			return Estimate{}, err
		}
		var err error
		if streamUsage, err = decodeBool(kind, raw, &fInclude); err != nil {
			return Estimate{}, err
		}
	}
	if err := checkModelName(kind, modelName); err != nil {
		return Estimate{}, err
	}
	m := e.resolve(modelName)
	in, prompts, err := textInputTokens(m, body, fPrompt)
	if err != nil {
		return Estimate{}, badRequest(kind, err, "prompt")
	}
	if fPrompt.raw(body) == nil {
		prompts = 1 // the API's default prompt is <|endoftext|>
		in = 1
	}
	in = addSat(in, mulSat(m.countText(suffix), int64(prompts)))
	est := Estimate{Stream: stream, StreamUsage: streamUsage}
	limit := int64(completionsDefaultMaxTokens)
	if maxTokens > 0 {
		limit = maxTokens
		est.MaxOutputTokens = limit
	}
	choices := max(n, bestOf, 1)
	est.Usage.InputTokens = in
	est.Usage.OutputTokens = mulSat(mulSat(e.reserve(limit), choices), int64(max(prompts, 1)))
	est.Outputs = mulSat(choices, int64(max(prompts, 1)))
	est.OutputCap = mulSat(limit, est.Outputs)
	e.finish(m, &est)
	return est, nil
}

func (e *Estimator) estimateEmbeddings(body []byte) (Estimate, error) {
	const kind = Embeddings
	fModel := &topField{name: "model"}
	fInput := &topField{name: "input", collect: true}
	if err := scanTop(kind, body, fModel, fInput); err != nil {
		return Estimate{}, err
	}
	var modelName string
	if err := decodeField(kind, body, fModel, &modelName); err != nil {
		return Estimate{}, err
	}
	if err := checkModelName(kind, modelName); err != nil {
		return Estimate{}, err
	}
	if fInput.raw(body) == nil {
		return Estimate{}, badRequest(kind, nil, "missing input")
	}
	m := e.resolve(modelName)
	in, _, err := textInputTokens(m, body, fInput)
	if err != nil {
		return Estimate{}, badRequest(kind, err, "input")
	}
	est := Estimate{}
	est.Usage.InputTokens = in
	e.finish(m, &est)
	return est, nil
}

// textInputTokens counts a completions prompt or an embeddings input: a
// string, an array of strings, an array of token ids, or an array of arrays
// of token ids. It returns the tokens and the number of prompts. The field
// was read by scanTop with collect set, so its JSON is valid.
func textInputTokens(m model, body []byte, f *topField) (int64, int, error) {
	raw := f.raw(body)
	if raw == nil {
		return 0, 0, nil
	}
	switch raw[0] {
	case '"':
		n, err := stringTokens(m, raw)
		return n, 1, err
	case '[':
	default:
		return 0, 0, fmt.Errorf("want a string or an array, got %.20s", raw)
	}
	if len(f.elems) == 0 {
		return 0, 0, nil
	}
	if c := body[f.elems[0].start]; c != '"' && c != '[' {
		// One prompt of token ids.
		n, err := tokenIDs(raw)
		return n, 1, err
	}
	var total int64
	for i, sp := range f.elems {
		it := body[sp.start:sp.end]
		var n int64
		var err error
		switch it[0] {
		case '"':
			n, err = stringTokens(m, it)
		case '[':
			n, err = tokenIDs(it)
		default:
			err = fmt.Errorf("want a string or an array of token ids")
		}
		if err != nil {
			return 0, 0, fmt.Errorf("[%d]: %w", i, err)
		}
		total = addSat(total, n)
	}
	return total, len(f.elems), nil
}

// stringTokens counts a JSON string (validated, quotes included).
func stringTokens(m model, raw []byte) (int64, error) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return m.countText(string(raw[1 : len(raw)-1])), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, err
	}
	return m.countText(s), nil
}

// tokenIDs counts a JSON array of integers (validated).
func tokenIDs(raw []byte) (int64, error) {
	s := jsonScanner{jsonscan.Scanner{B: raw}}
	var n int64
	err := s.Array(1, func() error {
		if _, _, err := s.intValue("token id"); err != nil {
			return err
		}
		n++
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("want an array of token ids: %w", err)
	}
	return n, nil
}
