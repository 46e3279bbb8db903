package costmodel

import (
	"cmp"
	"fmt"
	"strings"
	"sync/atomic"
)

// Config configures an Estimator. The zero value is usable: the built-in
// price table, unknown models priced at the most expensive built-in rates,
// and the whole output estimate reserved. In YAML, amounts are dollars:
//
//	prices:
//	  my-finetune: {input: 0.30, output: 1.20, max_output_tokens: 16384}
//	default_price: {input: 2.50, output: 10.00}
//	output_reserve: 50
type Config struct {
	// Prices overrides entries of the embedded built-in table (its token
	// rates replace the built-in ones; the per-call prices, surcharge
	// percents and long-context rates it leaves zero keep the built-in
	// ones) and adds models to it, keyed by model name
	// (case and surrounding space are ignored). A key "ft:BASE" prices the
	// fine-tuned models of BASE ("ft:BASE:org::id"). A name prices only
	// itself and its aliases (see Aliases): "gpt-4o" prices
	// "gpt-4o-2024-08-06" because the built-in alias table says so, never
	// because one name begins with the other.
	Prices map[string]Price `yaml:"prices"`
	// Aliases adds other names of models, keyed by the other name, valued by
	// a model of Prices or of the built-in table: a dated snapshot resolves
	// to its model for prices and for Canonical. An alias that is itself a
	// model name is an error.
	Aliases map[string]string `yaml:"aliases"`
	// Encodings names the tokenizer of models added in Prices, keyed by model
	// name: "o200k_base", "cl100k_base" or "anthropic-approx". A model not
	// named here is counted with its family's tokenizer (claude-* with
	// anthropic-approx, gpt-4 and gpt-3.5 with cl100k_base, anything else
	// with o200k_base).
	Encodings map[string]string `yaml:"encodings"`
	// DefaultPrice prices models found neither in Prices nor in the built-in
	// table (their aliases and fine-tuned tables included). When it is zero
	// and FreeUnknown is false, unknown models are priced at the highest rate
	// of the table for each dimension (input, output, audio, cache writes,
	// web searches, long-context tiers included), so that an unknown model
	// never rides free by accident.
	DefaultPrice Price `yaml:"default_price"`
	// FreeUnknown lets unknown models cost nothing when DefaultPrice is zero.
	FreeUnknown bool `yaml:"free_unknown"`
	// OutputReserve is the percentage (1 to 100) of the output estimate that
	// Estimate reserves and prices; 0 means 100.
	OutputReserve int `yaml:"output_reserve"`
	// DefaultMaxOutputTokens is the output estimate of a request that sets no
	// limit for a model whose maximum output is unknown; 0 means 4096.
	DefaultMaxOutputTokens int64 `yaml:"default_max_output_tokens"`
	// CacheEntries bounds the per-message count cache (see Estimator); 0
	// means 65536, a negative value disables the cache.
	CacheEntries int `yaml:"cache_entries"`
	// ServerContextTokens is the input reserved for content the upstream
	// adds to a prompt that is not in the request: a stored context
	// (Responses' previous_response_id, conversation, a stored prompt, an
	// item_reference; once per request), an MCP server's tool list (per mcp
	// tool) and a web fetch without max_content_tokens (per fetch). The
	// upstream may bill more: what it bills beyond this is what a budget
	// can be exceeded by, per such request in flight. 0 means 300000 (a
	// document by file id, docMaxTokens); a negative value is an error.
	ServerContextTokens int64 `yaml:"server_context_tokens"`
	// SearchResultTokens is the input reserved per web search for the
	// results the upstream adds to the prompt. 0 means 10000; a negative
	// value is an error.
	SearchResultTokens int64 `yaml:"search_result_tokens"`
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.OutputReserve < 0 || c.OutputReserve > 100 {
		return fmt.Errorf("costmodel: output_reserve %d%% is not within 1..100 (0 means 100)", c.OutputReserve)
	}
	if c.DefaultMaxOutputTokens < 0 {
		return fmt.Errorf("costmodel: default_max_output_tokens %d is negative", c.DefaultMaxOutputTokens)
	}
	if c.ServerContextTokens < 0 || c.SearchResultTokens < 0 {
		return fmt.Errorf("costmodel: server_context_tokens %d or search_result_tokens %d is negative", c.ServerContextTokens, c.SearchResultTokens)
	}
	for name, p := range c.Prices {
		if strings.TrimSpace(name) == "" {
			return fmt.Errorf("costmodel: price with an empty model name")
		}
		if p.hasNegative() {
			return fmt.Errorf("costmodel: price of %q has a negative amount", name)
		}
	}
	for alias, name := range c.Aliases {
		if strings.TrimSpace(alias) == "" || strings.TrimSpace(name) == "" {
			return fmt.Errorf("costmodel: alias %q of %q: empty model name", alias, name)
		}
	}
	for name, enc := range c.Encodings {
		switch enc {
		case EncodingO200k, EncodingCl100k, EncodingAnthropic:
		default:
			return fmt.Errorf("costmodel: model %q: unknown encoding %q (want o200k_base, cl100k_base or anthropic-approx)", name, enc)
		}
	}
	if c.DefaultPrice.hasNegative() {
		return fmt.Errorf("costmodel: default price has a negative amount")
	}
	return nil
}

// Estimator prices requests before they are served and usage after. It
// holds the price table, the tokenizers (built once per process and shared)
// and a bounded cache of per-message token counts. It is safe for concurrent
// use; build one with NewEstimator and share it.
type Estimator struct {
	table         *priceTable
	defaultPrice  Price
	reservePct    int64
	defaultMaxOut int64
	serverContext int64 // Config.ServerContextTokens, defaulted
	searchResult  int64 // Config.SearchResultTokens, defaulted
	cache         *countCache
	unknown       atomic.Uint64
}

// NewEstimator validates cfg, merges its prices over the built-in table and
// loads the tokenizers.
func NewEstimator(cfg Config) (*Estimator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	doc, err := builtinTable()
	if err != nil {
		return nil, err
	}
	t := &priceTable{
		models:    make(map[string]tableEntry, len(doc.Models)+len(cfg.Prices)),
		aliases:   make(map[string]string, len(doc.Aliases)+len(cfg.Aliases)),
		fineTuned: make(map[string]tableEntry, len(doc.FineTuned)),
	}
	for k, v := range doc.Models {
		t.models[k] = v
	}
	for k, v := range doc.Aliases {
		t.aliases[k] = v
	}
	for k, v := range doc.FineTuned {
		t.fineTuned[k] = v
	}
	for k, p := range cfg.Prices {
		k = normalName(k)
		dst := t.models
		key := k
		if base, ok := strings.CutPrefix(k, "ft:"); ok && !strings.Contains(base, ":") {
			dst, key = t.fineTuned, base
		}
		enc := cfg.Encodings[k]
		old, had := dst[key]
		if enc == "" {
			if had {
				enc = old.Encoding
			} else {
				enc = encodingForModel(key)
			}
		}
		if had {
			// A restated model keeps the built-in per-call prices and
			// surcharges its override leaves unset: an override of the
			// token rates must not make web searches free.
			p.WebSearch = cmp.Or(p.WebSearch, old.WebSearch)
			p.FileSearch = cmp.Or(p.FileSearch, old.FileSearch)
			p.Container = cmp.Or(p.Container, old.Container)
			p.FlexPercent = cmp.Or(p.FlexPercent, old.FlexPercent)
			p.PriorityPercent = cmp.Or(p.PriorityPercent, old.PriorityPercent)
			p.USInferencePercent = cmp.Or(p.USInferencePercent, old.USInferencePercent)
			p.FastPercent = cmp.Or(p.FastPercent, old.FastPercent)
			if p.LongContext == (LongContextPrice{}) {
				p.LongContext = old.LongContext
			}
		}
		dst[key] = tableEntry{Price: p, Encoding: enc, Reasoning: had && old.Reasoning}
		delete(t.aliases, key) // a model of its own now
	}
	for alias, name := range cfg.Aliases {
		alias, name = normalName(alias), normalName(name)
		if _, ok := t.models[alias]; ok {
			return nil, fmt.Errorf("costmodel: alias %q is also a model name", alias)
		}
		if _, ok := t.models[name]; !ok {
			return nil, fmt.Errorf("costmodel: alias %q of %q: no such model", alias, name)
		}
		t.aliases[alias] = name
	}
	for k, enc := range cfg.Encodings {
		k = normalName(k)
		if e, ok := t.models[k]; ok {
			e.Encoding = enc
			t.models[k] = e
		}
	}
	def := cfg.DefaultPrice
	if def.IsZero() && !cfg.FreeUnknown {
		def = highestRates(t, def.MaxOutputTokens)
	}
	e := &Estimator{
		table:         t,
		defaultPrice:  def,
		reservePct:    int64(cfg.OutputReserve),
		defaultMaxOut: cfg.DefaultMaxOutputTokens,
		serverContext: cmp.Or(cfg.ServerContextTokens, docMaxTokens),
		searchResult:  cmp.Or(cfg.SearchResultTokens, 10_000),
	}
	if e.reservePct == 0 {
		e.reservePct = 100
	}
	if e.defaultMaxOut == 0 {
		e.defaultMaxOut = 4096
	}
	if cfg.CacheEntries >= 0 {
		n := cfg.CacheEntries
		if n == 0 {
			n = 65536
		}
		e.cache = newCountCache(n)
	}
	loadEncoders()
	return e, nil
}

// highestRates returns a price whose every rate is the highest of the
// table's for that dimension, long-context tiers included, with no
// long-context tier of its own (its base rates are already the highest).
func highestRates(t *priceTable, maxOutputTokens int64) Price {
	p := Price{MaxOutputTokens: maxOutputTokens, FlexPercent: 100}
	for _, m := range []map[string]tableEntry{t.models, t.fineTuned} {
		for _, v := range m {
			l := v.LongContext
			for _, r := range []tokenRates{
				ratesOf(v.Input, v.CachedInput, v.CacheWrite, v.CacheWrite1h, v.Output, v.AudioInput, v.AudioOutput),
				ratesOf(l.Input, l.CachedInput, l.CacheWrite, l.CacheWrite1h, l.Output, l.AudioInput, l.AudioOutput),
			} {
				p.Input = max(p.Input, NanoUSD(r.input), NanoUSD(r.cached))
				p.CacheWrite = max(p.CacheWrite, NanoUSD(r.write))
				p.CacheWrite1h = max(p.CacheWrite1h, NanoUSD(r.write1h))
				p.Output = max(p.Output, NanoUSD(r.output))
				p.AudioInput = max(p.AudioInput, NanoUSD(r.audioIn))
				p.AudioOutput = max(p.AudioOutput, NanoUSD(r.audioOut))
			}
			p.PerCall = max(p.PerCall, v.PerCall)
			p.WebSearch = max(p.WebSearch, v.WebSearch)
			p.FileSearch = max(p.FileSearch, v.FileSearch)
			p.PriorityPercent = max(p.PriorityPercent, v.PriorityPercent, 200)
			p.USInferencePercent = max(p.USInferencePercent, v.USInferencePercent)
		}
	}
	p.CachedInput = p.Input
	p.CacheWrite = max(p.CacheWrite, p.Input)
	p.AudioInput = max(p.AudioInput, p.Input)
	p.AudioOutput = max(p.AudioOutput, p.Output)
	return p
}

// model is a resolved model: its price and tokenizer.
type model struct {
	name      string // as the client spelled it
	canonical string // see Estimator.Canonical
	base      string // the model name is, or is fine-tuned from; see priceTable.lookup
	price     Price
	enc       *encoder // nil for anthropic-approx, which uses approxEncoder
	encName   string
	unknown   bool
	reasoning bool // hidden reasoning tokens; unknown models count as reasoning
}

func (e *Estimator) resolve(name string) model {
	ent, canonical, base, ok := e.table.lookup(name)
	if ok {
		return model{name: name, canonical: canonical, base: base, price: ent.Price, encName: ent.Encoding, enc: encoderFor(ent.Encoding), reasoning: ent.Reasoning}
	}
	enc := encodingForModel(canonical)
	return model{name: name, canonical: canonical, base: base, price: e.defaultPrice, encName: enc, enc: encoderFor(enc), unknown: true, reasoning: true}
}

// Canonical returns the name under which model is priced and under which
// per-model limits should count it, so that the names of one model share
// one key: the name is trimmed of surrounding space and lowercased (the
// table ignores case), and an alias in the price table (a dated snapshot
// such as "gpt-4o-2024-08-06", "claude-sonnet-4-5-20250929") becomes its
// model's name ("gpt-4o", "claude-sonnet-4-5"). Every fine-tuned model of a
// priced base becomes "ft:" and the base's name ("ft:gpt-4o-mini"): they
// share a price and a key. An unknown model is its own trimmed, lowercased
// name.
func (e *Estimator) Canonical(model string) string {
	_, c, _, _ := e.table.lookup(model)
	return c
}

// Priced returns model's canonical name (see Canonical) and whether the
// price table knows it.
func (e *Estimator) Priced(model string) (canonical string, ok bool) {
	_, canonical, _, ok = e.table.lookup(model)
	return canonical, ok
}

// Price returns the price of model and whether the model is known (in the
// configured or built-in table). An unknown model gets the default price.
func (e *Estimator) Price(model string) (Price, bool) {
	m := e.resolve(model)
	return m.price, !m.unknown
}

// Cost prices usage u of model with the table in force; an unknown model is
// priced at the default price. The steps u names the model of (Usage.Steps:
// an advisor's sub-inference, a fallback model's turn) are priced each at
// its model's price, and the rest of u at model's.
func (e *Estimator) Cost(model string, u Usage) NanoUSD {
	return e.costOf(e.resolve(model), u)
}

// costOf is Cost of model m.
func (e *Estimator) costOf(m model, u Usage) NanoUSD {
	if u.Steps == nil {
		return m.price.Cost(u)
	}
	// Each step's model at its price (no per-call price: one request),
	// at the answer's tier, region and speed; what the steps leave of
	// the usage (a count the report states beyond their sum, web
	// searches) at model's.
	var total NanoUSD
	rest := u
	for _, p := range u.Steps.parts {
		price := e.resolve(p.model).price
		price.PerCall = 0
		su := p.usage
		su.ServiceTier, su.InferenceGeo, su.Speed = u.ServiceTier, u.InferenceGeo, u.Speed
		total = AddSat(total, price.Cost(su))
		rest = rest.without(p.usage)
	}
	return AddSat(total, m.price.Cost(rest))
}

// Encoding returns the name of the tokenizer used to count model's tokens.
func (e *Estimator) Encoding(model string) string { return e.resolve(model).encName }

// CountText returns the number of tokens of text with model's tokenizer, as
// a bare string (no message overhead). For Claude models it is the
// approximation described in anthropic.go.
func (e *Estimator) CountText(model, text string) int64 {
	m := e.resolve(model)
	return m.countText(text)
}

func (m model) countText(text string) int64 {
	if m.encName == EncodingAnthropic {
		return anthropicApprox(text)
	}
	return int64(m.enc.Count(text))
}

// UnknownModels returns how many estimates were made for models that are in
// neither the configured nor the built-in price table (priced at the default
// price). Export it as a counter metric.
func (e *Estimator) UnknownModels() uint64 { return e.unknown.Load() }

// reserve returns the share of an output estimate that is reserved.
func (e *Estimator) reserve(out int64) int64 {
	if out <= 0 {
		return 0
	}
	if e.reservePct >= 100 {
		return out
	}
	return mulDivCeil(out, e.reservePct, 100)
}

// outputLimit returns the output estimate of one completion: the request's
// own limit, else the model's maximum output, else the configured default.
func (e *Estimator) outputLimit(m model, requested int64) int64 {
	if requested > 0 {
		return requested
	}
	if m.price.MaxOutputTokens > 0 {
		return m.price.MaxOutputTokens
	}
	return e.defaultMaxOut
}

// MaxModelName bounds the length of a request's model name, in bytes: no
// provider's name comes near it (a Bedrock ARN is about 200), and a longer
// one is refused before it reaches the policies, the ledger, the metrics
// or a capture.
const MaxModelName = 1024

// checkModelName refuses a request's missing or overlong model name.
func checkModelName(kind Kind, name string) error {
	switch {
	case name == "":
		return badRequest(kind, nil, "missing model")
	case len(name) > MaxModelName:
		return badRequest(kind, nil, "model: %d bytes, longer than %d", len(name), MaxModelName)
	}
	return nil
}
