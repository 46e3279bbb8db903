package costmodel

// Security tests: one named case per finding of the costmodel security
// review (prices by name prefix, canonical names, billed dimensions, the
// model a response reports, arithmetic, parser differentials, parts that
// cannot be counted).

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func estimatorWith(t testing.TB, cfg Config) *Estimator {
	t.Helper()
	e, err := NewEstimator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestSecurityModelResolution(t *testing.T) {
	e := estimatorWith(t, Config{})
	def := e.defaultPrice
	cases := []struct {
		name      string
		model     string
		canonical string
		known     bool
		input     NanoUSD // Price.Input, when known
	}{
		{"deep research is not o3", "o3-deep-research", "o3-deep-research", true, 10 * Dollar},
		{"deep research snapshot", "o3-deep-research-2025-06-26", "o3-deep-research", true, 10 * Dollar},
		{"o4-mini deep research is not o4-mini", "o4-mini-deep-research", "o4-mini-deep-research", true, 2 * Dollar},
		{"audio preview is not gpt-4o", "gpt-4o-audio-preview", "gpt-4o-audio-preview", true, 2_500_000_000},
		{"audio preview snapshot", "gpt-4o-audio-preview-2024-12-17", "gpt-4o-audio-preview", true, 2_500_000_000},
		{"ft of an alias base", "ft:gpt-4o-mini-2024-07-18:org::id", "ft:gpt-4o-mini", true, 300_000_000},
		{"ft of a base name", "ft:gpt-4o-mini:org::id", "ft:gpt-4o-mini", true, 300_000_000},
		{"ft of gpt-4.1", "ft:gpt-4.1-2025-04-14:acme:x:abc", "ft:gpt-4.1", true, 3 * Dollar},
		{"ft of an unpriced base", "ft:gpt-5.5:org::id", "ft:gpt-5.5:org::id", false, 0},
		{"ft of an unknown base", "ft:mystery:org::id", "ft:mystery:org::id", false, 0},
		{"dated alias", "gpt-4o-2024-08-06", "gpt-4o", true, 2_500_000_000},
		{"another dated alias", "gpt-4o-2024-11-20", "gpt-4o", true, 2_500_000_000},
		{"separately priced snapshot", "gpt-4o-2024-05-13", "gpt-4o-2024-05-13", true, 5 * Dollar},
		{"claude dated alias", "claude-sonnet-4-5-20250929", "claude-sonnet-4-5", true, 3 * Dollar},
		{"case and space", "  GPT-4o-2024-08-06 ", "gpt-4o", true, 2_500_000_000},
		{"undeclared snapshot is unknown", "gpt-4o-2099-01-01", "gpt-4o-2099-01-01", false, 0},
		{"prefix of a known model is unknown", "gpt-4o-anything", "gpt-4o-anything", false, 0},
		{"suffix after colon is unknown", "gpt-4o:latest", "gpt-4o:latest", false, 0},
		{"unknown keeps its name, lowercased", " Mystery-Model ", "mystery-model", false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, known := e.Price(c.model)
			if known != c.known {
				t.Fatalf("known = %v, want %v", known, c.known)
			}
			if got := e.Canonical(c.model); got != c.canonical {
				t.Errorf("Canonical = %q, want %q", got, c.canonical)
			}
			if c.known && p.Input != c.input {
				t.Errorf("input %v, want %v", p.Input, c.input)
			}
			if !c.known && p != def {
				t.Errorf("unknown model priced %+v, want the default %+v", p, def)
			}
		})
	}
	before := e.UnknownModels()
	if _, err := e.Estimate(ChatCompletions, []byte(`{"model":"gpt-4o-anything","messages":[]}`)); err != nil {
		t.Fatal(err)
	}
	if e.UnknownModels() != before+1 {
		t.Errorf("an unknown model is not counted")
	}
}

func TestSecurityDefaultPriceIsHighest(t *testing.T) {
	e := estimatorWith(t, Config{})
	def := e.defaultPrice
	u := Usage{InputTokens: 1_000_000, CacheWriteTokens: 300_000, CacheWrite1hTokens: 100_000, AudioInputTokens: 200_000,
		OutputTokens: 1_000_000, AudioOutputTokens: 500_000, WebSearchRequests: 3}
	long := u
	long.InputTokens = 2_000_000
	for name, p := range BuiltinPrices() {
		for _, uu := range []Usage{u, long} {
			if p.Cost(uu) > def.Cost(uu) {
				t.Errorf("%s costs %v for %+v, more than an unknown model (%v)", name, p.Cost(uu), uu, def.Cost(uu))
			}
		}
	}
}

func TestSecurityConfigAliases(t *testing.T) {
	e := estimatorWith(t, Config{
		Prices:  map[string]Price{"gpt-4o": {Input: 7, Output: 8}, "ft:gpt-4o": {Input: 9, Output: 10}},
		Aliases: map[string]string{"my-gpt": "gpt-4o"},
	})
	for model, in := range map[string]NanoUSD{"gpt-4o-2024-08-06": 7, "my-gpt": 7, "ft:gpt-4o-2024-08-06:o::x": 9} {
		if p, ok := e.Price(model); !ok || p.Input != in {
			t.Errorf("%s: %+v %v, want input %d", model, p, ok, in)
		}
	}
	if e.Canonical("MY-GPT") != "gpt-4o" {
		t.Errorf("alias canonical %q", e.Canonical("MY-GPT"))
	}
	for _, cfg := range []Config{
		{Aliases: map[string]string{"x": "no-such-model"}},
		{Aliases: map[string]string{"gpt-4o": "gpt-4o-mini"}},
		{Aliases: map[string]string{"": "gpt-4o"}},
	} {
		if _, err := NewEstimator(cfg); err == nil {
			t.Errorf("NewEstimator(%+v) accepted", cfg.Aliases)
		}
	}
}

func TestSecurityBilledDimensions(t *testing.T) {
	e := estimatorWith(t, Config{})
	const M = 1_000_000
	cases := []struct {
		name  string
		model string
		u     Usage
		want  NanoUSD
	}{
		{"sonnet 4.5 at the threshold", "claude-sonnet-4-5", Usage{InputTokens: 200_000, OutputTokens: M}, 200_000*3000 + 15*Dollar},
		{"sonnet 4.5 one above", "claude-sonnet-4-5", Usage{InputTokens: 200_001, OutputTokens: M}, 200_001*6000 + 22_500_000_000},
		{"sonnet 4 cached tokens count toward the threshold", "claude-sonnet-4-20250514",
			Usage{InputTokens: 250_000, CachedInputTokens: 240_000}, 10_000*6000 + 240_000*600},
		{"gpt-5.4 at 272K", "gpt-5.4", Usage{InputTokens: 272_000, OutputTokens: M}, 272_000*2500 + 15*Dollar},
		{"gpt-5.4 one above", "gpt-5.4", Usage{InputTokens: 272_001, OutputTokens: M}, 272_001*5000 + 22_500_000_000},
		{"gpt-4.1 has no long tier", "gpt-4.1", Usage{InputTokens: 900_000}, 900_000 * 2000},
		{"1h cache writes", "claude-sonnet-4-5", Usage{InputTokens: 3 * M, CacheWriteTokens: 3 * M, CacheWrite1hTokens: M},
			// above 200K: 5m at 7.50, 1h at 12.00
			2*7_500_000_000 + 12*Dollar},
		{"1h cache writes, short", "claude-haiku-4-5", Usage{InputTokens: 150_000, CacheWriteTokens: 150_000, CacheWrite1hTokens: 100_000},
			50_000*1250 + 100_000*2000},
		{"flex halves", "o3", Usage{InputTokens: M, OutputTokens: M, ServiceTier: "flex"}, Dollar + 4*Dollar},
		{"priority", "gpt-5", Usage{InputTokens: M, OutputTokens: M, ServiceTier: "priority"}, 2_500_000_000 + 20*Dollar},
		{"priority undeclared is double", "gpt-5-pro", Usage{InputTokens: M, ServiceTier: "priority"}, 30 * Dollar},
		{"flex undeclared is standard", "gpt-4o", Usage{InputTokens: M, ServiceTier: "flex"}, 2_500_000_000},
		{"default tier", "gpt-4o", Usage{InputTokens: M, ServiceTier: "default"}, 2_500_000_000},
		{"unknown tier is priority", "gpt-4o", Usage{InputTokens: M, ServiceTier: "turbo"}, 4_250_000_000},
		{"anthropic web search", "claude-sonnet-4-5", Usage{WebSearchRequests: 3}, 30_000_000},
		{"openai web search", "o3", Usage{WebSearchRequests: 2}, 20_000_000},
		{"audio tokens as audio", "gpt-4o-audio-preview", Usage{InputTokens: 2 * M, AudioInputTokens: M, OutputTokens: 2 * M, AudioOutputTokens: M},
			2_500_000_000 + 40*Dollar + 10*Dollar + 80*Dollar},
		{"fine-tuned rates", "ft:gpt-4o-mini-2024-07-18:org::x", Usage{InputTokens: M, OutputTokens: M}, 300_000_000 + 1_200_000_000},
		{"deep research rates", "o3-deep-research", Usage{InputTokens: M, OutputTokens: M}, 50 * Dollar},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := e.Cost(c.model, c.u); got != c.want {
				t.Errorf("Cost = %v, want %v", got, c.want)
			}
		})
	}
}

func TestSecurityParseResponse(t *testing.T) {
	cases := []struct {
		name  string
		kind  Kind
		body  string
		want  Usage
		model string
	}{
		{"chat audio and tier", ChatCompletions, `{"model":"gpt-4o-audio-preview-2024-12-17","service_tier":"default","usage":{"prompt_tokens":100,"completion_tokens":50,` +
			`"prompt_tokens_details":{"cached_tokens":10,"audio_tokens":60},"completion_tokens_details":{"audio_tokens":40,"reasoning_tokens":0}}}`,
			Usage{InputTokens: 100, CachedInputTokens: 10, AudioInputTokens: 60, OutputTokens: 50, AudioOutputTokens: 40, ServiceTier: "default"},
			"gpt-4o-audio-preview-2024-12-17"},
		{"chat flex", ChatCompletions, `{"model":"o3-2025-04-16","service_tier":"flex","usage":{"prompt_tokens":1,"completion_tokens":2}}`,
			Usage{InputTokens: 1, OutputTokens: 2, ServiceTier: "flex"}, "o3-2025-04-16"},
		{"responses web search", Responses, `{"model":"o3-deep-research","service_tier":"priority","output":[{"type":"web_search_call"},{"type":"reasoning"},{"type":"web_search_call"},{"type":"message"}],` +
			`"usage":{"input_tokens":5,"output_tokens":6}}`,
			Usage{InputTokens: 5, OutputTokens: 6, WebSearchRequests: 2, ServiceTier: "priority"}, "o3-deep-research"},
		{"anthropic cache lifetimes and search", AnthropicMessages, `{"model":"claude-sonnet-4-5-20250929","usage":{"input_tokens":5,"cache_read_input_tokens":20,` +
			`"cache_creation_input_tokens":30,"cache_creation":{"ephemeral_5m_input_tokens":10,"ephemeral_1h_input_tokens":20},"output_tokens":9,"server_tool_use":{"web_search_requests":4}}}`,
			Usage{InputTokens: 55, CachedInputTokens: 20, CacheWriteTokens: 30, CacheWrite1hTokens: 20, OutputTokens: 9, WebSearchRequests: 4},
			"claude-sonnet-4-5-20250929"},
		{"anthropic split without total", AnthropicMessages, `{"usage":{"input_tokens":1,"cache_creation":{"ephemeral_5m_input_tokens":3,"ephemeral_1h_input_tokens":4},"output_tokens":1}}`,
			Usage{InputTokens: 8, CacheWriteTokens: 7, CacheWrite1hTokens: 4, OutputTokens: 1}, ""},
		{"anthropic service tier is not read", AnthropicMessages, `{"usage":{"input_tokens":1,"output_tokens":1,"service_tier":"priority"}}`,
			Usage{InputTokens: 1, OutputTokens: 1}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u, model, err := ParseResponse(c.kind, []byte(c.body))
			if err != nil || u != c.want || model != c.model {
				t.Errorf("ParseResponse = %+v, %q, %v; want %+v, %q", u, model, err, c.want, c.model)
			}
			ru, rmodel, rerr := parseResponse(c.kind, []byte(c.body))
			if ru != u || rmodel != model || rerr != nil {
				t.Errorf("encoding/json reads %+v, %q, %v", ru, rmodel, rerr)
			}
		})
	}
	if _, model, err := ParseResponse(ChatCompletions, []byte(`{"model":"gpt-4o"}`)); !errors.Is(err, ErrNoUsage) || model != "gpt-4o" {
		t.Errorf("no usage: %q, %v", model, err)
	}
}

func TestSecurityStreamReportsModel(t *testing.T) {
	e := estimatorWith(t, Config{})
	cases := []struct {
		name   string
		kind   Kind
		stream string
		model  string
		want   Usage
	}{
		{"chat", ChatCompletions, "data: {\"model\":\"gpt-5-2025-08-07\",\"service_tier\":\"priority\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
			"data: {\"model\":\"gpt-5-2025-08-07\",\"service_tier\":\"priority\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"completion_tokens_details\":{\"audio_tokens\":1}}}\n\ndata: [DONE]\n\n",
			"gpt-5-2025-08-07", Usage{InputTokens: 3, OutputTokens: 4, AudioOutputTokens: 1, ServiceTier: "priority"}},
		{"responses", Responses, "data: {\"type\":\"response.created\",\"response\":{\"model\":\"o3-deep-research\",\"service_tier\":\"flex\"}}\n\n" +
			"data: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"web_search_call\"}}\n\n" +
			"data: {\"type\":\"response.completed\",\"response\":{\"model\":\"o3-deep-research\",\"usage\":{\"input_tokens\":2,\"output_tokens\":3}}}\n\n",
			"o3-deep-research", Usage{InputTokens: 2, OutputTokens: 3, WebSearchRequests: 1, ServiceTier: "flex"}},
		{"anthropic", AnthropicMessages, "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-opus-4-6\",\"usage\":{\"input_tokens\":1,\"cache_creation_input_tokens\":5,\"cache_creation\":{\"ephemeral_5m_input_tokens\":2,\"ephemeral_1h_input_tokens\":3},\"output_tokens\":1}}}\n\n" +
			"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7,\"server_tool_use\":{\"web_search_requests\":2}}}\n\n",
			"claude-opus-4-6", Usage{InputTokens: 6, CacheWriteTokens: 5, CacheWrite1hTokens: 3, OutputTokens: 7, WebSearchRequests: 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := e.NewStreamMeter(c.kind, "requested-model")
			m.Write([]byte(c.stream))
			u, reported := m.Usage()
			if !reported || u != c.want || m.Model() != c.model {
				t.Errorf("Usage = %+v %v, Model %q; want %+v, %q", u, reported, m.Model(), c.want, c.model)
			}
		})
	}
}

func TestSecurityOverflow(t *testing.T) {
	e := estimatorWith(t, Config{})
	const big = "9223372036854775807"
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name string
		kind Kind
		body string
	}{
		{"chat max_tokens", ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":` + big + `}`},
		{"chat max_completion_tokens", ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_completion_tokens":` + big + `}`},
		{"chat n", ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"n":9223372036854775000}`},
		{"chat n times max_tokens", ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"n":4294967296,"max_tokens":4294967296}`},
		{"completions best_of", Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":"x","best_of":` + big + `}`},
		{"completions prompts times max_tokens", Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":["a","b"],"max_tokens":` + big + `}`},
		{"responses max_output_tokens", Responses, `{"model":"gpt-4.1","input":"x","max_output_tokens":` + big + `}`},
		{"anthropic max_tokens", AnthropicMessages, `{"model":"claude-sonnet-4-5",` + msgs + `,"max_tokens":` + big + `}`},
		{"unknown model cost", ChatCompletions, `{"model":"mystery",` + msgs + `,"max_tokens":100000000000000}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			est, err := e.Estimate(c.kind, []byte(c.body))
			var bad *BadRequestError
			if !errors.Is(err, ErrCostOverflow) || !errors.As(err, &bad) {
				t.Fatalf("Estimate = %+v, %v; want a *BadRequestError wrapping ErrCostOverflow", est, err)
			}
		})
	}
	// Representable, if absurd, requests are priced, never wrapped.
	est, err := e.Estimate(ChatCompletions, []byte(`{"model":"gpt-4o",`+msgs+`,"max_tokens":1000000000000}`))
	if err != nil || est.Cost <= 0 {
		t.Errorf("large but representable: %+v, %v", est, err)
	}

	// Settlement saturates.
	top := int64(math.MaxInt64)
	for name, u := range map[string]Usage{
		"all counts at the top": {InputTokens: top, CachedInputTokens: top, CacheWriteTokens: top, CacheWrite1hTokens: top, AudioInputTokens: top,
			OutputTokens: top, ReasoningTokens: top, AudioOutputTokens: top, WebSearchRequests: top, Units: top},
		"output at the top":   {OutputTokens: top},
		"searches at the top": {WebSearchRequests: top},
		"negative counts":     {InputTokens: -top, OutputTokens: math.MinInt64, CachedInputTokens: top},
	} {
		for _, model := range []string{"o1-pro", "claude-opus-4-6", "mystery"} {
			if c := e.Cost(model, u); c < 0 {
				t.Errorf("%s, %s: cost %v", name, model, c)
			}
		}
		if c := (Price{PerCall: math.MaxInt64, PerUnit: math.MaxInt64, Output: math.MaxInt64, PriorityPercent: math.MaxInt64}).Cost(Usage{OutputTokens: top, Units: top, ServiceTier: "priority"}); c != math.MaxInt64 {
			t.Errorf("%s: saturated price gives %v", name, c)
		}
	}

	// Generic rules: units from the request, and the complexity's filters.
	r := Rule{PerCall: 1, PerUnit: 1000, Units: &Source{Query: "num"}}
	_, err = r.Estimate(GenericRequest{Query: map[string][]string{"num": {big}}})
	if !errors.Is(err, ErrCostOverflow) {
		t.Errorf("rule units %s: %v", big, err)
	}
	_, err = r.Estimate(GenericRequest{Query: map[string][]string{"num": {"1e300"}}})
	if !errors.Is(err, ErrCostOverflow) {
		t.Errorf("rule units 1e300: %v", err)
	}
	cx := Rule{PerUnit: 1, Complexity: &Complexity{Query: Source{Query: "q"}, Filters: Source{Query: "f"}, QueryPrefix: "x_"}}
	est, err = cx.Estimate(GenericRequest{Query: map[string][]string{"q": {"a"}, "f": {big}, "x_1": {"1"}}})
	if err == nil && est.Cost < 0 || err != nil && !errors.Is(err, ErrCostOverflow) {
		t.Errorf("complexity filters at the top: %+v, %v", est, err)
	}
}

func TestSecurityPricedFieldSpelling(t *testing.T) {
	e := estimatorWith(t, Config{})
	chat := func(extra string) string {
		return `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	cases := []struct {
		name  string
		kind  Kind
		body  string
		field string // "" when the body is accepted
	}{
		{"model case variant", ChatCompletions, chat(`,"Model":"gpt-5.5-pro"`), "model"},
		{"model duplicate", ChatCompletions, chat(`,"model":"gpt-5.5-pro"`), "model"},
		{"model escaped duplicate", ChatCompletions, chat(`,"mod\u0065l":"gpt-5.5-pro"`), "model"},
		{"model long-s variant", ChatCompletions, `{"model":"gpt-4o-mini","meſſages":[],"messages":[]}`, "messages"},
		{"messages variant", ChatCompletions, chat(`,"MESSAGES":[]`), "messages"},
		{"max_tokens variant", ChatCompletions, chat(`,"Max_Tokens":5`), "max_tokens"},
		{"max_completion_tokens duplicate", ChatCompletions, chat(`,"max_completion_tokens":5,"max_completion_tokens":6`), "max_completion_tokens"},
		{"n variant", ChatCompletions, chat(`,"N":5`), "n"},
		{"stream variant", ChatCompletions, chat(`,"Stream":true`), "stream"},
		{"tools duplicate", ChatCompletions, chat(`,"tools":[],"tools":[]`), "tools"},
		{"functions variant", ChatCompletions, chat(`,"Functions":[]`), "functions"},
		{"modalities variant", ChatCompletions, chat(`,"modalities":["text"],"Modalities":["audio"]`), "modalities"},
		{"service_tier variant", ChatCompletions, chat(`,"Service_Tier":"priority"`), "service_tier"},
		{"stream_options variant", ChatCompletions, chat(`,"stream":true,"Stream_Options":{"include_usage":true}`), "stream_options"},
		{"include_usage variant", ChatCompletions, chat(`,"stream":true,"stream_options":{"INCLUDE_USAGE":true}`), "stream_options.include_usage"},
		{"include_usage duplicate", ChatCompletions, chat(`,"stream":true,"stream_options":{"include_usage":false,"include_usage":true}`), "stream_options.include_usage"},
		{"message content duplicate", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":"a","Content":"a much longer text"}]}`, `"content"`},
		{"message role duplicate", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","role":"system","content":"a"}]}`, `"role"`},
		{"content part text duplicate", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"a","TEXT":"b"}]}]}`, `"text"`},
		{"image_url detail duplicate", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x","detail":"low","Detail":"high"}}]}]}`, `"detail"`},
		{"tool description duplicate", ChatCompletions, chat(`,"tools":[{"type":"function","function":{"name":"f","description":"a much longer text","Description":"b"}}]`), `"description"`},
		{"function parameters duplicate", ChatCompletions, chat(`,"functions":[{"name":"f","parameters":{"type":"object"},"parameters":{}}]`), `"parameters"`},
		{"tool kind duplicate", ChatCompletions, chat(`,"tools":[{"type":"function","Type":"custom","function":{"name":"f"}}]`), `"type"`},
		{"tool arguments keep their own keys", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"a\":1,\"A\":2}"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"},"A":{"type":"string"}}}}}]}`, ""},
		{"completions prompt variant", Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":"a","Prompt":"b"}`, "prompt"},
		{"completions best_of variant", Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":"a","Best_Of":5}`, "best_of"},
		{"embeddings input duplicate", Embeddings, `{"model":"text-embedding-3-small","input":"a","input":"b"}`, "input"},
		{"responses instructions variant", Responses, `{"model":"gpt-4.1","input":"x","Instructions":"y"}`, "instructions"},
		{"responses max_output_tokens variant", Responses, `{"model":"gpt-4.1","input":"x","MAX_OUTPUT_TOKENS":1}`, "max_output_tokens"},
		{"responses item content duplicate", Responses, `{"model":"gpt-4.1","input":[{"role":"user","content":"a","content":"b"}]}`, `"content"`},
		{"anthropic system variant", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[],"System":"s"}`, "system"},
		{"anthropic thinking variant", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[],"Thinking":{"type":"enabled"}}`, "thinking"},
		{"anthropic block duplicate", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"a","Text":"b"}]}]}`, `"text"`},
		{"anthropic tool input keeps its own keys", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"1","name":"f","input":{"a":1,"A":2}}]}]}`, ""},
		{"unpriced fields may vary", ChatCompletions, chat(`,"user":"a","User":"b","metadata":{"x":1,"X":2}`), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.Estimate(c.kind, []byte(c.body))
			if c.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var bad *BadRequestError
			if !errors.As(err, &bad) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("error %v; want a *BadRequestError naming %s", err, c.field)
			}
		})
	}
	// A message refused once is refused again (its count is not cached).
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"a","Content":"b"}]}`)
	for range 2 {
		if _, err := e.Estimate(ChatCompletions, body); err == nil {
			t.Fatal("duplicate member accepted")
		}
	}
}

func TestSecurityUncounted(t *testing.T) {
	e := estimatorWith(t, Config{})
	pdf := strings.Repeat("A", 400_000) // 300,000 bytes decoded
	cases := []struct {
		name      string
		kind      Kind
		body      string
		uncounted bool
		minInput  int64
		audioIn   int64
	}{
		{"plain text", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, false, 1, 0},
		{"file part inline", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` + pdf + `"}}]}]}`, true, 150_000, 0},
		{"small file part", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,QUJD"}}]}]}`, true, docMinTokens, 0},
		{"file part by id", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-1"}}]}]}`, true, docMaxTokens, 0},
		{"audio part", ChatCompletions, `{"model":"gpt-4o-audio-preview","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + strings.Repeat("A", 4000) + `","format":"mp3"}}]}]}`, true, 60, 60},
		{"image by url", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}`, true, 1000, 0},
		{"low detail image is exact", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]}]}`, false, 85, 0},
		{"reasoning model", ChatCompletions, `{"model":"o3-2025-04-16","messages":[{"role":"user","content":"hi"}]}`, true, 1, 0},
		{"gpt-5 family", Responses, `{"model":"gpt-5","input":"hi"}`, true, 1, 0},
		{"unknown model", ChatCompletions, `{"model":"mystery","messages":[]}`, true, 1, 0},
		{"responses previous_response_id", Responses, `{"model":"gpt-4.1","input":"hi","previous_response_id":"resp_1"}`, true, 1, 0},
		{"responses input_file", Responses, `{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, true, docMaxTokens, 0},
		{"responses web search", Responses, `{"model":"gpt-4.1","input":"hi","tools":[{"type":"web_search"}]}`, true, 1, 0},
		{"anthropic thinking", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}`, true, 1, 0},
		{"anthropic thinking disabled", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"hi"}]}`, false, 1, 0},
		{"anthropic pdf", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf + `"}}]}]}`, true, 150_000, 0},
		{"anthropic text document is exact", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"hello"}}]}]}`, false, 1, 0},
		{"anthropic image by url", AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x"}}]}]}`, true, anthropicImageMax, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			est, err := e.Estimate(c.kind, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if est.Uncounted != c.uncounted || est.Usage.InputTokens < c.minInput || est.Usage.AudioInputTokens != c.audioIn {
				t.Errorf("Uncounted %v, input %d, audio %d; want %v, at least %d, %d", est.Uncounted, est.Usage.InputTokens, est.Usage.AudioInputTokens, c.uncounted, c.minInput, c.audioIn)
			}
		})
	}
	// Audio output is reserved at the audio rate; search tools reserve searches.
	est, err := e.Estimate(ChatCompletions, []byte(`{"model":"gpt-4o-audio-preview","modalities":["text","audio"],"max_tokens":100,"messages":[]}`))
	if err != nil || est.Usage.AudioOutputTokens != 100 {
		t.Errorf("audio output: %+v, %v", est.Usage, err)
	}
	est, err = e.Estimate(AnthropicMessages, []byte(`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3}]}`))
	if err != nil || est.Usage.WebSearchRequests != 3 || !est.Uncounted {
		t.Errorf("anthropic web search: %+v, %v", est, err)
	}
	est, err = e.Estimate(ChatCompletions, []byte(`{"model":"gpt-5","service_tier":"priority","messages":[]}`))
	if err != nil || est.Usage.ServiceTier != "priority" {
		t.Errorf("requested tier: %+v, %v", est.Usage, err)
	}
}
