package costmodel

import (
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
	// Prices overrides entries of the embedded built-in table (a whole entry
	// replaces the built-in one) and adds models to it, keyed by model name.
	// A name also prices its dated snapshots ("gpt-4o" prices
	// "gpt-4o-2024-08-06").
	Prices map[string]Price `yaml:"prices"`
	// Encodings names the tokenizer of models added in Prices, keyed by model
	// name: "o200k_base", "cl100k_base" or "anthropic-approx". A model not
	// named here is counted with its family's tokenizer (claude-* with
	// anthropic-approx, gpt-4 and gpt-3.5 with cl100k_base, anything else
	// with o200k_base).
	Encodings map[string]string `yaml:"encodings"`
	// DefaultPrice prices models found neither in Prices nor in the built-in
	// table. When it is zero and FreeUnknown is false, unknown models are
	// priced at the highest input and output rates of the table, so that an
	// unknown model never rides free by accident.
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
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.OutputReserve < 0 || c.OutputReserve > 100 {
		return fmt.Errorf("costmodel: output_reserve %d%% is not within 1..100 (0 means 100)", c.OutputReserve)
	}
	if c.DefaultMaxOutputTokens < 0 {
		return fmt.Errorf("costmodel: default_max_output_tokens %d is negative", c.DefaultMaxOutputTokens)
	}
	for name, p := range c.Prices {
		if strings.TrimSpace(name) == "" {
			return fmt.Errorf("costmodel: price with an empty model name")
		}
		if p.hasNegative() {
			return fmt.Errorf("costmodel: price of %q has a negative amount", name)
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
	cache         *countCache
	unknown       atomic.Uint64
}

// NewEstimator validates cfg, merges its prices over the built-in table and
// loads the tokenizers.
func NewEstimator(cfg Config) (*Estimator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	base, err := builtinTable()
	if err != nil {
		return nil, err
	}
	merged := make(map[string]tableEntry, len(base)+len(cfg.Prices))
	var maxIn, maxOut NanoUSD
	for k, v := range base {
		merged[k] = v
	}
	for k, p := range cfg.Prices {
		k = strings.ToLower(strings.TrimSpace(k))
		enc := cfg.Encodings[k]
		if enc == "" {
			if old, ok := base[k]; ok {
				enc = old.Encoding
			} else {
				enc = encodingForModel(k)
			}
		}
		merged[k] = tableEntry{Price: p, Encoding: enc}
	}
	for k, enc := range cfg.Encodings {
		k = strings.ToLower(strings.TrimSpace(k))
		if e, ok := merged[k]; ok {
			e.Encoding = enc
			merged[k] = e
		}
	}
	var maxOutTokens int64
	for _, v := range merged {
		maxIn = max(maxIn, v.Input)
		maxOut = max(maxOut, v.Output)
		maxOutTokens = max(maxOutTokens, v.MaxOutputTokens)
	}
	def := cfg.DefaultPrice
	if def.IsZero() && !cfg.FreeUnknown {
		def = Price{Input: maxIn, Output: maxOut, MaxOutputTokens: def.MaxOutputTokens}
	}
	e := &Estimator{
		table:         newPriceTable(merged),
		defaultPrice:  def,
		reservePct:    int64(cfg.OutputReserve),
		defaultMaxOut: cfg.DefaultMaxOutputTokens,
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

// model is a resolved model: its price and tokenizer.
type model struct {
	name    string
	price   Price
	enc     *encoder // nil for anthropic-approx, which uses approxEncoder
	encName string
	unknown bool
}

func (e *Estimator) resolve(name string) model {
	if ent, _, ok := e.table.lookup(name); ok {
		return model{name: name, price: ent.Price, encName: ent.Encoding, enc: encoderFor(ent.Encoding)}
	}
	enc := encodingForModel(name)
	return model{name: name, price: e.defaultPrice, encName: enc, enc: encoderFor(enc), unknown: true}
}

// Price returns the price of model and whether the model is known (in the
// configured or built-in table). An unknown model gets the default price.
func (e *Estimator) Price(model string) (Price, bool) {
	m := e.resolve(model)
	return m.price, !m.unknown
}

// Cost prices usage u of model with the table in force; an unknown model is
// priced at the default price.
func (e *Estimator) Cost(model string, u Usage) NanoUSD {
	return e.resolve(model).price.Cost(u)
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
