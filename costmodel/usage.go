package costmodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/costgate/costgate/internal/jsonscan"
)

// ErrNoUsage reports a response body without a usage report.
var ErrNoUsage = errors.New("costmodel: response has no usage")

// ErrAmbiguousUsage is a response with more than one usage member (in any
// spelling): its usage cannot be read.
var ErrAmbiguousUsage = fmt.Errorf("%w: more than one usage member", ErrNoUsage)

// openaiUsage is the usage object of chat completions, completions and
// embeddings responses (prompt_/completion_ names) and of Responses API
// responses (input_/output_ names).
type openaiUsage struct {
	PromptTokens            *int64         `json:"prompt_tokens"`
	CompletionTokens        int64          `json:"completion_tokens"`
	PromptTokensDetails     *inputDetails  `json:"prompt_tokens_details"`
	CompletionTokensDetails *outputDetails `json:"completion_tokens_details"`

	InputTokens         *int64         `json:"input_tokens"`
	OutputTokens        int64          `json:"output_tokens"`
	InputTokensDetails  *inputDetails  `json:"input_tokens_details"`
	OutputTokensDetails *outputDetails `json:"output_tokens_details"`

	TotalTokens reportedTotal `json:"total_tokens"`

	// Perplexity's counts, beside the others and outside its total:
	// its reasoning step's tokens (billed as output), the search
	// results the model read (billed as input) and its searches
	// (billed per search).
	ReasoningTokens int64 `json:"reasoning_tokens"`
	CitationTokens  int64 `json:"citation_tokens"`
	SearchQueries   int64 `json:"num_search_queries"`

	// outputSaid tells that completion_tokens or output_tokens gave a
	// count (not null).
	outputSaid bool
}

// statesOutput tells whether o says what was output: a count of it, or
// a total the input is taken from.
func (o *openaiUsage) statesOutput() bool { return o.outputSaid || o.TotalTokens.ok }

// reportedTotal is a usage report's total_tokens, when it is a count (see
// countValue): a total of another type is ignored, and does not make the rest of the
// report unreadable.
type reportedTotal struct {
	n  int64
	ok bool
}

func (t *reportedTotal) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if n, err := countValue(b); err == nil {
		*t = reportedTotal{n, true}
	}
	return nil
}

func (o *openaiUsage) usage() (Usage, bool) {
	if o.PromptTokens == nil && o.InputTokens == nil || o.negative() {
		return Usage{}, false
	}
	// Each kind counts at its larger figure in the two spellings (chat's
	// prompt_ and completion_, the Responses API's input_ and output_),
	// whichever of them names the input: a report in both, or in a mix of
	// the two (prompt_tokens beside output_tokens), bills what either
	// states, as costgate cannot tell which one the upstream bills by.
	var u Usage
	u.InputTokens = max(deref(o.PromptTokens), deref(o.InputTokens))
	u.OutputTokens = max(o.CompletionTokens, o.OutputTokens)
	u.ReasoningTokens = o.ReasoningTokens
	u.WebSearchRequests = o.SearchQueries
	for _, d := range [...]*inputDetails{o.PromptTokensDetails, o.InputTokensDetails} {
		if d != nil {
			u.CachedInputTokens = max(u.CachedInputTokens, d.CachedTokens)
			u.AudioInputTokens = max(u.AudioInputTokens, d.AudioTokens)
		}
	}
	for _, d := range [...]*outputDetails{o.CompletionTokensDetails, o.OutputTokensDetails} {
		if d != nil {
			u.ReasoningTokens = max(u.ReasoningTokens, d.ReasoningTokens)
			u.AudioOutputTokens = max(u.AudioOutputTokens, d.AudioTokens)
		}
	}
	// OpenAI counts reasoning tokens in the completion, and its total is
	// the input and the output. An OpenAI-compatible upstream may count
	// them apart (xAI's reasoning models: reasoning tokens beside
	// completion_tokens, and in the total; Perplexity's: beside it, and
	// out of the total): what a total holds beyond the input and output
	// is charged as output, the dearer rate (as the rate limit service
	// charges such a total), and reasoning tokens above the completion
	// they would be part of are taken to be apart from it, whatever the
	// total says, as are cached tokens above the prompt; Perplexity's
	// citation tokens are input apart from the prompt. Of the two
	// readings of the output, the larger counts; a total short of its
	// parts takes nothing off.
	in, out := max(u.InputTokens, 0), max(u.OutputTokens, 0)
	if u.CachedInputTokens > in {
		in = addSat(in, u.CachedInputTokens)
		u.InputTokens = in
	}
	if o.CitationTokens > 0 {
		in = addSat(in, o.CitationTokens)
		u.InputTokens = in
	}
	if t := o.TotalTokens; t.ok {
		if sum := addSat(in, out); t.n > sum {
			u.OutputTokens = addSat(out, t.n-sum)
		}
	}
	if u.ReasoningTokens > out {
		u.OutputTokens = max(u.OutputTokens, addSat(out, u.ReasoningTokens))
	}
	return u.clamped(), true
}

// negative tells whether a count of the report is below zero: no count
// an upstream bills by, so that the report cannot be read (and is not
// taken for one of no tokens).
func (o *openaiUsage) negative() bool {
	n := min(deref(o.PromptTokens), deref(o.InputTokens), o.CompletionTokens, o.OutputTokens, o.ReasoningTokens, o.CitationTokens, o.SearchQueries)
	if o.TotalTokens.ok {
		n = min(n, o.TotalTokens.n)
	}
	for _, d := range [...]*inputDetails{o.PromptTokensDetails, o.InputTokensDetails} {
		if d != nil {
			n = min(n, d.CachedTokens, d.AudioTokens)
		}
	}
	for _, d := range [...]*outputDetails{o.CompletionTokensDetails, o.OutputTokensDetails} {
		if d != nil {
			n = min(n, d.ReasoningTokens, d.AudioTokens)
		}
	}
	return n < 0
}

// anthropicUsage is the usage object of Anthropic messages: input_tokens
// excludes the tokens read from and written to the prompt cache;
// cache_creation splits the written ones by cache lifetime.
type anthropicUsage struct {
	InputTokens              *int64                  `json:"input_tokens"`
	OutputTokens             *int64                  `json:"output_tokens"`
	CacheCreationInputTokens *int64                  `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64                  `json:"cache_read_input_tokens"`
	CacheCreation            *anthropicCacheCreation `json:"cache_creation"`
	ServerToolUse            *serverToolUse          `json:"server_tool_use"`
	InferenceGeo             string                  `json:"inference_geo"` // where inference ran: "us" is priced apart
	Speed                    string                  `json:"speed"`         // the speed it was served at: "fast" is priced apart
	// Iterations adds up the usage of each sampling step the request
	// ran, when the answer lists them: a server-side compaction
	// (context_management's compact_20260112) is a step of its own,
	// billed, which the counts above leave out.
	Iterations *anthropicIterations `json:"iterations"`
}

// anthropicCacheCreation splits cache writes by cache lifetime.
type anthropicCacheCreation struct {
	Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
	Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
}

// usage is the usage a is billed for: its counts, or, each kind at its
// largest, the sum of its iterations (which holds the steps the counts
// leave out).
func (a *anthropicUsage) usage() Usage {
	u := a.counts()
	if it := a.Iterations; it != nil {
		u = maxEach(u, it.usage)
	}
	return u
}

// counts is the usage a's counts state, its iterations aside.
func (a *anthropicUsage) counts() Usage {
	var u Usage
	read, write := max(deref(a.CacheReadInputTokens), 0), max(deref(a.CacheCreationInputTokens), 0)
	if c := a.CacheCreation; c != nil {
		// The split is authoritative when it says more than the total.
		u.CacheWrite1hTokens = max(c.Ephemeral1h, 0)
		write = max(write, addSat(max(c.Ephemeral5m, 0), u.CacheWrite1hTokens))
	}
	u.InputTokens = addSat(addSat(max(deref(a.InputTokens), 0), read), write)
	u.CachedInputTokens = read
	u.CacheWriteTokens = write
	u.OutputTokens = deref(a.OutputTokens)
	if s := a.ServerToolUse; s != nil {
		u.WebSearchRequests = s.WebSearchRequests
	}
	u.InferenceGeo = a.InferenceGeo
	u.Speed = a.Speed
	return u.clamped()
}

// negative tells whether a count of the report is below zero (see
// openaiUsage.negative).
func (a *anthropicUsage) negative() bool {
	n := min(deref(a.InputTokens), deref(a.OutputTokens), deref(a.CacheCreationInputTokens), deref(a.CacheReadInputTokens))
	if c := a.CacheCreation; c != nil {
		n = min(n, c.Ephemeral5m, c.Ephemeral1h)
	}
	if s := a.ServerToolUse; s != nil {
		n = min(n, s.WebSearchRequests)
	}
	return n < 0 || a.Iterations != nil && a.Iterations.negative
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
	u.CacheWrite1hTokens = min(max(u.CacheWrite1hTokens, 0), u.CacheWriteTokens)
	u.AudioInputTokens = min(max(u.AudioInputTokens, 0), u.InputTokens-u.CachedInputTokens-u.CacheWriteTokens)
	u.OutputTokens = max(u.OutputTokens, 0)
	u.ReasoningTokens = min(max(u.ReasoningTokens, 0), u.OutputTokens)
	u.AudioOutputTokens = min(max(u.AudioOutputTokens, 0), u.OutputTokens)
	u.WebSearchRequests = max(u.WebSearchRequests, 0)
	u.FileSearchCalls = max(u.FileSearchCalls, 0)
	u.ContainerGB = max(u.ContainerGB, 0)
	u.Units = max(u.Units, 0)
	return u
}

// maxEach is the usage that counts each kind u and v report (both
// clamped) at the larger of the two: the prompt's uncached tokens, those
// read from and written to each cache lifetime, the output and its parts,
// the searches; of the rates' names, v's service tier where it gives one,
// and an inference geography or a speed that is dearer than the standard
// (see Price) where either gives one. Two reports of one answer
// (running totals, a report repeated) are billed at no less than either.
func maxEach(u, v Usage) Usage {
	uncached := func(x Usage) int64 { return x.InputTokens - x.CachedInputTokens - x.CacheWriteTokens }
	r := u
	r.CachedInputTokens = max(u.CachedInputTokens, v.CachedInputTokens)
	r.CacheWrite1hTokens = max(u.CacheWrite1hTokens, v.CacheWrite1hTokens)
	r.CacheWriteTokens = addSat(max(u.CacheWriteTokens-u.CacheWrite1hTokens, v.CacheWriteTokens-v.CacheWrite1hTokens), r.CacheWrite1hTokens)
	r.InputTokens = addSat(addSat(max(uncached(u), uncached(v)), r.CachedInputTokens), r.CacheWriteTokens)
	r.AudioInputTokens = max(u.AudioInputTokens, v.AudioInputTokens)
	r.OutputTokens = max(u.OutputTokens, v.OutputTokens)
	r.ReasoningTokens = max(u.ReasoningTokens, v.ReasoningTokens)
	r.AudioOutputTokens = max(u.AudioOutputTokens, v.AudioOutputTokens)
	r.WebSearchRequests = max(u.WebSearchRequests, v.WebSearchRequests)
	r.FileSearchCalls = max(u.FileSearchCalls, v.FileSearchCalls)
	r.ContainerGB = max(u.ContainerGB, v.ContainerGB)
	r.Units = max(u.Units, v.Units)
	if v.ServiceTier != "" {
		r.ServiceTier = v.ServiceTier
	}
	if v.InferenceGeo != "" && (r.InferenceGeo == "" || r.InferenceGeo == "global") {
		r.InferenceGeo = v.InferenceGeo
	}
	if v.Speed != "" && (r.Speed == "" || r.Speed == "standard") {
		r.Speed = v.Speed
	}
	r.Steps = u.Steps.merge(v.Steps)
	return r.clamped()
}

// outputItem is an element of a Responses API response's output: a
// message, a reasoning item, a tool call ("web_search_call" is billed per
// call).
type outputItem struct {
	Type string `json:"type"`
}

// countItems counts the items of a Responses output of type typ
// ("web_search_call" and "file_search_call" are billed per call).
func countItems(items []outputItem, typ string) int64 {
	var n int64
	for _, it := range items {
		if it.Type == typ {
			n++
		}
	}
	return n
}

// openaiResponse is the part of an OpenAI response body that prices it.
type openaiResponse struct {
	ID          string       `json:"id"` // Responses API only: the stored answer's id
	Usage       *openaiUsage `json:"usage"`
	Model       string       `json:"model"`
	ServiceTier string       `json:"service_tier"`
	Output      []outputItem `json:"output"` // Responses API only
}

// anthropicResponse is the part of an Anthropic response body that prices
// it. Anthropic's usage.service_tier is not read: its priority tier is
// priced by contract, not by a published rate.
type anthropicResponse struct {
	Usage *anthropicUsage `json:"usage"`
	Model string          `json:"model"`
}

func (r *openaiResponse) result(kind Kind) (Usage, string, error) {
	if r.Usage == nil {
		return Usage{}, r.Model, ErrNoUsage
	}
	u, ok := r.Usage.usage()
	if !ok || kind != Embeddings && !r.Usage.statesOutput() {
		// A report of the input alone says nothing of the output: it
		// cannot be read, rather than be one of no output.
		return Usage{}, r.Model, ErrNoUsage
	}
	u.ServiceTier = r.ServiceTier
	if kind == Responses {
		u.WebSearchRequests = max(u.WebSearchRequests, countItems(r.Output, "web_search_call"))
		u.FileSearchCalls = countItems(r.Output, "file_search_call")
	}
	return u, r.Model, nil
}

func (r *anthropicResponse) result() (Usage, string, error) {
	if r.Usage == nil || r.Usage.OutputTokens == nil && !r.Usage.Iterations.statesOutput() || r.Usage.negative() {
		// A report without output_tokens says nothing of the output:
		// it cannot be read, rather than be one of no output. (One
		// without input_tokens is read; its input is the prompt's
		// count, which the caller has.)
		return Usage{}, r.Model, ErrNoUsage
	}
	return r.Usage.usage(), r.Model, nil
}

// ParseUsage reads the usage an API reported in a JSON response body:
// usage.prompt_tokens and usage.completion_tokens with their cached, audio
// and reasoning details (chat completions, completions, embeddings),
// usage.input_tokens and usage.output_tokens with their details (Responses),
// or Anthropic's usage with its cache read and creation tokens (which
// ParseUsage adds to InputTokens), their split by cache lifetime, and its
// server tool use. For OpenAI kinds it also sets Usage.ServiceTier from the
// body's service_tier, and for Responses Usage.WebSearchRequests from the
// web_search_call items of its output. A body that is not JSON gives a
// *BadRequestError; a body without usage, or whose usage does not state
// the output (for the kinds that output: a report of the input alone is
// not one of no output), gives ErrNoUsage. An Anthropic report without
// input_tokens is read, with no uncached input: its caller, which counted
// the prompt, charges that count.
//
// It makes one validating pass over the body (jsonScanner) and decodes the
// members it needs alone, instead of encoding/json's two passes over the
// whole body: the answer is the same (FuzzParseUsageFast checks it), and a
// long completion costs a fraction. Members are matched as encoding/json
// matches them (case-insensitively; of repeated ones, the last wins).
func ParseUsage(kind Kind, body []byte) (Usage, error) {
	u, _, err := ParseResponse(kind, body)
	return u, err
}

// ParseResponse is ParseUsage that also returns the model the response
// says served the request (its top-level "model"; "" when it names none),
// even when the body has no usage (err ErrNoUsage). Settlement should price
// that model (Estimator.Cost) rather than the one the client asked for.
func ParseResponse(kind Kind, body []byte) (u Usage, model string, err error) {
	// Two usage members: which report counts is the reader's choice
	// (encoding/json takes the last, the official SDKs the first), and
	// neither is billed (ErrAmbiguousUsage). The fast path counts them in
	// its one scan.
	u, model, ok, err := parseUsageFast(kind, body)
	if !ok {
		if usageMembers(body) > 1 {
			return Usage{}, "", ErrAmbiguousUsage
		}
		u, model, err = parseResponse(kind, body)
	}
	return u, servedModel(model), err
}

// usageMembers counts the top-level members of a JSON object named
// "usage" in any case; 0 for a body that is not one.
func usageMembers(body []byte) int {
	s := jsonscan.Scanner{B: body}
	if s.Peek() != '{' {
		return 0
	}
	n := 0
	s.Object(1, func(ks, ke int, esc bool) error {
		name := s.KeyBytes(ks, ke, esc)
		if named(name, "usage") {
			n++
		}
		_, _, err := s.Value(1)
		return err
	})
	return n
}

// servedModel is model, the name an answer gives the model that served
// it, when it can name one: printable text of at most 200 bytes. Any
// other ("gpt-4o-mini\u0000", a 5,000-byte name) is "", so that the
// request is priced and recorded under the model it asked for: such a
// name prices at no model's price, and the ledger would refuse the entry
// that carried it.
func servedModel(model string) string {
	if len(model) > 200 || !utf8.ValidString(model) {
		return ""
	}
	for _, r := range model {
		// U+FFFD is what encoding/json makes of invalid UTF-8: no
		// model's name holds it.
		if !unicode.IsPrint(r) || r == utf8.RuneError {
			return ""
		}
	}
	return model
}

// responseMembers are the top-level members of a response body that
// ParseResponse decodes, in this order in parseUsageFast.
var responseMembers = [...]string{"usage", "model", "service_tier", "output"}

// parseUsageFast is ParseResponse for a body that is one valid JSON object
// whose members decode without error; ok is false for any other body,
// which parseResponse then reads (to give its errors).
func parseUsageFast(kind Kind, body []byte) (u Usage, model string, ok bool, err error) {
	switch kind {
	case ChatCompletions, Completions, Embeddings, Responses, AnthropicMessages:
	default:
		return Usage{}, "", false, nil
	}
	s := jsonScanner{jsonscan.Scanner{B: body}}
	if s.Peek() != '{' {
		return Usage{}, "", false, nil
	}
	// encoding/json matches a member to the field case-insensitively, and
	// decodes every match, in order, into the same field.
	type match struct {
		field int
		span
	}
	var found [6]match
	matches := found[:0]
	fields := len(responseMembers)
	if kind != Responses {
		fields-- // no output
	}
	if kind == AnthropicMessages {
		fields = 2 // usage, model
	}
	if err := s.Object(1, func(ks, ke int, esc bool) error {
		name := s.KeyBytes(ks, ke, esc)
		st, en, err := s.Value(1)
		if err != nil {
			return err
		}
		for i, f := range responseMembers[:fields] {
			if named(name, f) {
				matches = append(matches, match{i, span{st, en}})
				break
			}
		}
		return nil
	}); err != nil || s.End() != nil {
		return Usage{}, "", false, nil
	}
	usages := 0
	for _, m := range matches {
		if m.field == 0 { // usage
			usages++
		}
	}
	if usages > 1 {
		return Usage{}, "", true, ErrAmbiguousUsage
	}
	if kind == AnthropicMessages {
		var r anthropicResponse
		for _, m := range matches {
			var dst any = &r.Usage
			if m.field == 1 {
				dst = &r.Model
			}
			if json.Unmarshal(body[m.start:m.end], dst) != nil {
				return Usage{}, "", false, nil
			}
		}
		u, model, err := r.result()
		return u, model, true, err
	}
	var r openaiResponse
	for _, m := range matches {
		raw := body[m.start:m.end]
		var err error
		switch m.field {
		case 0:
			// A second match (another spelling) merges into the first,
			// as encoding/json does: only a first is read plainly.
			if u := new(openaiUsage); r.Usage == nil && decodeUsagePlain(raw, u) {
				r.Usage = u
			} else {
				err = json.Unmarshal(raw, &r.Usage)
			}
		case 1:
			err = decodeStringValue(raw, &r.Model)
		case 2:
			err = decodeStringValue(raw, &r.ServiceTier)
		default:
			err = json.Unmarshal(raw, &r.Output)
		}
		if err != nil {
			return Usage{}, "", false, nil
		}
	}
	u, model, err = r.result(kind)
	return u, model, true, err
}

// parseUsage is ParseUsage through encoding/json alone.
func parseUsage(kind Kind, body []byte) (Usage, error) {
	u, _, err := parseResponse(kind, body)
	return u, err
}

// parseResponse is ParseResponse through encoding/json alone.
func parseResponse(kind Kind, body []byte) (Usage, string, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return Usage{}, "", ErrNoUsage
	}
	switch kind {
	case ChatCompletions, Completions, Embeddings:
		var r struct {
			Usage       *openaiUsage `json:"usage"`
			Model       string       `json:"model"`
			ServiceTier string       `json:"service_tier"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return Usage{}, "", badRequest(kind, err, "invalid JSON response")
		}
		or := openaiResponse{Usage: r.Usage, Model: r.Model, ServiceTier: r.ServiceTier}
		return or.result(kind)
	case Responses:
		var r struct { // not the id, which ParseResponse does not read
			Usage       *openaiUsage `json:"usage"`
			Model       string       `json:"model"`
			ServiceTier string       `json:"service_tier"`
			Output      []outputItem `json:"output"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return Usage{}, "", badRequest(kind, err, "invalid JSON response")
		}
		or := openaiResponse{Usage: r.Usage, Model: r.Model, ServiceTier: r.ServiceTier, Output: r.Output}
		return or.result(kind)
	case AnthropicMessages:
		var r anthropicResponse
		if err := json.Unmarshal(body, &r); err != nil {
			return Usage{}, "", badRequest(kind, err, "invalid JSON response")
		}
		return r.result()
	}
	return Usage{}, "", badRequest(kind, nil, "no usage format for %s responses", kind)
}

// ResponseID returns the id of a Responses answer (its top-level "id"),
// or "" when it has none that is a string. It reads the answer up to the
// id, which upstreams write first, and no further.
func ResponseID(body []byte) string {
	var id string
	_ = scanEvent(body, func(s *jsonScanner, key string) error {
		if key == "id" {
			if err := readStringInto(s, &id); err != nil {
				return err
			}
			return errFound
		}
		_, _, err := s.Value(1)
		return err
	})
	return id
}

// ResponseRunning tells whether a Responses answer says its run is not
// over (its top-level "status" is "queued" or "in_progress", as a
// background request is answered): whatever usage it states is not what
// the run bills. A member is matched as ParseResponse matches the usage,
// in any case and spelling (encoding/json's reading); of several, any
// that says the run is not over says it: one reader takes the first,
// another the last, and a run read as over is billed its stated usage.
func ResponseRunning(body []byte) bool {
	running := false
	_ = topMembers(body, func(s *jsonScanner, name []byte) error {
		if !named(name, "status") || s.Peek() != '"' {
			_, _, err := s.Value(1)
			return err
		}
		var status string
		if err := readStringInto(s, &status); err != nil {
			return err
		}
		running = running || status == "queued" || status == "in_progress"
		return nil
	})
	return running
}

// AnswerKinds lists the APIs an upstream's answer says it comes from:
// each top-level "object" OpenAI names its answers by ("chat.completion",
// "text_completion", "response", "list"), and a "type" "message"
// (Anthropic's), its members matched in any case and spelling, every one
// of them (a body may name two, which readers take differently). None when
// it names no API costgate knows, or is not a JSON object.
func AnswerKinds(body []byte) []Kind {
	var kinds []Kind
	add := func(k Kind) {
		for _, have := range kinds {
			if have == k {
				return
			}
		}
		kinds = append(kinds, k)
	}
	err := topMembers(body, func(s *jsonScanner, name []byte) error {
		object, typ := named(name, "object"), named(name, "type")
		if !object && !typ || s.Peek() != '"' {
			_, _, err := s.Value(1)
			return err
		}
		var v string
		if err := readStringInto(s, &v); err != nil {
			return err
		}
		switch {
		case object && v == "chat.completion":
			add(ChatCompletions)
		case object && v == "text_completion":
			add(Completions)
		case object && v == "response":
			add(Responses)
		case object && v == "list":
			add(Embeddings)
		case typ && v == "message":
			add(AnthropicMessages)
		}
		return nil
	})
	if err != nil {
		return nil
	}
	return kinds
}

// topMembers calls member with the name (unescaped) of each top-level
// member of body, a JSON object, with the scanner at its value, which
// member reads. It is the error of the scan, or of member.
func topMembers(body []byte, member func(s *jsonScanner, name []byte) error) error {
	s := jsonScanner{jsonscan.Scanner{B: body}}
	if s.Peek() != '{' {
		return wrongType("want an object")
	}
	err := s.Object(1, func(ks, ke int, esc bool) error {
		return member(&s, s.KeyBytes(ks, ke, esc))
	})
	if err == nil {
		err = s.End()
	}
	return err
}

// errFound stops a scan that found what it looked for.
var errFound = errors.New("costmodel: found")
