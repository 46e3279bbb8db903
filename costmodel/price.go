package costmodel

import (
	_ "embed"
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Usage is the token and unit consumption of one request, estimated before it
// is served or reported after. The zero value is no usage.
type Usage struct {
	InputTokens       int64 `json:"input_tokens"`                  // all prompt tokens, cached and cache-written ones included
	CachedInputTokens int64 `json:"cached_input_tokens,omitempty"` // part of InputTokens read from a prompt cache
	CacheWriteTokens  int64 `json:"cache_write_tokens,omitempty"`  // part of InputTokens written to a prompt cache (Anthropic)
	OutputTokens      int64 `json:"output_tokens"`                 // all completion tokens, reasoning tokens included
	ReasoningTokens   int64 `json:"reasoning_tokens,omitempty"`    // part of OutputTokens
	Units             int64 `json:"units,omitempty"`               // generic APIs: units of the route's unit
}

// TotalTokens returns InputTokens + OutputTokens.
func (u Usage) TotalTokens() int64 { return addSat(u.InputTokens, u.OutputTokens) }

// Price is what one model or one generic route costs. Token prices are per
// million tokens. The zero value is free. In YAML each amount is written in
// dollars, for example `input: 2.50`.
type Price struct {
	Input       NanoUSD `yaml:"input" json:"input"`                 // per million uncached input tokens
	CachedInput NanoUSD `yaml:"cached_input" json:"cached_input"`   // per million input tokens read from cache; 0 means Input
	CacheWrite  NanoUSD `yaml:"cache_write" json:"cache_write"`     // per million input tokens written to cache; 0 means Input
	Output      NanoUSD `yaml:"output" json:"output"`               // per million output tokens, reasoning included
	PerCall     NanoUSD `yaml:"per_call" json:"per_call,omitempty"` // per request
	PerUnit     NanoUSD `yaml:"per_unit" json:"per_unit,omitempty"` // per unit of Usage.Units
	// MaxOutputTokens is the model's maximum output, reserved when a request
	// does not say how much it may produce. 0 means unknown.
	MaxOutputTokens int64 `yaml:"max_output_tokens" json:"max_output_tokens,omitempty"`
}

// IsZero reports whether p prices everything at zero.
func (p Price) IsZero() bool {
	return p.Input == 0 && p.CachedInput == 0 && p.CacheWrite == 0 && p.Output == 0 && p.PerCall == 0 && p.PerUnit == 0
}

// hasNegative reports whether an amount or MaxOutputTokens of p is negative.
func (p Price) hasNegative() bool {
	return p.Input < 0 || p.CachedInput < 0 || p.CacheWrite < 0 || p.Output < 0 || p.PerCall < 0 || p.PerUnit < 0 || p.MaxOutputTokens < 0
}

// Cost prices u. Each component (uncached input, cached input, cache writes,
// output, units) is rounded up to a whole nano-dollar separately, then the
// components and PerCall are added; the result saturates at the largest
// NanoUSD instead of overflowing. Uncached input is InputTokens minus
// CachedInputTokens and CacheWriteTokens (never below zero). Negative counts
// count as zero.
func (p Price) Cost(u Usage) NanoUSD {
	const million = 1_000_000
	cachedPrice, writePrice := p.CachedInput, p.CacheWrite
	if cachedPrice == 0 {
		cachedPrice = p.Input
	}
	if writePrice == 0 {
		writePrice = p.Input
	}
	in, cached, written := max(u.InputTokens, 0), max(u.CachedInputTokens, 0), max(u.CacheWriteTokens, 0)
	uncached := max(in-cached-written, 0)
	total := max(int64(p.PerCall), 0)
	total = addSat(total, mulDivCeil(uncached, int64(p.Input), million))
	total = addSat(total, mulDivCeil(cached, int64(cachedPrice), million))
	total = addSat(total, mulDivCeil(written, int64(writePrice), million))
	total = addSat(total, mulDivCeil(max(u.OutputTokens, 0), int64(p.Output), million))
	total = addSat(total, mulDivCeil(max(u.Units, 0), int64(p.PerUnit), 1))
	return NanoUSD(total)
}

// Encoding names, as in Estimate.Encoding.
const (
	EncodingO200k     = "o200k_base"       // gpt-4o, gpt-4.1, gpt-5, the o-series
	EncodingCl100k    = "cl100k_base"      // gpt-4, gpt-3.5, the embeddings models
	EncodingAnthropic = "anthropic-approx" // Claude: no public tokenizer; see anthropic.go
)

//go:embed prices.yaml
var builtinPricesYAML []byte

// tableEntry is one model of the embedded price table.
type tableEntry struct {
	Price    `yaml:",inline"`
	Encoding string `yaml:"encoding"`
}

// builtinTable parses the embedded price table.
func builtinTable() (map[string]tableEntry, error) {
	var doc struct {
		Models map[string]tableEntry `yaml:"models"`
	}
	if err := yaml.Unmarshal(builtinPricesYAML, &doc); err != nil {
		return nil, fmt.Errorf("costmodel: embedded prices.yaml: %w", err)
	}
	for name, e := range doc.Models {
		switch e.Encoding {
		case EncodingO200k, EncodingCl100k, EncodingAnthropic:
		default:
			return nil, fmt.Errorf("costmodel: embedded prices.yaml: model %q: unknown encoding %q", name, e.Encoding)
		}
	}
	return doc.Models, nil
}

// BuiltinPrices returns a copy of the embedded price table, keyed by model
// name.
func BuiltinPrices() map[string]Price {
	t, err := builtinTable()
	if err != nil {
		panic(err) // the embedded file is tested; it cannot be wrong at run time
	}
	out := make(map[string]Price, len(t))
	for k, v := range t {
		out[k] = v.Price
	}
	return out
}

// priceTable resolves model names to table entries: exactly, then by the
// longest known name that is a prefix of the model followed by "-", ":" or
// "@" (so "gpt-4o-2024-08-06" resolves to "gpt-4o" and "gpt-4-0613" to
// "gpt-4", never to "gpt-4o"). A fine-tuned model "ft:BASE:org::id"
// resolves as BASE.
type priceTable struct {
	exact map[string]tableEntry
	names []string // sorted longest first
}

func newPriceTable(m map[string]tableEntry) *priceTable {
	t := &priceTable{exact: m, names: make([]string, 0, len(m))}
	for k := range m {
		t.names = append(t.names, k)
	}
	sort.Slice(t.names, func(i, j int) bool {
		if len(t.names[i]) != len(t.names[j]) {
			return len(t.names[i]) > len(t.names[j])
		}
		return t.names[i] < t.names[j]
	})
	return t
}

func (t *priceTable) lookup(model string) (tableEntry, string, bool) {
	m := strings.ToLower(strings.TrimSpace(model))
	if e, ok := t.exact[m]; ok {
		return e, m, true
	}
	if rest, ok := strings.CutPrefix(m, "ft:"); ok {
		base, _, _ := strings.Cut(rest, ":")
		m = base
		if e, ok := t.exact[m]; ok {
			return e, m, true
		}
	}
	for _, name := range t.names {
		if len(m) > len(name) && strings.HasPrefix(m, name) {
			switch m[len(name)] {
			case '-', ':', '@':
				return t.exact[name], name, true
			}
		}
	}
	return tableEntry{}, "", false
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
