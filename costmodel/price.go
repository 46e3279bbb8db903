package costmodel

import (
	"cmp"
	_ "embed"
	"fmt"
	"iter"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Usage is the token and unit consumption of one request, estimated before it
// is served or reported after. The zero value is no usage. The parts
// (cached, cache-written, audio, reasoning tokens) are included in their
// wholes (InputTokens, OutputTokens).
type Usage struct {
	InputTokens        int64 `json:"input_tokens"`                    // all prompt tokens, cached, cache-written and audio ones included
	CachedInputTokens  int64 `json:"cached_input_tokens,omitempty"`   // part of InputTokens read from a prompt cache
	CacheWriteTokens   int64 `json:"cache_write_tokens,omitempty"`    // part of InputTokens written to a prompt cache (Anthropic), both lifetimes
	CacheWrite1hTokens int64 `json:"cache_write_1h_tokens,omitempty"` // part of CacheWriteTokens written to the 1-hour cache; the rest went to the 5-minute one
	AudioInputTokens   int64 `json:"audio_input_tokens,omitempty"`    // part of the uncached InputTokens that are audio
	OutputTokens       int64 `json:"output_tokens"`                   // all completion tokens, reasoning and audio tokens included
	ReasoningTokens    int64 `json:"reasoning_tokens,omitempty"`      // part of OutputTokens
	AudioOutputTokens  int64 `json:"audio_output_tokens,omitempty"`   // part of OutputTokens that are audio
	WebSearchRequests  int64 `json:"web_search_requests,omitempty"`   // server-side web searches billed per search
	FileSearchCalls    int64 `json:"file_search_calls,omitempty"`     // Responses file_search tool calls, billed per call
	ContainerGB        int64 `json:"container_gb,omitempty"`          // gigabytes of the containers the request had the upstream create (code_interpreter, shell)
	Units              int64 `json:"units,omitempty"`                 // generic APIs: units of the route's unit
	// ServiceTier is the processing tier the response reported (OpenAI's
	// service_tier: "default", "flex", "priority", "scale"); empty when it
	// reported none. It changes the token rates; see Price.
	ServiceTier string `json:"service_tier,omitempty"`
	// InferenceGeo is where the response says inference ran (Anthropic's
	// usage.inference_geo); empty when it said nothing. "us" changes the
	// token rates; see Price.USInferencePercent.
	InferenceGeo string `json:"inference_geo,omitempty"`
	// Speed is the speed the request was served at (Anthropic's
	// usage.speed, or the request's speed when the response says
	// nothing); empty for the standard speed. "fast" changes the token
	// rates; see Price.FastPercent.
	Speed string `json:"speed,omitempty"`
	// Steps is the part of the usage that steps naming their model ran
	// (Anthropic's usage.iterations: the requested model's turns, an
	// advisor's sub-inference on another model, a fallback model's
	// turn), by model: Estimator.Cost prices each at its model's price,
	// and the rest at the model priced. nil when no step names one. The
	// ledger keeps the usage without it, and the cost it priced.
	Steps *Steps `json:"-"`
}

// Steps is the usage of an answer's steps by the model that ran them,
// at most maxStepModels models. It is not changed once made.
type Steps struct {
	parts []modelUsage
}

// Models lists the models of s, as the answer or the request names
// them; none for nil.
func (s *Steps) Models() []string {
	if s == nil {
		return nil
	}
	out := make([]string, len(s.parts))
	for i, p := range s.parts {
		out[i] = p.model
	}
	return out
}

// All yields each model of s, as the answer or the request names it,
// with the usage of its steps; nothing for nil.
func (s *Steps) All() iter.Seq2[string, Usage] {
	return func(yield func(string, Usage) bool) {
		if s == nil {
			return
		}
		for _, p := range s.parts {
			if !yield(p.model, p.usage) {
				return
			}
		}
	}
}

type modelUsage struct {
	model string
	usage Usage
}

// maxStepModels bounds the models of an answer's Steps: an answer whose
// steps name more is unreadable (and charged as such), rather than one
// whose steps of some models are priced at another's.
const maxStepModels = 8

// merge returns the steps of s and t, each model's at the largest of
// each count (see maxEach): a report given twice counts no less than
// either. nil when both are.
func (s *Steps) merge(t *Steps) *Steps {
	switch {
	case t == nil || s == t:
		return s
	case s == nil:
		return t
	}
	out := &Steps{parts: slices.Clone(s.parts)}
	for _, p := range t.parts {
		i := slices.IndexFunc(out.parts, func(q modelUsage) bool { return q.model == p.model })
		if i < 0 {
			// Past maxStepModels (reports of an upstream that names
			// other models in each), a model's steps are left to the
			// rest of the usage, priced at the model priced.
			if len(out.parts) < maxStepModels {
				out.parts = append(out.parts, p)
			}
			continue
		}
		out.parts[i].usage = maxEach(out.parts[i].usage, p.usage)
	}
	return out
}

// without returns u less v, each count at least 0.
func (u Usage) without(v Usage) Usage {
	u.InputTokens -= v.InputTokens
	u.CachedInputTokens -= v.CachedInputTokens
	u.CacheWriteTokens -= v.CacheWriteTokens
	u.CacheWrite1hTokens -= v.CacheWrite1hTokens
	u.AudioInputTokens -= v.AudioInputTokens
	u.OutputTokens -= v.OutputTokens
	u.ReasoningTokens -= v.ReasoningTokens
	u.AudioOutputTokens -= v.AudioOutputTokens
	return u.clamped()
}

// Asked returns u, an answer's usage, with what the request asked for
// (est, its estimated usage) and answers do not always say: the speed asked
// for when u reports none, so that a fast request is not billed at the
// standard rates; the "priority" service tier and an inference
// geography other than "global" asked for when u reports none, likewise
// (an answer that names the tier or the geography that served it,
// "default" for a priority request the upstream served at the standard
// one, is billed at that one; the cheaper "flex" is never taken
// unreported); and
// the containers the request had the upstream create, which it bills
// whether or not the model ran code in them.
func (u Usage) Asked(est Usage) Usage {
	if u.Speed == "" {
		u.Speed = est.Speed
	}
	if u.ServiceTier == "" && est.ServiceTier == "priority" {
		u.ServiceTier = est.ServiceTier
	}
	if u.InferenceGeo == "" && est.InferenceGeo != "global" {
		u.InferenceGeo = est.InferenceGeo
	}
	u.ContainerGB = max(u.ContainerGB, est.ContainerGB)
	return u
}

// DearerParts returns u, counts settled without their parts (input and
// output tokens alone), with the parts of them that est, the reserved
// usage, holds at a rate above the text rate: the tokens written to a
// prompt cache (each lifetime), the audio input and the audio output.
// Counts cannot say them, and an upstream bills them at their own rate:
// each is the share of u's count that est holds of it (rounded up: a
// prompt reserved as cached whole is cached whole at any length), never
// less than the part reserved, and at most the count.
func (u Usage) DearerParts(est Usage) Usage {
	u.CacheWriteTokens = partOf(u.InputTokens, est.CacheWriteTokens, est.InputTokens)
	u.CacheWrite1hTokens = min(partOf(u.InputTokens, est.CacheWrite1hTokens, est.InputTokens), u.CacheWriteTokens)
	u.AudioInputTokens = min(partOf(u.InputTokens, est.AudioInputTokens, est.InputTokens), u.InputTokens-u.CacheWriteTokens)
	u.AudioOutputTokens = partOf(u.OutputTokens, est.AudioOutputTokens, est.OutputTokens)
	return u
}

// partOf is the part of whole, a settled count, that a reserved part of
// a reserved total makes: the larger of its share of whole (rounded up)
// and the part itself, at most whole.
func partOf(whole, part, total int64) int64 {
	if whole <= 0 || part <= 0 || total <= 0 {
		return 0
	}
	part = min(part, total)
	return min(max(mulDivCeil(whole, part, total), part), whole)
}

// TotalTokens returns InputTokens + OutputTokens, saturating.
func (u Usage) TotalTokens() int64 { return addSat(max(u.InputTokens, 0), max(u.OutputTokens, 0)) }

// Price is what one model or one generic route costs. Token prices are per
// million tokens. The zero value is free. In YAML each amount is written in
// dollars, for example `input: 2.50`.
type Price struct {
	Input        NanoUSD          `yaml:"input" json:"input"`                             // per million uncached text input tokens
	CachedInput  NanoUSD          `yaml:"cached_input" json:"cached_input"`               // per million input tokens read from cache; 0 means Input
	CacheWrite   NanoUSD          `yaml:"cache_write" json:"cache_write"`                 // per million input tokens written to the 5-minute cache; 0 means Input
	CacheWrite1h NanoUSD          `yaml:"cache_write_1h" json:"cache_write_1h,omitempty"` // per million input tokens written to the 1-hour cache; 0 means twice Input (Anthropic's ratio)
	Output       NanoUSD          `yaml:"output" json:"output"`                           // per million text output tokens, reasoning included
	AudioInput   NanoUSD          `yaml:"audio_input" json:"audio_input,omitempty"`       // per million audio input tokens; 0 means Input
	AudioOutput  NanoUSD          `yaml:"audio_output" json:"audio_output,omitempty"`     // per million audio output tokens; 0 means Output
	PerCall      NanoUSD          `yaml:"per_call" json:"per_call,omitempty"`             // per request
	PerUnit      NanoUSD          `yaml:"per_unit" json:"per_unit,omitempty"`             // per unit of Usage.Units
	WebSearch    NanoUSD          `yaml:"web_search" json:"web_search,omitempty"`         // per web search (Usage.WebSearchRequests)
	FileSearch   NanoUSD          `yaml:"file_search" json:"file_search,omitempty"`       // per file_search call (Usage.FileSearchCalls); 0 means OpenAI's $2.50 per 1,000
	Container    NanoUSD          `yaml:"container" json:"container,omitempty"`           // per GB of container created (Usage.ContainerGB), a 20-minute session; 0 means OpenAI's $0.03
	LongContext  LongContextPrice `yaml:"long_context" json:"long_context,omitzero"`      // higher rates for long prompts; zero means none
	// FlexPercent is the share, in percent, of the token rates charged for a
	// response served with service_tier "flex"; 0 means 100.
	FlexPercent int64 `yaml:"flex_percent" json:"flex_percent,omitempty"`
	// PriorityPercent is the share, in percent, of the token rates charged
	// for a response served with service_tier "priority"; 0 means 200, the
	// highest multiplier published, so that an undeclared tier is not
	// undercharged.
	PriorityPercent int64 `yaml:"priority_percent" json:"priority_percent,omitempty"`
	// USInferencePercent is the share, in percent, of the token rates
	// charged for usage whose inference ran in the US only (Anthropic's
	// inference_geo "us": 110 on the models that offer it); 0 means 100.
	// An inference_geo other than "" or "global" is charged it too.
	USInferencePercent int64 `yaml:"us_inference_percent" json:"us_inference_percent,omitempty"`
	// FastPercent is the share, in percent, of the token rates charged for
	// usage served in Anthropic's fast mode (speed "fast": 600 on Opus
	// 4.6); 0 means 600, the highest multiplier published, so that a model
	// whose fast mode is not in the table is not undercharged. A speed
	// other than "" or "standard" is charged it too.
	FastPercent int64 `yaml:"fast_percent" json:"fast_percent,omitempty"`
	// MaxOutputTokens is the model's maximum output, reserved when a request
	// does not say how much it may produce. 0 means unknown.
	MaxOutputTokens int64 `yaml:"max_output_tokens" json:"max_output_tokens,omitempty"`
}

// LongContextPrice holds the rates of a request whose input passes
// Threshold tokens (InputTokens > Threshold, cached and cache-written
// tokens included, as Anthropic and OpenAI count it): all of its tokens,
// input and output, are priced at these rates instead of the standard ones.
// Fields that are 0 fall back as in Price, to this tier's own Input and
// Output. A zero Threshold means the model has no long-context tier.
type LongContextPrice struct {
	Threshold    int64   `yaml:"threshold" json:"threshold"`
	Input        NanoUSD `yaml:"input" json:"input"`
	CachedInput  NanoUSD `yaml:"cached_input" json:"cached_input,omitempty"`
	CacheWrite   NanoUSD `yaml:"cache_write" json:"cache_write,omitempty"`
	CacheWrite1h NanoUSD `yaml:"cache_write_1h" json:"cache_write_1h,omitempty"`
	Output       NanoUSD `yaml:"output" json:"output"`
	AudioInput   NanoUSD `yaml:"audio_input" json:"audio_input,omitempty"`
	AudioOutput  NanoUSD `yaml:"audio_output" json:"audio_output,omitempty"`
}

// IsZero reports whether p prices everything at zero.
func (p Price) IsZero() bool {
	return p.Input == 0 && p.CachedInput == 0 && p.CacheWrite == 0 && p.CacheWrite1h == 0 && p.Output == 0 &&
		p.AudioInput == 0 && p.AudioOutput == 0 && p.PerCall == 0 && p.PerUnit == 0 && p.WebSearch == 0 &&
		p.FileSearch == 0 && p.Container == 0 && p.LongContext == (LongContextPrice{})
}

// hasNegative reports whether an amount, a percentage or MaxOutputTokens of
// p is negative.
func (p Price) hasNegative() bool {
	l := p.LongContext
	return p.Input < 0 || p.CachedInput < 0 || p.CacheWrite < 0 || p.CacheWrite1h < 0 || p.Output < 0 ||
		p.AudioInput < 0 || p.AudioOutput < 0 || p.PerCall < 0 || p.PerUnit < 0 || p.WebSearch < 0 ||
		p.FileSearch < 0 || p.Container < 0 || p.FlexPercent < 0 || p.USInferencePercent < 0 || p.FastPercent < 0 || p.PriorityPercent < 0 || p.MaxOutputTokens < 0 ||
		l.Threshold < 0 || l.Input < 0 || l.CachedInput < 0 || l.CacheWrite < 0 || l.CacheWrite1h < 0 ||
		l.Output < 0 || l.AudioInput < 0 || l.AudioOutput < 0
}

// tokenRates are the per-million rates that price one request's tokens,
// fallbacks resolved.
type tokenRates struct {
	input, cached, write, write1h, output, audioIn, audioOut int64
}

func ratesOf(in, cached, write, write1h, out, audioIn, audioOut NanoUSD) tokenRates {
	r := tokenRates{input: int64(in), cached: int64(cached), write: int64(write), write1h: int64(write1h),
		output: int64(out), audioIn: int64(audioIn), audioOut: int64(audioOut)}
	if r.cached == 0 {
		r.cached = r.input
	}
	if r.write == 0 {
		r.write = r.input
	}
	if r.write1h == 0 {
		r.write1h = mulSat(r.input, 2)
	}
	if r.audioIn == 0 {
		r.audioIn = r.input
	}
	if r.audioOut == 0 {
		r.audioOut = r.output
	}
	return r
}

// rates returns the token rates p charges for usage u: the long-context
// tier's when u's input passes its threshold, scaled by the service tier.
func (p Price) rates(u Usage) tokenRates {
	var r tokenRates
	if l := p.LongContext; l.Threshold > 0 && u.InputTokens > l.Threshold {
		r = ratesOf(l.Input, l.CachedInput, l.CacheWrite, l.CacheWrite1h, l.Output, l.AudioInput, l.AudioOutput)
	} else {
		r = ratesOf(p.Input, p.CachedInput, p.CacheWrite, p.CacheWrite1h, p.Output, p.AudioInput, p.AudioOutput)
	}
	for _, pct := range [...]int64{p.tierPercent(u.ServiceTier), p.geoPercent(u.InferenceGeo), p.speedPercent(u.Speed)} {
		if pct == 100 {
			continue
		}
		for _, x := range []*int64{&r.input, &r.cached, &r.write, &r.write1h, &r.output, &r.audioIn, &r.audioOut} {
			*x = mulDivCeil(*x, pct, 100)
		}
	}
	return r
}

// geoPercent returns the share of the token rates charged for where
// inference ran, as a response reports it: 100 for "" and "global",
// USInferencePercent (when set) for any other.
func (p Price) geoPercent(geo string) int64 {
	if geo == "" || geo == "global" || p.USInferencePercent == 0 {
		return 100
	}
	return p.USInferencePercent
}

// speedPercent returns the share of the token rates charged for the speed
// a request was served at: 100 for "" and "standard", FastPercent (600
// when unset) for any other.
func (p Price) speedPercent(speed string) int64 {
	if speed == "" || speed == "standard" {
		return 100
	}
	return cmp.Or(p.FastPercent, defaultFastPercent)
}

// defaultFastPercent is the highest fast-mode multiplier Anthropic
// publishes (Opus 4.6: 6x the standard rates).
const defaultFastPercent = 600

// tierPercent returns the share of the token rates charged for a service
// tier as a response reports it: 100 for the standard tiers ("", "default",
// "auto", "standard", "scale"), FlexPercent for "flex", PriorityPercent for
// "priority", and the higher of 100 and PriorityPercent for a tier costgate
// does not know.
func (p Price) tierPercent(tier string) int64 {
	priority := p.PriorityPercent
	if priority == 0 {
		priority = 200
	}
	switch tier {
	case "", "default", "auto", "standard", "scale":
		return 100
	case "flex":
		if p.FlexPercent == 0 {
			return 100
		}
		return p.FlexPercent
	case "priority":
		return priority
	}
	return max(priority, 100)
}

// Cost prices u. Each component (uncached text input, audio input, cached
// input, 5-minute and 1-hour cache writes, text and audio output, units, web
// searches) is rounded up to a whole nano-dollar separately, then the
// components and PerCall are added. Uncached input is InputTokens minus
// CachedInputTokens and CacheWriteTokens (never below zero); its audio part
// is priced as audio. A request whose InputTokens pass LongContext.Threshold
// is priced at the long-context rates; u.ServiceTier scales the token rates
// (see tierPercent), u.InferenceGeo and u.Speed scale them too (see
// geoPercent and speedPercent). Negative counts count as zero.
//
// Arithmetic saturates: a cost that does not fit in NanoUSD is
// math.MaxInt64 (see ErrCostOverflow), never a wrapped or negative amount.
func (p Price) Cost(u Usage) NanoUSD {
	const million = 1_000_000
	u = u.clamped()
	r := p.rates(u)
	uncached := u.InputTokens - u.CachedInputTokens - u.CacheWriteTokens
	audioIn := min(u.AudioInputTokens, uncached)
	write1h := u.CacheWrite1hTokens
	audioOut := min(u.AudioOutputTokens, u.OutputTokens)
	total := max(int64(p.PerCall), 0)
	total = addSat(total, mulDivCeil(uncached-audioIn, r.input, million))
	total = addSat(total, mulDivCeil(audioIn, r.audioIn, million))
	total = addSat(total, mulDivCeil(u.CachedInputTokens, r.cached, million))
	total = addSat(total, mulDivCeil(u.CacheWriteTokens-write1h, r.write, million))
	total = addSat(total, mulDivCeil(write1h, r.write1h, million))
	total = addSat(total, mulDivCeil(u.OutputTokens-audioOut, r.output, million))
	total = addSat(total, mulDivCeil(audioOut, r.audioOut, million))
	total = addSat(total, mulSat(u.Units, int64(p.PerUnit)))
	total = addSat(total, mulSat(u.WebSearchRequests, int64(p.WebSearch)))
	total = addSat(total, mulSat(u.FileSearchCalls, int64(cmp.Or(p.FileSearch, defaultFileSearch))))
	total = addSat(total, mulSat(u.ContainerGB, int64(cmp.Or(p.Container, defaultContainer))))
	return NanoUSD(total)
}

// defaultContainer is OpenAI's price of a 20-minute session of a 1 GB
// container (code_interpreter, hosted shell), $0.03; 4, 16 and 64 GB
// containers cost 4, 16 and 64 times it.
const defaultContainer NanoUSD = 30_000_000

// defaultFileSearch is OpenAI's price of a file_search call, $2.50 per
// 1,000: a model's price that names none still bills the calls.
const defaultFileSearch NanoUSD = 2_500_000

// Encoding names, as in Estimate.Encoding.
const (
	EncodingO200k     = "o200k_base"       // gpt-4o, gpt-4.1, gpt-5, the o-series
	EncodingCl100k    = "cl100k_base"      // gpt-4, gpt-3.5, the embeddings models
	EncodingAnthropic = "anthropic-approx" // Claude: no public tokenizer; see anthropic.go
)

//go:embed prices.yaml
var builtinPricesYAML []byte

// tableEntry is one model of the price table.
type tableEntry struct {
	Price    `yaml:",inline"`
	Encoding string `yaml:"encoding"`
	// Reasoning marks a model that produces hidden reasoning tokens, which a
	// stream does not show (see Estimate.Uncounted).
	Reasoning bool `yaml:"reasoning"`
}

// priceDoc is the price table as prices.yaml writes it.
type priceDoc struct {
	Models map[string]tableEntry `yaml:"models"`
	// Aliases maps another name of a model (a dated snapshot, a "-latest"
	// name) to its name in Models.
	Aliases map[string]string `yaml:"aliases"`
	// FineTuned prices the fine-tuned models of a base model in Models:
	// "ft:BASE:org:suffix:id", BASE or an alias of it.
	FineTuned map[string]tableEntry `yaml:"fine_tuned"`
}

// builtinTable parses the embedded price table.
func builtinTable() (priceDoc, error) {
	var doc priceDoc
	if err := yaml.Unmarshal(builtinPricesYAML, &doc); err != nil {
		return priceDoc{}, fmt.Errorf("costmodel: embedded prices.yaml: %w", err)
	}
	for _, m := range []map[string]tableEntry{doc.Models, doc.FineTuned} {
		for name, e := range m {
			switch e.Encoding {
			case EncodingO200k, EncodingCl100k, EncodingAnthropic:
			default:
				return priceDoc{}, fmt.Errorf("costmodel: embedded prices.yaml: model %q: unknown encoding %q", name, e.Encoding)
			}
		}
	}
	for name := range doc.FineTuned {
		if _, ok := doc.Models[name]; !ok {
			return priceDoc{}, fmt.Errorf("costmodel: embedded prices.yaml: fine_tuned %q is not a model", name)
		}
	}
	for alias, name := range doc.Aliases {
		if _, ok := doc.Models[name]; !ok {
			return priceDoc{}, fmt.Errorf("costmodel: embedded prices.yaml: alias %q of unknown model %q", alias, name)
		}
		if _, ok := doc.Models[alias]; ok {
			return priceDoc{}, fmt.Errorf("costmodel: embedded prices.yaml: alias %q is also a model", alias)
		}
	}
	return doc, nil
}

// BuiltinPrices returns a copy of the embedded price table, keyed by model
// name. Aliases and fine-tuned prices are not included; see BuiltinAliases.
func BuiltinPrices() map[string]Price {
	t, err := builtinTable()
	if err != nil {
		panic(err) // the embedded file is tested; it cannot be wrong at run time
	}
	out := make(map[string]Price, len(t.Models))
	for k, v := range t.Models {
		out[k] = v.Price
	}
	return out
}

// BuiltinAliases returns a copy of the embedded alias table: another name of
// a model (such as a dated snapshot) mapped to the model's name in
// BuiltinPrices.
func BuiltinAliases() map[string]string {
	t, err := builtinTable()
	if err != nil {
		panic(err) // the embedded file is tested; it cannot be wrong at run time
	}
	return t.Aliases
}

// priceTable resolves model names to table entries. A name is trimmed and
// lowercased, then found exactly among the models, else in the alias
// table; "ft:BASE:..." is found in the fine-tuned table by BASE (itself a
// model or an alias). Nothing is inferred from a prefix: any other name is
// unknown.
type priceTable struct {
	models    map[string]tableEntry
	aliases   map[string]string
	fineTuned map[string]tableEntry
}

// normalName is a model name as the table keys it.
func normalName(model string) string {
	m := strings.TrimSpace(model)
	for i := 0; i < len(m); i++ {
		if c := m[i]; c >= 'A' && c <= 'Z' || c >= 0x80 {
			return strings.ToLower(m)
		}
	}
	return m
}

// lookup returns the entry of model, its canonical name and its base.
// The canonical name is the model's name in the table, "ft:" and the base's
// name for a fine-tuned model, or the normalized name of an unknown model
// (ok false). The base is the model a name is or was fine-tuned from, as
// the table names it: the canonical name of a model, the base's name (an
// alias resolved) for a fine-tune, known or not; rules that follow the
// model rather than its price (image tokens, the tool-use prompt) are
// chosen by it.
func (t *priceTable) lookup(model string) (e tableEntry, canonical, base string, ok bool) {
	m := normalName(model)
	if e, ok := t.models[m]; ok {
		return e, m, m, true
	}
	if name, ok := t.aliases[m]; ok {
		if e, ok := t.models[name]; ok {
			return e, name, name, true
		}
	}
	if rest, isFT := strings.CutPrefix(m, "ft:"); isFT {
		base, _, _ := strings.Cut(rest, ":")
		if name, ok := t.aliases[base]; ok {
			base = name
		}
		if e, ok := t.fineTuned[base]; ok {
			return e, "ft:" + base, base, true
		}
		return tableEntry{}, m, base, false
	}
	return tableEntry{}, m, m, false
}

// encodingForModel picks the tokenizer of a model that is not in the table,
// by its family name.
func encodingForModel(model string) string {
	m := strings.ToLower(model)
	if rest, ok := strings.CutPrefix(m, "ft:"); ok {
		m, _, _ = strings.Cut(rest, ":")
	}
	switch {
	case strings.HasPrefix(m, "claude"):
		return EncodingAnthropic
	case strings.HasPrefix(m, "gpt-4o"), strings.HasPrefix(m, "chatgpt-4o"), strings.HasPrefix(m, "gpt-4.1"),
		strings.HasPrefix(m, "gpt-4.5"), strings.HasPrefix(m, "gpt-5"), strings.HasPrefix(m, "o1"),
		strings.HasPrefix(m, "o3"), strings.HasPrefix(m, "o4"), strings.HasPrefix(m, "gpt-oss"),
		strings.HasPrefix(m, "codex"), strings.HasPrefix(m, "omni-"):
		return EncodingO200k
	case strings.HasPrefix(m, "gpt-4"), strings.HasPrefix(m, "gpt-3.5"), strings.HasPrefix(m, "gpt-35"),
		strings.HasPrefix(m, "text-embedding"), strings.HasPrefix(m, "davinci-002"), strings.HasPrefix(m, "babbage-002"):
		return EncodingCl100k
	}
	return EncodingO200k
}
