package costmodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// FuzzEstimate feeds arbitrary bodies to every request parser: none may
// panic, and every failure must be a *BadRequestError.
func FuzzEstimate(f *testing.F) {
	for _, file := range []string{"testdata/cookbook_chat.json", "testdata/cookbook_tools.json"} {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(ChatCompletions), append([]byte(`{"model":"gpt-4o",`), b[1:]...))
	}
	seeds := []struct {
		k    Kind
		body string
	}{
		{ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]}],"n":2,"max_tokens":5}`},
		{ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}`},
		{Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":["a","b"],"max_tokens":7,"n":2}`},
		{Completions, `{"model":"davinci-002","prompt":[[1,2,3],[4]]}`},
		{Embeddings, `{"model":"text-embedding-3-small","input":["hello","world"]}`},
		{Embeddings, `{"model":"text-embedding-3-small","input":[1,2,3]}`},
		{Responses, `{"model":"gpt-4.1","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","name":"f","arguments":"{}","call_id":"1"},{"type":"function_call_output","call_id":"1","output":"x"}],"max_output_tokens":100}`},
		{Responses, `{"model":"ft:gpt-4o-mini:org::id","input":[{"type":"mcp_call","id":"m","server_label":"s","name":"f","arguments":"{}","output":"x"},{"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"t"}],"encrypted_content":"e"},{"type":"computer_call_output","call_id":"c","output":{"type":"computer_screenshot","image_url":"https://x"}},{"type":"image_generation_call","id":"i","result":"iVBORw0KGgo="},{"role":"user","content":[{"type":"refusal","refusal":"r"},{"type":"input_future","data":[1]}]}]}`},
		{AnthropicMessages, `{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image","source":{"type":"url","url":"https://x"}}]}],"tools":[{"name":"t","description":"d","input_schema":{"type":"object"}}],"max_tokens":1024}`},
		{AnthropicMessages, `{"model":"claude-3-opus-latest","max_tokens":5,"system":[{"type":"future_block","data":"s"}],"messages":[{"role":"user","content":[{"type":"code_execution_tool_result","tool_use_id":"s","content":{"type":"code_execution_result","stdout":"x","return_code":0}},{"type":"tool_result","tool_use_id":"t","content":[{"type":"mcp_tool_result","content":"y"}]},{"type":"redacted_thinking","data":"z"}]}]}`},
		{ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"future","data":{"a":[1]},"image_url":{"url":"https://x"}}]}],"tools":[{"type":"function","function":{"name":"f","strict":true,"x_doc":"d","parameters":{"type":"object","properties":{"a":{"anyOf":[{"type":"string","description":"s"},{"type":"null"}],"enum":["x",1,null]},"b":{"type":"array","items":{"type":["object","null"],"properties":{"c":{"$ref":"#/$defs/c"}},"required":["c","z",1],"additionalProperties":false}},"\u0064":true},"$defs":{"c":{"const":"k"}},"required":["a","a"],"additionalProperties":{"type":"string"}}}},{"type":"custom","custom":{"name":"g","format":{"type":"grammar"}},"x":1},{"type":"future","future":{}}],"functions":[{"name":"h","parameters":null,"x":[]}]}`},
		{Responses, `{"model":"gpt-4.1","input":"hi","tools":[{"type":"function","name":"f","parameters":{"type":"object","description":"d","properties":{"a":{"type":"string","description":null,"enum":[]}}},"x":"y"},{"type":"custom","name":"g","format":{"type":"text"},"x":"y"},{"type":"web_search","user_location":{"city":"c"}},{"type":"future","doc":"d"}]}`},
		{AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[],"tools":[{"name":"f","strict":true,"input_schema":{"type":"object"},"input_examples":[{"a":"b"}]},{"type":"text_editor_20250728","name":"e","x":{}}],"output_format":{"type":"json_schema","schema":{"type":"object"}},"output_config":{"effort":"low","format":{"type":"json_schema","schema":{}}}}`},
		{ChatCompletions, `{"model":5}`},
		{ChatCompletions, `{"model":"gpt-4o","messages":"x"}`},
		{AnthropicMessages, `[]`},
	}
	for _, s := range seeds {
		f.Add(uint8(s.k), []byte(s.body))
	}
	e, err := NewEstimator(Config{CacheEntries: 256})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k % uint8(Generic))
		est, err := e.Estimate(kind, body)
		if err != nil {
			var bad *BadRequestError
			if !errors.As(err, &bad) {
				t.Fatalf("%s: error %v is not a *BadRequestError", kind, err)
			}
			return
		}
		if est.Usage.InputTokens < 0 || est.Usage.OutputTokens < 0 || est.Cost < 0 {
			t.Fatalf("%s: negative estimate %+v", kind, est)
		}
		// A cached estimate is the same estimate.
		again, err := e.Estimate(kind, body)
		if err != nil || again.Usage != est.Usage {
			t.Fatalf("%s: second estimate %+v, %v; first %+v", kind, again.Usage, err, est.Usage)
		}
	})
}

// FuzzOpaqueTokens checks the count of what costgate does not read
// against the text it hides: a string value of any item or block counts at
// least its text's tokens, however its JSON spells it, for each tokenizer;
// and leaving out a member never panics.
func FuzzOpaqueTokens(f *testing.F) {
	f.Add("plain prose, with \"quotes\" and\nlines", "output", false)
	f.Add("Ünïcödé 你好世界 😀 \u0000 \t\t", "encrypted_content", true)
	f.Add(strings.Repeat("    indented\n", 20), "", false)
	e, err := NewEstimator(Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text, skip string, ascii bool) {
		if !utf8.ValidString(text) {
			return // not JSON text: an upstream refuses it
		}
		raw, err := json.Marshal(map[string]string{"type": "future", "data": text})
		if err != nil {
			t.Fatal(err)
		}
		if ascii {
			raw = asciiJSON(raw)
		}
		for _, name := range []string{"gpt-4o", "gpt-4", "claude-sonnet-4-5"} {
			m := e.resolve(name)
			if got, want := opaqueTokens(m, raw), m.countText(text); got < want {
				t.Fatalf("%s: %d tokens for %s; its text alone %d", name, got, raw, want)
			}
			if opaqueTokens(m, raw, skip) < 0 {
				t.Fatalf("%s: negative count", name)
			}
		}
	})
}

// asciiJSON rewrites raw, JSON, with every non-ASCII character of its
// strings escaped as \uXXXX.
func asciiJSON(raw []byte) []byte {
	var b strings.Builder
	for _, r := range string(raw) {
		switch {
		case r < 0x80:
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, "\\u%04x\\u%04x", r1, r2)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return []byte(b.String())
}

// FuzzParseUsage checks that response parsing never panics and never
// returns negative or inconsistent usage.
func FuzzParseUsage(f *testing.F) {
	f.Add(uint8(ChatCompletions), []byte(`{"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`))
	f.Add(uint8(Responses), []byte(`{"usage":{"input_tokens":10,"output_tokens":5,"input_tokens_details":{"cached_tokens":20}}}`))
	f.Add(uint8(AnthropicMessages), []byte(`{"usage":{"input_tokens":3,"cache_read_input_tokens":100,"cache_creation_input_tokens":50,"output_tokens":-1}}`))
	f.Add(uint8(Embeddings), []byte(`{"usage":null}`))
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k % uint8(Generic))
		u, err := ParseUsage(kind, body)
		if err != nil {
			return
		}
		checkUsage(t, u)
	})
}

func checkUsage(t *testing.T, u Usage) {
	t.Helper()
	if u.InputTokens < 0 || u.OutputTokens < 0 || u.CachedInputTokens < 0 || u.CacheWriteTokens < 0 || u.ReasoningTokens < 0 || u.Units < 0 {
		t.Fatalf("negative usage %+v", u)
	}
	if u.CachedInputTokens+u.CacheWriteTokens > u.InputTokens || u.ReasoningTokens > u.OutputTokens {
		t.Fatalf("parts exceed wholes: %+v", u)
	}
}

// FuzzStreamMeter writes arbitrary bytes in arbitrary chunks: the meter must
// not panic, must give the same result however the bytes are split, and
// must stay within its memory bound.
func FuzzStreamMeter(f *testing.F) {
	f.Add(uint8(ChatCompletions), []byte(chatStream), uint8(7))
	f.Add(uint8(AnthropicMessages), []byte(anthropicStream), uint8(3))
	f.Add(uint8(Responses), []byte(responsesStream), uint8(1))
	f.Add(uint8(Completions), []byte("data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n"), uint8(2))
	e, err := NewEstimator(Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, k uint8, stream []byte, chunk uint8) {
		kind := Kind(k % uint8(Generic))
		whole := e.NewStreamMeter(kind, "gpt-4o")
		whole.Write(stream)
		u1, r1 := whole.Usage()
		split := e.NewStreamMeter(kind, "gpt-4o")
		step := int(chunk%16) + 1
		for i := 0; i < len(stream); i += step {
			split.Write(stream[i:min(i+step, len(stream))])
		}
		u2, r2 := split.Usage()
		if u1 != u2 || r1 != r2 {
			t.Fatalf("whole %+v %v, split by %d %+v %v", u1, r1, step, u2, r2)
		}
		checkUsage(t, u1)
		if len(split.line) > maxSSELine || len(split.pending) > countHardLimit+maxSSELine {
			t.Fatalf("buffers grew: line %d pending %d", len(split.line), len(split.pending))
		}
	})
}

// FuzzRule checks generic rules on arbitrary requests: no panic, errors are
// *BadRequestError, and costs are never negative.
func FuzzRule(f *testing.F) {
	f.Add("q=golang+AND+rust*&num=50&start=900", []byte(`{"query":"a OR b","size":20}`), "X-Results")
	f.Add("", []byte(`{"query":{"bool":{"must":[{"regexp":{"x":"a.*"}}]}}}`), "")
	f.Add("num=-5", []byte(`not json`), "")
	f.Add("NUM=5&Num=6", []byte(`{"size":1,"Size":900}`), "7")
	f.Add("", []byte(`{"size":1,"size":900}`), "")
	f.Add("", []byte(`{"ſize":900,"query":{"bool":{"must":[],"must":[{"regexp":{"a":"b"}}]}}}`), "")
	r := Rule{
		PerCall: 1000, PerUnit: 10,
		Units: &Source{JSON: "size", Query: "num", Header: "X-Results", Default: 10, Max: 100},
		Complexity: &Complexity{
			Query:    Source{JSON: "query", Query: "q"},
			PageSize: Source{JSON: "size", Query: "num", Default: 10},
			Offset:   Source{Query: "start"},
		},
	}
	if err := r.Validate(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, rawQuery string, body []byte, header string) {
		q, _ := url.ParseQuery(rawQuery)
		h := http.Header{}
		h.Set("X-Results", header)
		est, err := r.Estimate(GenericRequest{Method: "POST", Path: "/search", Query: q, Header: h, Body: body})
		if err != nil {
			var bad *BadRequestError
			if !errors.As(err, &bad) {
				t.Fatalf("error %v is not a *BadRequestError", err)
			}
			return
		}
		if est.Cost < r.PerCall || est.Usage.Units < 0 {
			t.Fatalf("estimate %+v below the per-call price", est)
		}
		// Every reading of the JSON field that a decoder may take (any
		// key equal to "size" but for case, the first or the last) is
		// the one costgate read: a body it accepts has at most one, spelled
		// exactly, and its integer value is at most the units.
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return
		}
		var seen int
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return
			}
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return
			}
			key, _ := tok.(string)
			if !strings.EqualFold(key, "size") {
				continue
			}
			if seen++; seen > 1 || key != "size" {
				t.Fatalf("accepted %q: its key %q (reading %d) is one of several spellings of size", body, key, seen)
			}
			if n, err := strconv.ParseInt(string(v), 10, 64); err == nil && n >= 0 && min(n, 100) > est.Usage.Units {
				t.Fatalf("accepted %q at %d units; size is %d", body, est.Usage.Units, n)
			}
		}
	})
}

// FuzzParseUsageFast checks that ParseUsage's one-pass reading gives what
// encoding/json alone gives: the same usage, and the same error.
func FuzzParseUsageFast(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","choices":[{"message":{"content":"usage \"usage\": {}"}}],"usage":{"prompt_tokens":14,"completion_tokens":9}}`,
		`{"usage":{"prompt_tokens":1},"USAGE":{"completion_tokens":2}}`,
		`{"Usage":{"input_tokens":5,"output_tokens":6}}`,
		`{"u\u0073age":{"prompt_tokens":3,"completion_tokens":4}}`, `{"uſage":{"prompt_tokens":3}}`,
		`{"usage":{"prompt_tokens":1},"usage":null}`,
		`{"usage":"x"}`, `{"usage":{"prompt_tokens":"7"}}`, `{"usage":{}} x`, `[{"usage":{}}]`, `null`, ` `, `{"a":1,}`,
		`{"usage":{"input_tokens":3,"cache_read_input_tokens":100,"output_tokens":-1}}`,
		`{"usage":{"prompt_tokens":1e3}}`, `{"usage":{"prompt_tokens":99999999999999999999}}`,
		`{"usage":{"prompt_tokens":9,"completion_tokens":3000,"Completion_Tokens":5}}`, `{"usage":{"prompt_tokens":"9","completion_tokens":2.5}}`,
		`{"usage":{"input_tokens":9,"input_tokens":null,"output_tokens_details":{"reasoning_tokens":4},"output_tokens_details":{"reasoning_tokens":1}}}`,
	} {
		for _, k := range []Kind{ChatCompletions, Responses, AnthropicMessages, Embeddings} {
			f.Add(uint8(k), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k % uint8(Generic+1))
		got, gerr := ParseUsage(kind, body)
		want, werr := parseUsage(kind, body)
		if usageMembers(body) > 1 {
			want, werr = Usage{}, ErrAmbiguousUsage
		}
		if got != want || (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
			t.Fatalf("ParseUsage(%v, %q) = %+v, %v; encoding/json gives %+v, %v", kind, body, got, gerr, want, werr)
		}
	})
}

// FuzzPricedFields checks the request readers against encoding/json, the
// decoder of Go upstreams (case-insensitive, the last repeated key wins):
// for every body an Estimator accepts, encoding/json reads the same priced
// fields (model, output limits, stream, stream_options.include_usage).
func FuzzPricedFields(f *testing.F) {
	for _, s := range []struct {
		k    Kind
		body string
	}{
		{ChatCompletions, `{"model":"gpt-4o-mini","Model":"gpt-5.5-pro","messages":[]}`},
		{ChatCompletions, `{"model":"gpt-4o-mini","messages":[],"stream":true,"stream_options":{"INCLUDE_USAGE":true}}`},
		{ChatCompletions, `{"model":"gpt-4o-mini","messages":[],"max_tokens":5,"max_completion_tokens":7,"n":2,"stream":false}`},
		{ChatCompletions, `{"model":"gpt-4o-mini","messages":[],"mod\u0065l":"o1-pro"}`},
		{Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":"a","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`},
		{Responses, `{"model":"gpt-4.1","input":"x","max_output_tokens":9,"Max_Output_Tokens":1}`},
		{AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[],"stream":true,"Stream":false}`},
	} {
		f.Add(uint8(s.k), []byte(s.body))
	}
	e, err := NewEstimator(Config{CacheEntries: -1})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k % uint8(Generic))
		est, err := e.Estimate(kind, body)
		if err != nil {
			return
		}
		type streamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		}
		// The priced fields of each kind, as a Go upstream decodes them.
		var r struct {
			Model               string
			MaxTokens           int64
			MaxCompletionTokens int64
			MaxOutputTokens     int64
			Stream              bool
			StreamOptions       *streamOptions
		}
		switch kind {
		case ChatCompletions:
			var c struct {
				Model               string         `json:"model"`
				MaxTokens           int64          `json:"max_tokens"`
				MaxCompletionTokens int64          `json:"max_completion_tokens"`
				Stream              bool           `json:"stream"`
				StreamOptions       *streamOptions `json:"stream_options"`
			}
			err = json.Unmarshal(body, &c)
			r.Model, r.MaxTokens, r.MaxCompletionTokens, r.Stream, r.StreamOptions = c.Model, c.MaxTokens, c.MaxCompletionTokens, c.Stream, c.StreamOptions
		case Completions:
			var c struct {
				Model         string         `json:"model"`
				MaxTokens     int64          `json:"max_tokens"`
				Stream        bool           `json:"stream"`
				StreamOptions *streamOptions `json:"stream_options"`
			}
			err = json.Unmarshal(body, &c)
			r.Model, r.MaxTokens, r.Stream, r.StreamOptions = c.Model, c.MaxTokens, c.Stream, c.StreamOptions
		case Embeddings:
			var c struct {
				Model string `json:"model"`
			}
			err = json.Unmarshal(body, &c)
			r.Model = c.Model
		case Responses:
			var c struct {
				Model           string `json:"model"`
				MaxOutputTokens int64  `json:"max_output_tokens"`
				Stream          bool   `json:"stream"`
			}
			err = json.Unmarshal(body, &c)
			r.Model, r.MaxOutputTokens, r.Stream = c.Model, c.MaxOutputTokens, c.Stream
		case AnthropicMessages:
			var c struct {
				Model     string `json:"model"`
				MaxTokens int64  `json:"max_tokens"`
				Stream    bool   `json:"stream"`
			}
			err = json.Unmarshal(body, &c)
			r.Model, r.MaxTokens, r.Stream = c.Model, c.MaxTokens, c.Stream
		}
		if err != nil {
			t.Fatalf("%s: accepted a body encoding/json rejects (%v): %q", kind, err, body)
		}
		limit := int64(0)
		switch kind {
		case ChatCompletions:
			if r.MaxCompletionTokens > 0 {
				limit = r.MaxCompletionTokens
			} else if r.MaxTokens > 0 {
				limit = r.MaxTokens
			}
		case Completions:
			if r.MaxTokens > 0 {
				limit = r.MaxTokens
			}
		case Responses:
			limit = max(r.MaxOutputTokens, 0)
		case AnthropicMessages:
			limit = max(r.MaxTokens, 0)
		}
		usage := r.StreamOptions != nil && r.StreamOptions.IncludeUsage
		if kind == Responses || kind == AnthropicMessages {
			usage = r.Stream
		}
		if kind == Embeddings {
			r.Stream, usage = false, false
		}
		if est.Model != r.Model || est.MaxOutputTokens != limit || est.Stream != r.Stream || est.StreamUsage != usage {
			t.Fatalf("%s: costgate read model %q limit %d stream %v usage %v; encoding/json %q %d %v %v, for %q",
				kind, est.Model, est.MaxOutputTokens, est.Stream, est.StreamUsage, r.Model, limit, r.Stream, usage, body)
		}
	})
}

// FuzzCost prices arbitrary usage with every built-in model and the
// default price: the cost is never negative, and never below the cost of
// the same usage without one of its parts.
func FuzzCost(f *testing.F) {
	f.Add(int64(1000), int64(10), int64(5), int64(2), int64(7), int64(300), int64(40), int64(3), "flex")
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(-1), int64(0), int64(math.MaxInt64), int64(math.MinInt64), int64(1), int64(math.MaxInt64), "priority")
	f.Add(int64(272_001), int64(0), int64(0), int64(0), int64(0), int64(1), int64(0), int64(0), "")
	e, err := NewEstimator(Config{})
	if err != nil {
		f.Fatal(err)
	}
	models := []string{"mystery"}
	for m := range BuiltinPrices() {
		models = append(models, m)
	}
	f.Fuzz(func(t *testing.T, in, cached, write, write1h, audioIn, out, audioOut, searches int64, tier string) {
		u := Usage{InputTokens: in, CachedInputTokens: cached, CacheWriteTokens: write, CacheWrite1hTokens: write1h,
			AudioInputTokens: audioIn, OutputTokens: out, AudioOutputTokens: audioOut, WebSearchRequests: searches, ServiceTier: tier}
		for _, m := range models {
			c := e.Cost(m, u)
			if c < 0 {
				t.Fatalf("%s: cost %v for %+v", m, c, u)
			}
			less := u
			less.WebSearchRequests = 0
			if e.Cost(m, less) > c {
				t.Fatalf("%s: dropping searches raised the cost, %+v", m, u)
			}
		}
	})
}

// usageShapes are answers' usage objects in the shapes the plain reader
// takes and in the ones it leaves to encoding/json.
var usageShapes = []string{
	`{"id":"c","model":"gpt-4o-mini","usage":{"prompt_tokens":14,"completion_tokens":9,"total_tokens":23}}`,
	`{"model":"gpt-4o","service_tier":"flex","usage":{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":12,"audio_tokens":0,"accepted_prediction_tokens":0}}}`,
	`{"model":"o4-mini","usage":{"input_tokens":10,"output_tokens":5,"input_tokens_details":{"cached_tokens":2},"output_tokens_details":{"reasoning_tokens":3}},"output":[{"type":"web_search_call"}]}`,
	`{"usage":{"prompt_tokens":1,"prompt_tokens":2}}`,
	`{"usage":{"prompt_tokens":1,"Prompt_Tokens":2}}`,
	`{"usage":{"prompt_tokenſ":7,"completion_tokens":1}}`,
	`{"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1},"prompt_tokens_details":{"audio_tokens":2}}}`,
	`{"usage":{"prompt_tokens":null,"completion_tokens":2}}`,
	`{"usage":{"prompt_tokens":1,"prompt_tokens_details":null}}`,
	`{"usage":{"prompt_tokens":1.5}}`, `{"usage":{"prompt_tokens":-3}}`, `{"usage":{"prompt_tokens":-0}}`,
	`{"usage":{"prompt_tokens":999999999999999999}}`, `{"usage":{"prompt_tokens":9999999999999999999}}`,
	`{"usage":{"prompt_tokens":1,"extra":{"deep":[1,{"x":null}]}}}`,
	`{"usage":{"pr\u006fmpt_tokens":5}}`, `{"usage":{"prompt_tokens":5},"USAGE":{"completion_tokens":6}}`,
	`{"usage":{"prompt_tokens":5},"model":"caf\u00e9"}`, "{\"usage\":{\"prompt_tokens\":5},\"model\":\"caf\xc3\xa9 \xff\"}",
	`{"usage":{"prompt_tokens":5},"model":null,"service_tier":7}`, `{"usage":[],"model":"m"}`, `{"usage":{"prompt_tokens_details":5}}`,
}

// FuzzParseResponseFast: ParseResponse reads the same usage and model as
// encoding/json alone, and fails alike.
func FuzzParseResponseFast(f *testing.F) {
	for _, s := range usageShapes {
		for _, k := range []Kind{ChatCompletions, Responses, Embeddings, Completions} {
			f.Add(uint8(k), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k % uint8(Generic+1))
		got, gm, gerr := ParseResponse(kind, body)
		want, wm, werr := parseResponse(kind, body)
		wm = servedModel(wm)
		if usageMembers(body) > 1 {
			want, wm, werr = Usage{}, "", ErrAmbiguousUsage
		}
		if got != want || gm != wm || (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
			t.Fatalf("ParseResponse(%v, %q) = %+v, %q, %v; encoding/json gives %+v, %q, %v", kind, body, got, gm, gerr, want, wm, werr)
		}
	})
}
