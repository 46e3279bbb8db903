package costmodel

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestEstimateBadRequest(t *testing.T) {
	e := newTestEstimator(t)
	cases := []struct {
		kind Kind
		body string
		msg  string // in the error text
	}{
		{ChatCompletions, ``, "empty body"},
		{ChatCompletions, `{"model":"gpt-4o","messages":[}`, "invalid JSON"},
		{ChatCompletions, `{"model":"gpt-4o","messages":[]} x`, "invalid JSON"},
		{ChatCompletions, `{"model":5,"messages":[]}`, "model: want a string"},
		{ChatCompletions, `{"model":"gpt-4o","messages":"hi"}`, "messages: want an array"},
		{ChatCompletions, `{"model":"gpt-4o","messages":[1]}`, "messages[0]: want an object"},
		{ChatCompletions, `{"model":"gpt-4o","messages":[{"role":1}]}`, "messages[0]"},
		{ChatCompletions, `{"model":"gpt-4o","messages":[],"max_tokens":"many"}`, "max_tokens: want an integer"},
		{ChatCompletions, `{"model":"gpt-4o","messages":[],"max_tokens":1.5}`, "max_tokens: want an integer"},
		{ChatCompletions, `{"model":"gpt-4o","messages":[],"stream":"yes"}`, "stream: want a boolean"},
		{ChatCompletions, `{"messages":[]}`, "missing model"},
		{ChatCompletions, `{"model":"gpt-4o"}`, "missing messages"},
		{ChatCompletions, `[]`, "want a JSON object"},
		{Completions, `{"model":"x","prompt":{}}`, "prompt"},
		{Embeddings, `{"model":"text-embedding-3-small"}`, "missing input"},
		{Embeddings, `{"model":"text-embedding-3-small","input":[true]}`, "input"},
		{Responses, `{"model":"gpt-4.1","input":5}`, "input"},
		{AnthropicMessages, `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":5}]}`, "messages[0]"},
		{AnthropicMessages, `{"model":"claude-sonnet-4-5"`, "invalid JSON"},
		{Generic, `{}`, "Rule"},
	}
	for _, c := range cases {
		_, err := e.Estimate(c.kind, []byte(c.body))
		var bad *BadRequestError
		if !errors.As(err, &bad) {
			t.Errorf("%s %s: error %v, want a *BadRequestError", c.kind, c.body, err)
			continue
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s %s: error %q does not say %q", c.kind, c.body, err, c.msg)
		}
	}
}

func TestEstimateOutput(t *testing.T) {
	e := newTestEstimator(t)
	half, err := NewEstimator(Config{OutputReserve: 50})
	if err != nil {
		t.Fatal(err)
	}
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name    string
		e       *Estimator
		kind    Kind
		body    string
		out     int64
		maxOut  int64
		stream  bool
		sUsage  bool
		unknown bool
	}{
		{"max_tokens", e, ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":100}`, 100, 100, false, false, false},
		{"max_completion_tokens wins", e, ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":100,"max_completion_tokens":300}`, 300, 300, false, false, false},
		{"model maximum", e, ChatCompletions, `{"model":"gpt-4o-2024-08-06",` + msgs + `}`, 16384, 0, false, false, false},
		{"n choices", e, ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":100,"n":3}`, 300, 100, false, false, false},
		{"half reserved", half, ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":101}`, 51, 101, false, false, false},
		{"stream usage", e, ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"stream":true,"stream_options":{"include_usage":true}}`, 16384, 0, true, true, false},
		{"unknown model", e, ChatCompletions, `{"model":"my-local-llm",` + msgs + `}`, 4096, 0, false, false, true},
		{"completions default 16", e, Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":"hi"}`, 16, 0, false, false, false},
		{"completions two prompts", e, Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":["a","b"],"max_tokens":10}`, 20, 10, false, false, false},
		{"embeddings none", e, Embeddings, `{"model":"text-embedding-3-small","input":"hi"}`, 0, 0, false, false, false},
		{"responses", e, Responses, `{"model":"o3","input":"hi","max_output_tokens":500}`, 500, 500, false, false, false},
		{"anthropic", e, AnthropicMessages, `{"model":"claude-3-5-haiku-20241022",` + msgs + `,"max_tokens":1024,"stream":true}`, 1024, 1024, true, true, false},
	}
	for _, c := range cases {
		est, err := c.e.Estimate(c.kind, []byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if est.Usage.OutputTokens != c.out || est.MaxOutputTokens != c.maxOut || est.Stream != c.stream || est.StreamUsage != c.sUsage || est.UnknownModel != c.unknown {
			t.Errorf("%s: got output %d, max %d, stream %v/%v, unknown %v", c.name, est.Usage.OutputTokens, est.MaxOutputTokens, est.Stream, est.StreamUsage, est.UnknownModel)
		}
		if est.Usage.InputTokens <= 0 {
			t.Errorf("%s: no input tokens", c.name)
		}
		if want := c.e.Cost(est.Model, est.Usage); est.Cost != want || want <= 0 {
			t.Errorf("%s: cost %d, Cost() %d", c.name, est.Cost, want)
		}
	}
}

func TestEstimateCounts(t *testing.T) {
	e := newTestEstimator(t)
	hello := e.CountText("gpt-4o", "hello world")
	cases := []struct {
		name string
		kind Kind
		body string
		want int64
	}{
		// 3 (message) + 1 (role) + content + 3 (priming)
		{"one message", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}`, 7 + hello},
		{"parts", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"hello world"}]}]}`, 7 + hello},
		{"name", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","name":"bob","content":"hello world"}]}`, 7 + hello + 1 + e.CountText("gpt-4o", "bob")},
		{"low image", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"low"}}]}]}`, 7 + 85},
		{"remote image, worst case", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/a.png"}}]}]}`, 7 + 85 + 8*170},
		{"embeddings strings", Embeddings, `{"model":"text-embedding-3-small","input":["hello world","hello world"]}`, 2 * e.CountText("text-embedding-3-small", "hello world")},
		{"embeddings escapes", Embeddings, `{"model":"text-embedding-3-small","input":["hello\nworld","\u00e9t\u00e9"]}`, e.CountText("text-embedding-3-small", "hello\nworld") + e.CountText("text-embedding-3-small", "été")},
		{"completions suffix and ids", Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":[[1,2],[3]],"suffix":"hello world"}`, 3 + 2*e.CountText("gpt-3.5-turbo", "hello world")},
		{"embeddings token ids", Embeddings, `{"model":"text-embedding-3-small","input":[[1,2,3],[4,5]]}`, 5},
		{"completions", Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":"hello world"}`, e.CountText("gpt-3.5-turbo", "hello world")},
		{"escaped content", ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":"hello\u0020world"}]}`, 7 + hello},
		{"escaped key", ChatCompletions, `{"mod\u0065l":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}`, 7 + hello},
	}
	for _, c := range cases {
		est, err := e.Estimate(c.kind, []byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if est.Usage.InputTokens != c.want {
			t.Errorf("%s: input tokens %d, want %d", c.name, est.Usage.InputTokens, c.want)
		}
	}
}

func TestImageTiles(t *testing.T) {
	// OpenAI's worked examples: 1024×1024 high detail is 765 tokens on
	// gpt-4o; 2048×4096 is 1105.
	cases := []struct {
		w, h  int
		tiles int64
	}{{1024, 1024, 4}, {2048, 4096, 6}, {512, 512, 1}, {4096, 8192, 6}}
	for _, c := range cases {
		if got := imageTiles(c.w, c.h); got != c.tiles {
			t.Errorf("%dx%d: %d tiles, want %d", c.w, c.h, got, c.tiles)
		}
	}
	// Patches: 1024×1024 is 1024 patches; 1800×2400 scales to 1452.
	if got := imagePatches(1024, 1024); got != 1024 {
		t.Errorf("1024x1024: %d patches", got)
	}
	if got := imagePatches(1800, 2400); got != 1452 {
		t.Errorf("1800x2400: %d patches, want 1452", got)
	}
}

func TestPriceLookup(t *testing.T) {
	e, err := NewEstimator(Config{Prices: map[string]Price{"gpt-4o": {Input: 1, Output: 2}, "my-model": {Input: 3, Output: 4, MaxOutputTokens: 99}}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		model string
		in    NanoUSD
		known bool
		enc   string
	}{
		{"gpt-4o", 1, true, EncodingO200k},
		{"gpt-4o-2024-08-06", 1, true, EncodingO200k},
		{"gpt-4o-mini-2024-07-18", 150_000_000, true, EncodingO200k},
		{"gpt-4-0613", 30 * Dollar, true, EncodingCl100k},
		{"ft:gpt-4o-mini-2024-07-18:org::abc", 300_000_000, true, EncodingO200k}, // fine-tuned inference rate
		{"claude-sonnet-4-5-20250929", 3 * Dollar, true, EncodingAnthropic},
		{"claude-sonnet-4-20250514", 3 * Dollar, true, EncodingAnthropic},
		{"my-model", 3, true, EncodingO200k},
		{"gpt-5.4-mini-2026-03-17", 750_000_000, true, EncodingO200k},
		{"gpt-5.4", 2_500_000_000, true, EncodingO200k}, // not gpt-5
		{"gpt-5-2025-08-07", 1_250_000_000, true, EncodingO200k},
		{"claude-opus-4-6", 5 * Dollar, true, EncodingAnthropic},
		{"mystery", 150 * Dollar, false, EncodingO200k}, // the table's highest input price
	}
	for _, c := range cases {
		p, known := e.Price(c.model)
		if p.Input != c.in || known != c.known || e.Encoding(c.model) != c.enc {
			t.Errorf("%s: input %d known %v enc %s; want %d %v %s", c.model, p.Input, known, e.Encoding(c.model), c.in, c.known, c.enc)
		}
	}
	before := e.UnknownModels()
	e.Estimate(ChatCompletions, []byte(`{"model":"mystery","messages":[]}`))
	if e.UnknownModels() != before+1 {
		t.Errorf("unknown model not counted")
	}
	free, _ := NewEstimator(Config{FreeUnknown: true})
	if p, _ := free.Price("mystery"); !p.IsZero() {
		t.Errorf("FreeUnknown: %+v", p)
	}
	for _, bad := range []Config{{OutputReserve: 101}, {OutputReserve: -1}, {Encodings: map[string]string{"x": "gpt2"}}, {Prices: map[string]Price{"x": {Input: -1}}}} {
		if _, err := NewEstimator(bad); err == nil {
			t.Errorf("NewEstimator(%+v) accepted", bad)
		}
	}
}

func TestBuiltinPricesLoad(t *testing.T) {
	p := BuiltinPrices()
	if len(p) < 20 {
		t.Fatalf("%d built-in prices", len(p))
	}
	for name, v := range p {
		if v.Input <= 0 {
			t.Errorf("%s: no input price", name)
		}
	}
}

func TestEstimateJSON(t *testing.T) {
	e := newTestEstimator(t)
	est, err := e.Estimate(ChatCompletions, []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(est)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"kind", "model", "encoding", "usage", "cost_nano_usd", "cost_usd", "max_output_tokens"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, b)
		}
	}
	if back["kind"] != "chat_completions" || back["cost_usd"] != est.Cost.String() {
		t.Errorf("JSON %s", b)
	}
}

// The cache must never change a count, whatever else shares it.
func TestCacheConsistency(t *testing.T) {
	cached, err := NewEstimator(Config{CacheEntries: 64})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := NewEstimator(Config{CacheEntries: -1})
	if err != nil {
		t.Fatal(err)
	}
	img := `{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/a.png"}}]}`
	for round := 0; round < 3; round++ {
		for _, model := range []string{"gpt-4o", "gpt-4o-mini", "gpt-4", "gpt-4.1-mini", "gpt-3.5-turbo-0301"} {
			for i := 0; i < 50; i++ {
				body := `{"model":"` + model + `","messages":[` + img + `,{"role":"user","name":"n","content":"message ` + strings.Repeat("x", i) + `"}]}`
				a, err1 := cached.Estimate(ChatCompletions, []byte(body))
				b, err2 := plain.Estimate(ChatCompletions, []byte(body))
				if err1 != nil || err2 != nil || a != b {
					t.Fatalf("%s: cached %+v %v, plain %+v %v", model, a, err1, b, err2)
				}
			}
		}
	}
	// A Responses request's tools are counted once for every number of
	// calls its hosted tools may make, and apart from a chat request's
	// tools of the same bytes.
	tools := `[{"type":"web_search"},{"type":"file_search","vector_store_ids":["vs_1"]},{"type":"function","name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string"}}}},{"type":"mcp","server_label":"s","server_url":"https://x"},{"type":"code_interpreter","container":{"type":"auto","memory_limit":"4g"}}]`
	for round := 0; round < 3; round++ {
		for _, calls := range []string{"", `,"max_tool_calls":3`, `,"max_tool_calls":7`} {
			for _, model := range []string{"gpt-4o", "gpt-4"} {
				body := `{"model":"` + model + `","input":"hi","tools":` + tools + calls + `}`
				a, err1 := cached.Estimate(Responses, []byte(body))
				b, err2 := plain.Estimate(Responses, []byte(body))
				if err1 != nil || err2 != nil || a != b {
					t.Fatalf("responses %s%s: cached %+v %v, plain %+v %v", model, calls, a, err1, b, err2)
				}
				chat := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"tools":` + tools + `}`
				a, err1 = cached.Estimate(ChatCompletions, []byte(chat))
				b, err2 = plain.Estimate(ChatCompletions, []byte(chat))
				if (err1 == nil) != (err2 == nil) || a != b {
					t.Fatalf("chat %s: cached %+v %v, plain %+v %v", model, a, err1, b, err2)
				}
			}
		}
	}
	if n := cached.cache.len(); n > 64 {
		t.Errorf("cache holds %d entries, bound 64", n)
	}
}
