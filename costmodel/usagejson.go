package costmodel

// Usage objects are decoded member by member, as encoding/json matches
// their members (in any case), with one difference: a count given more
// than once ("completion_tokens":3000,"completion_tokens":5, or
// "Completion_Tokens" beside it) counts at its largest, where
// encoding/json keeps the last and the official SDKs the first. Which one
// the upstream bills by, costgate cannot tell; it charges no less than
// either. A null leaves a count as an earlier member set it. A count is
// read as the SDKs read it (see countValue): "1000", 1000.0 and 1e3 are
// 1000 tokens.

import (
	"bytes"
	"encoding/json"
	"math/big"
	"slices"
	"strconv"

	"github.com/costgate/costgate/internal/jsonscan"
)

// eachMember calls fn with the name (unescaped) and the value of each
// member of raw, a JSON object that encoding/json has checked; a value
// that is not an object is an error.
func eachMember(raw []byte, fn func(name, value []byte) error) error {
	s := jsonscan.Scanner{B: raw}
	if s.Peek() != '{' {
		if _, _, err := s.Value(0); err != nil {
			return err
		}
		return wrongType("usage: want an object")
	}
	return s.Object(1, func(ks, ke int, esc bool) error {
		name := s.KeyBytes(ks, ke, esc)
		st, en, err := s.Value(1)
		if err != nil {
			return err
		}
		return fn(name, s.B[st:en])
	})
}

// named tells whether a member's name is field's to encoding/json: in
// any case (bytes.EqualFold; a case variant is never shorter, as the
// non-ASCII letters that fold to ASCII ones, U+017F and U+212A, take more
// bytes).
func named(name []byte, field string) bool {
	return len(name) >= len(field) && bytes.EqualFold(name, []byte(field))
}

// maxCount decodes value, a JSON integer, into *n, or into n's larger of
// what it holds and value when set tells that an earlier member gave it;
// null leaves it. It reports whether n is set after.
func maxCount(value []byte, n *int64, set bool) (bool, error) {
	if string(value) == "null" {
		return set, nil
	}
	v, err := countValue(value)
	if err != nil {
		return set, err
	}
	if !set || v > *n {
		*n = v
	}
	return true, nil
}

// countValue reads a count as the SDKs read one (pydantic, JavaScript's
// numbers): a JSON number, or a string holding one, in any form
// ("1000", 1000.0, 1e3); a fraction counts as the next integer up. A
// value that is not a number, or is out of int64's range, is an error.
func countValue(value []byte) (int64, error) {
	text := value
	if len(value) > 0 && value[0] == '"' {
		var str string
		if err := json.Unmarshal(value, &str); err != nil {
			return 0, err
		}
		text = []byte(str)
	}
	if n, err := strconv.ParseInt(string(text), 10, 64); err == nil {
		return n, nil
	}
	// No count in a form the SDKs write is longer: a decimal's parse is
	// quadratic in its digits (a million of them, 1.5 s of CPU).
	if len(text) > maxCountText {
		return 0, wrongType("usage: a count of %d bytes is out of range", len(text))
	}
	f, _, err := big.ParseFloat(string(text), 10, 256, big.ToNearestEven)
	if err != nil || f.IsInf() {
		return 0, wrongType("usage: count %s is not a number", value)
	}
	// Out of range before it becomes an integer: 1e999999999 is a few
	// bytes of JSON and 415 MB as a big.Int.
	if f.MantExp(nil) > 64 {
		return 0, wrongType("usage: count %s is out of range", value)
	}
	i, _ := f.Int(nil) // toward zero
	if f.Sign() > 0 && !f.IsInt() {
		i.Add(i, big.NewInt(1))
	}
	if !i.IsInt64() {
		return 0, wrongType("usage: count %s is out of range", value)
	}
	return i.Int64(), nil
}

// maxCountText bounds the text of a count that is not a plain integer
// (see countValue).
const maxCountText = 64

// maxCountPtr is maxCount for a count that is nil until a member gives
// it.
func maxCountPtr(value []byte, p **int64) error {
	if *p == nil {
		var n int64
		if set, err := maxCount(value, &n, false); err != nil || !set {
			return err
		}
		*p = &n
		return nil
	}
	_, err := maxCount(value, *p, true)
	return err
}

// maxObject decodes value, an object or null, into **p with its own
// UnmarshalJSON, which merges into what an earlier member gave.
func maxObject[T any, P interface {
	*T
	json.Unmarshaler
}](value []byte, p *P) error {
	if string(value) == "null" {
		return nil
	}
	if *p == nil {
		*p = new(T)
	}
	return (*p).UnmarshalJSON(value)
}

// counts decodes an object of counts into dst (names[i] into *dst[i]), at
// the largest of each count given more than once; a member not named is
// skipped. Counts left unset by every member keep the value they had.
func counts(raw []byte, names []string, dst []*int64) error {
	var set [4]bool
	return eachMember(raw, func(name, value []byte) error {
		for i, f := range names {
			if named(name, f) {
				var err error
				set[i], err = maxCount(value, dst[i], set[i] || *dst[i] != 0)
				return err
			}
		}
		return nil
	})
}

// inputDetails is an OpenAI usage's prompt_tokens_details or
// input_tokens_details.
type inputDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
	AudioTokens  int64 `json:"audio_tokens"`
}

func (d *inputDetails) UnmarshalJSON(raw []byte) error {
	return counts(raw, []string{"cached_tokens", "audio_tokens"}, []*int64{&d.CachedTokens, &d.AudioTokens})
}

// outputDetails is an OpenAI usage's completion_tokens_details or
// output_tokens_details.
type outputDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
	AudioTokens     int64 `json:"audio_tokens"`
}

func (d *outputDetails) UnmarshalJSON(raw []byte) error {
	return counts(raw, []string{"reasoning_tokens", "audio_tokens"}, []*int64{&d.ReasoningTokens, &d.AudioTokens})
}

// UnmarshalJSON decodes an OpenAI-shaped usage object (see the top of
// this file).
func (o *openaiUsage) UnmarshalJSON(raw []byte) error {
	var completionSet, outputSet, reasoningSet, citationSet, searchesSet bool
	return eachMember(raw, func(name, value []byte) error {
		var err error
		switch {
		case named(name, "prompt_tokens"):
			err = maxCountPtr(value, &o.PromptTokens)
		case named(name, "input_tokens"):
			err = maxCountPtr(value, &o.InputTokens)
		case named(name, "completion_tokens"):
			completionSet, err = maxCount(value, &o.CompletionTokens, completionSet)
			o.outputSaid = o.outputSaid || completionSet
		case named(name, "output_tokens"):
			outputSet, err = maxCount(value, &o.OutputTokens, outputSet)
			o.outputSaid = o.outputSaid || outputSet
		case named(name, "total_tokens"):
			var t reportedTotal
			_ = t.UnmarshalJSON(value)
			if t.ok && (!o.TotalTokens.ok || t.n > o.TotalTokens.n) {
				o.TotalTokens = t
			}
		case named(name, "reasoning_tokens"):
			reasoningSet, err = maxCount(value, &o.ReasoningTokens, reasoningSet)
		case named(name, "citation_tokens"):
			citationSet, err = maxCount(value, &o.CitationTokens, citationSet)
		case named(name, "num_search_queries"):
			searchesSet, err = maxCount(value, &o.SearchQueries, searchesSet)
		case named(name, "prompt_tokens_details"):
			err = maxObject(value, &o.PromptTokensDetails)
		case named(name, "input_tokens_details"):
			err = maxObject(value, &o.InputTokensDetails)
		case named(name, "completion_tokens_details"):
			err = maxObject(value, &o.CompletionTokensDetails)
		case named(name, "output_tokens_details"):
			err = maxObject(value, &o.OutputTokensDetails)
		}
		return err
	})
}

// serverToolUse is an Anthropic usage's server_tool_use.
type serverToolUse struct {
	WebSearchRequests int64 `json:"web_search_requests"`
}

func (s *serverToolUse) UnmarshalJSON(raw []byte) error {
	return counts(raw, []string{"web_search_requests"}, []*int64{&s.WebSearchRequests})
}

func (c *anthropicCacheCreation) UnmarshalJSON(raw []byte) error {
	return counts(raw, []string{"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"}, []*int64{&c.Ephemeral5m, &c.Ephemeral1h})
}

// UnmarshalJSON decodes an Anthropic usage object (see the top of this
// file). Of its strings given more than once, the last counts, as in
// encoding/json.
func (a *anthropicUsage) UnmarshalJSON(raw []byte) error {
	return eachMember(raw, func(name, value []byte) error {
		switch {
		case named(name, "input_tokens"):
			return maxCountPtr(value, &a.InputTokens)
		case named(name, "output_tokens"):
			return maxCountPtr(value, &a.OutputTokens)
		case named(name, "cache_creation_input_tokens"):
			return maxCountPtr(value, &a.CacheCreationInputTokens)
		case named(name, "cache_read_input_tokens"):
			return maxCountPtr(value, &a.CacheReadInputTokens)
		case named(name, "cache_creation"):
			return maxObject(value, &a.CacheCreation)
		case named(name, "server_tool_use"):
			return maxObject(value, &a.ServerToolUse)
		case named(name, "iterations"):
			return maxObject(value, &a.Iterations)
		case named(name, "inference_geo"):
			return json.Unmarshal(value, &a.InferenceGeo)
		case named(name, "speed"):
			return json.Unmarshal(value, &a.Speed)
		}
		return nil
	})
}

// anthropicIterations is an Anthropic usage's iterations, the usage of
// each sampling step of the request (a "compaction", a "message", an
// "advisor_message", a "fallback_message"), added up: Anthropic bills
// their sum, and its top-level counts leave the compaction steps out.
// The steps that name their model are kept by model (Usage.Steps): an
// advisor's sub-inference runs on a model other than the one asked for,
// as does a fallback model's turn, and each is billed at its model's
// price. Given more than once, each count is the larger sum.
type anthropicIterations struct {
	usage      Usage // the steps' counts added up (the larger sum of each, given twice), with their Steps
	inputSaid  bool  // a step states an input count
	outputSaid bool  // a step states an output count
	negative   bool  // a step states a count below zero, or the steps name more than maxStepModels models
}

func (it *anthropicIterations) UnmarshalJSON(raw []byte) error {
	s := jsonscan.Scanner{B: raw}
	if s.Peek() != '[' {
		if _, _, err := s.Value(0); err != nil {
			return err
		}
		return wrongType("usage: iterations: want an array")
	}
	var sum anthropicUsage
	var byModel []modelSum
	err := s.Array(1, func() error {
		st, en, err := s.Value(1)
		if err != nil {
			return err
		}
		var step anthropicUsage
		if err := step.UnmarshalJSON(raw[st:en]); err != nil {
			return err
		}
		it.negative = it.negative || step.negative()
		sum.add(&step)
		// A step that names its model (an advisor's sub-inference, a
		// fallback model's turn) is priced at that model's price.
		if m := stepModel(raw[st:en]); m != "" {
			i := slices.IndexFunc(byModel, func(b modelSum) bool { return b.model == m })
			if i < 0 {
				i = len(byModel)
				byModel = append(byModel, modelSum{model: m})
			}
			byModel[i].sum.add(&step)
		}
		return nil
	})
	if err != nil {
		return err
	}
	u := sum.counts()
	if len(byModel) > maxStepModels {
		it.negative = true
	} else if len(byModel) > 0 {
		u.Steps = &Steps{parts: make([]modelUsage, len(byModel))}
		for i, b := range byModel {
			u.Steps.parts[i] = modelUsage{b.model, b.sum.counts()}
		}
	}
	it.usage = maxEach(it.usage, u)
	it.inputSaid = it.inputSaid || sum.InputTokens != nil || sum.CacheReadInputTokens != nil || sum.CacheCreationInputTokens != nil
	it.outputSaid = it.outputSaid || sum.OutputTokens != nil
	return nil
}

// statesOutput tells whether some step of it states an output count;
// false for nil.
func (it *anthropicIterations) statesOutput() bool { return it != nil && it.outputSaid }

// modelSum is the steps of one model added up.
type modelSum struct {
	model string
	sum   anthropicUsage
}

// stepModel is the model an iteration of Anthropic's usage names (its
// "model", a string an answer may name a model by: see servedModel), or
// "" for one that names none.
func stepModel(raw []byte) string {
	var model string
	eachMember(raw, func(name, value []byte) error {
		if named(name, "model") {
			var m string
			if json.Unmarshal(value, &m) == nil {
				model = servedModel(m)
			}
		}
		return nil
	})
	return model
}

// add adds the token counts of step to a's, saturating.
func (a *anthropicUsage) add(step *anthropicUsage) {
	for _, p := range [...]struct{ dst, src **int64 }{
		{&a.InputTokens, &step.InputTokens}, {&a.OutputTokens, &step.OutputTokens},
		{&a.CacheCreationInputTokens, &step.CacheCreationInputTokens}, {&a.CacheReadInputTokens, &step.CacheReadInputTokens},
	} {
		if *p.src != nil {
			v := addSat(deref(*p.dst), max(**p.src, 0))
			*p.dst = &v
		}
	}
	if c := step.CacheCreation; c != nil {
		if a.CacheCreation == nil {
			a.CacheCreation = new(anthropicCacheCreation)
		}
		a.CacheCreation.Ephemeral5m = addSat(a.CacheCreation.Ephemeral5m, max(c.Ephemeral5m, 0))
		a.CacheCreation.Ephemeral1h = addSat(a.CacheCreation.Ephemeral1h, max(c.Ephemeral1h, 0))
	}
}
