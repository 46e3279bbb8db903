package costmodel

import (
	"errors"
	"testing"
)

func TestParseUsage(t *testing.T) {
	cases := []struct {
		name string
		kind Kind
		body string
		want Usage
		err  bool
	}{
		{"chat", ChatCompletions, `{"id":"x","usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150,"prompt_tokens_details":{"cached_tokens":64},"completion_tokens_details":{"reasoning_tokens":20}}}`,
			Usage{InputTokens: 100, CachedInputTokens: 64, OutputTokens: 50, ReasoningTokens: 20}, false},
		{"embeddings", Embeddings, `{"data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}`, Usage{InputTokens: 8}, false},
		{"responses", Responses, `{"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":2},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":3}}}`,
			Usage{InputTokens: 10, CachedInputTokens: 2, OutputTokens: 7, ReasoningTokens: 3}, false},
		{"anthropic", AnthropicMessages, `{"usage":{"input_tokens":5,"cache_creation_input_tokens":10,"cache_read_input_tokens":20,"output_tokens":9}}`,
			Usage{InputTokens: 35, CachedInputTokens: 20, CacheWriteTokens: 10, OutputTokens: 9}, false},
		{"no usage", ChatCompletions, `{"id":"x"}`, Usage{}, true},
		{"null usage", ChatCompletions, `{"usage":null}`, Usage{}, true},
		{"malformed", ChatCompletions, `{"usage":`, Usage{}, true},
		{"wrong type", ChatCompletions, `{"usage":{"prompt_tokens":"ten"}}`, Usage{}, true},
		{"empty", AnthropicMessages, ``, Usage{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u, err := ParseUsage(c.kind, []byte(c.body))
			if (err != nil) != c.err || u != c.want {
				t.Errorf("ParseUsage = %+v, %v; want %+v, error %v", u, err, c.want, c.err)
			}
		})
	}
	if _, err := ParseUsage(ChatCompletions, []byte(`{}`)); !errors.Is(err, ErrNoUsage) {
		t.Errorf("missing usage: %v, want ErrNoUsage", err)
	}
}

func TestPriceCost(t *testing.T) {
	p := Price{Input: 2_500_000_000, CachedInput: 1_250_000_000, Output: 10 * Dollar, CacheWrite: 3_750_000_000, PerCall: 7, PerUnit: 3}
	cases := []struct {
		name string
		u    Usage
		want NanoUSD
	}{
		{"zero", Usage{}, 7},
		{"one input token", Usage{InputTokens: 1}, 7 + 2500},
		{"million in, million out", Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000}, 7 + 2_500_000_000 + 10_000_000_000},
		{"cached part", Usage{InputTokens: 1000, CachedInputTokens: 400}, 7 + 600*2500 + 400*1250},
		{"cache writes", Usage{InputTokens: 1000, CachedInputTokens: 400, CacheWriteTokens: 100}, 7 + 500*2500 + 400*1250 + 100*3750},
		{"units", Usage{Units: 5}, 7 + 15},
		{"negative is zero", Usage{InputTokens: -5, OutputTokens: -1}, 7},
	}
	for _, c := range cases {
		if got := p.Cost(c.u); got != c.want {
			t.Errorf("%s: Cost = %d, want %d", c.name, got, c.want)
		}
	}
	// Rounding up per component: a token at $0.0015/M is 1.5 nano-dollars.
	if got := (Price{Input: 1_500_000, Output: 1_500_000}).Cost(Usage{InputTokens: 1, OutputTokens: 3}); got != 2+5 {
		t.Errorf("rounding: %d, want 7", got)
	}
	// Saturation instead of overflow.
	huge := Price{Input: 1 << 62, Output: 1 << 62}
	if got := huge.Cost(Usage{InputTokens: 1 << 62, OutputTokens: 1 << 62}); got != NanoUSD(1<<63-1) {
		t.Errorf("saturation: %d", got)
	}
	// Unset cached and write prices fall back to the input price.
	q := Price{Input: Dollar}
	if got := q.Cost(Usage{InputTokens: 2_000_000, CachedInputTokens: 1_000_000}); got != 2*Dollar {
		t.Errorf("fallback: %d", got)
	}
}
