package costmodel

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/costgate/costgate/internal/jsonscan"
)

// The usage of an OpenAI-shaped answer, read without encoding/json for the
// shape upstreams send: every member name in lower case and given once,
// integers, objects for the details. Anything else (a name in another
// case, which encoding/json would match; a member given twice, which it
// would merge; a null; a number with a fraction or out of range) is left
// to json.Unmarshal, so that the answer is always encoding/json's
// (FuzzParseUsageFast, FuzzParseResponseFast).

// errNotPlain stops a fast read that found a member encoding/json must
// read.
var errNotPlain = errors.New("costmodel: not a plain usage object")

// usageNames are openaiUsage's members; detailNames a details object's.
var (
	usageNames = [...]string{"prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details",
		"input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details", "total_tokens",
		"reasoning_tokens", "citation_tokens", "num_search_queries"}
	detailNames = [...]string{"cached_tokens", "audio_tokens", "reasoning_tokens"}
)

// decodeUsagePlain reads raw, a valid JSON value, into o; false when raw
// is not of the plain shape (o is then unspecified).
func decodeUsagePlain(raw []byte, o *openaiUsage) bool {
	s := jsonScanner{jsonscan.Scanner{B: raw}}
	if s.Peek() != '{' {
		return false
	}
	var seen [len(usageNames)]bool
	err := s.Object(1, func(ks, ke int, esc bool) error {
		i, ok := plainName(s.B[ks:ke], esc, usageNames[:])
		switch {
		case !ok:
			return errNotPlain
		case i < 0: // not a member openaiUsage has
			_, _, err := s.Value(1)
			return err
		case seen[i]:
			return errNotPlain
		}
		seen[i] = true
		switch usageNames[i] {
		case "prompt_tokens":
			o.PromptTokens = new(int64)
			return plainInt(&s, o.PromptTokens)
		case "completion_tokens":
			o.outputSaid = true
			return plainInt(&s, &o.CompletionTokens)
		case "input_tokens":
			o.InputTokens = new(int64)
			return plainInt(&s, o.InputTokens)
		case "output_tokens":
			o.outputSaid = true
			return plainInt(&s, &o.OutputTokens)
		case "total_tokens":
			o.TotalTokens.ok = true
			return plainInt(&s, &o.TotalTokens.n)
		case "reasoning_tokens":
			return plainInt(&s, &o.ReasoningTokens)
		case "citation_tokens":
			return plainInt(&s, &o.CitationTokens)
		case "num_search_queries":
			return plainInt(&s, &o.SearchQueries)
		case "prompt_tokens_details":
			o.PromptTokensDetails = new(inputDetails)
			return plainDetails(&s, &o.PromptTokensDetails.CachedTokens, &o.PromptTokensDetails.AudioTokens, nil)
		case "input_tokens_details":
			o.InputTokensDetails = new(inputDetails)
			return plainDetails(&s, &o.InputTokensDetails.CachedTokens, &o.InputTokensDetails.AudioTokens, nil)
		case "completion_tokens_details":
			o.CompletionTokensDetails = new(outputDetails)
			return plainDetails(&s, nil, &o.CompletionTokensDetails.AudioTokens, &o.CompletionTokensDetails.ReasoningTokens)
		default: // output_tokens_details
			o.OutputTokensDetails = new(outputDetails)
			return plainDetails(&s, nil, &o.OutputTokensDetails.AudioTokens, &o.OutputTokensDetails.ReasoningTokens)
		}
	})
	return err == nil && s.End() == nil
}

// plainDetails reads a details object at s.I: cached, audio and reasoning
// are its members' fields, nil for a member the object's type does not
// have (then skipped, as encoding/json skips it).
func plainDetails(s *jsonScanner, cached, audio, reasoning *int64) error {
	if s.Peek() != '{' {
		return errNotPlain
	}
	var seen [len(detailNames)]bool
	return s.Object(2, func(ks, ke int, esc bool) error {
		i, ok := plainName(s.B[ks:ke], esc, detailNames[:])
		switch {
		case !ok:
			return errNotPlain
		case i < 0:
			_, _, err := s.Value(2)
			return err
		case seen[i]:
			return errNotPlain
		}
		seen[i] = true
		dst := [...]*int64{cached, audio, reasoning}[i]
		if dst == nil {
			_, _, err := s.Value(2)
			return err
		}
		return plainInt(s, dst)
	})
}

// plainName finds name among names: its index, or -1 for a name that no
// spelling of theirs matches; ok is false for a name encoding/json might
// match to one of them although it is not written as it (another case, an
// escape, a letter beyond ASCII that folds to an ASCII one).
func plainName(name []byte, escaped bool, names []string) (i int, ok bool) {
	if escaped {
		return 0, false
	}
	for i, n := range names {
		if string(name) == n {
			return i, true
		}
	}
	for _, n := range names {
		if bytes.EqualFold(name, []byte(n)) {
			return 0, false
		}
	}
	for _, c := range name {
		if c >= 0x80 {
			return 0, false // folding beyond simple case: left to encoding/json
		}
	}
	return -1, true
}

// plainInt reads the value at s.I into n by the scanner's intValue: an
// integer that fits; anything else, null included (which encoding/json
// reads into a pointer as nil), is errNotPlain.
func plainInt(s *jsonScanner, n *int64) error {
	v, ok, err := s.intValue("")
	if err != nil || !ok {
		return errNotPlain
	}
	*n = v
	return nil
}

// decodeStringValue reads a JSON value raw into v as json.Unmarshal
// would: directly when it holds no escape and no byte beyond ASCII.
// (jsonScanner.stringValue passes bytes beyond ASCII through as they are,
// where encoding/json turns invalid UTF-8 into U+FFFD.)
func decodeStringValue(raw []byte, v *string) error {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		text := raw[1 : len(raw)-1]
		plain := true
		for _, c := range text {
			if c == '\\' || c >= 0x80 {
				plain = false
				break
			}
		}
		if plain {
			*v = string(text)
			return nil
		}
	}
	return json.Unmarshal(raw, v)
}
