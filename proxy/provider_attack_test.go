package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// provAtkAnthropic is a stub Anthropic upstream that answers every
// request with usage, streamed as the Messages API streams it when the
// request says "stream" (plainUsage otherwise): message_start carries the input side of the
// usage with its cache_creation split by lifetime; message_delta carries
// the cumulative usage with the fields of the SDK's MessageDeltaUsage
// (input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
// output_tokens, server_tool_use), which has no cache_creation object.
func provAtkAnthropic(model, plainUsage, usage, deltaUsage string) *stubUpstream {
	return &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		if !provAtkStreamed(body) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":%s}`, model, plainUsage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%q,\"content\":[],\"usage\":%s}}\n\n", model, usage)
		fmt.Fprint(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
		fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n")
		fmt.Fprint(w, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
		fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":%s}\n\n", deltaUsage)
		fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}}
}

func provAtkStreamed(body []byte) bool {
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	return req.Stream
}

// provAtkSDKMessage sends one request through the official Anthropic SDK,
// streamed or not, and returns the one settled ledger entry.
func provAtkSDKMessage(t *testing.T, s *stack, model string, stream bool) ledger.Entry {
	t.Helper()
	c := anthropic.NewClient(anthropicopt.WithBaseURL(s.url+"/"), anthropicopt.WithAPIKey("cg-test-acme"), anthropicopt.WithMaxRetries(0))
	params := anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: 1024,
		System: []anthropic.TextBlockParam{{Text: "A long policy manual.",
			CacheControl: anthropic.CacheControlEphemeralParam{TTL: anthropic.CacheControlEphemeralTTLTTL1h}}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hi"))},
	}
	ctx := context.Background()
	if stream {
		st := c.Messages.NewStreaming(ctx, params)
		var m anthropic.Message
		for st.Next() {
			if err := m.Accumulate(st.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		st.Close()
	} else if _, err := c.Messages.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	return s.settled(t, 1)[0]
}

// TestProviderAttackAnthropicStreamKeeps1hCacheWrites: a prompt written to
// the 1-hour cache costs 2x the base input rate, the 5-minute cache 1.25x
// (Anthropic, "Prompt caching", pricing table; the usage's cache_creation
// says how many tokens went to each). A streamed answer reports that split
// only in message_start; message_delta then repeats the cumulative
// cache_creation_input_tokens without the split (MessageDeltaUsage has no
// cache_creation). The same exchange must cost the same streamed or not.
func TestProviderAttackAnthropicStreamKeeps1hCacheWrites(t *testing.T) {
	const (
		model = "claude-sonnet-4-5-20250929"
		split = `"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":100000}`
		usage = `{"input_tokens":10,"cache_creation_input_tokens":100000,"cache_read_input_tokens":0,` + split + `,"output_tokens":1,"service_tier":"standard"}`
		plain = `{"input_tokens":10,"cache_creation_input_tokens":100000,"cache_read_input_tokens":0,` + split + `,"output_tokens":20,"service_tier":"standard"}`
		delta = `{"input_tokens":10,"cache_creation_input_tokens":100000,"cache_read_input_tokens":0,"output_tokens":20,"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0}}`
	)
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := est.Cost(model, costmodel.Usage{InputTokens: 100010, CacheWriteTokens: 100000, CacheWrite1hTokens: 100000, OutputTokens: 20})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll, upstream: provAtkAnthropic(model, plain, usage, delta)})
			e := provAtkSDKMessage(t, s, model, stream)
			if e.ActualCost != want {
				t.Errorf("billed %v; Anthropic bills the 100000 cache-written tokens at the 1-hour rate: %v", e.ActualCost, want)
			}
		})
	}
}

// TestProviderAttackAnthropicUSInferenceGeo: "inference_geo": "us" keeps
// inference in the US, on Claude Opus 4.6, Sonnet 4.6 and later models,
// at a 1.1x multiplier on every token price (Anthropic, "Pricing", data
// residency; Claude Platform on AWS, "Data residency": "US: ... A 1.1x
// pricing multiplier applies"); the usage says where it ran
// (usage.inference_geo). A tenant that asks for US inference is billed the
// US price.
func TestProviderAttackAnthropicUSInferenceGeo(t *testing.T) {
	const (
		model = "claude-opus-4-6"
		usage = `{"input_tokens":100000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":10000,"inference_geo":"us","service_tier":"standard"}`
	)
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	global := est.Cost(model, costmodel.Usage{InputTokens: 100000, OutputTokens: 10000})
	want := global * 11 / 10
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll, upstream: provAtkAnthropic(model, usage, usage, usage)})
	c := anthropic.NewClient(anthropicopt.WithBaseURL(s.url+"/"), anthropicopt.WithAPIKey("cg-test-acme"), anthropicopt.WithMaxRetries(0))
	msg, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{
		Model:        model,
		MaxTokens:    16000,
		InferenceGeo: anthropic.String("us"),
		Messages:     []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hi"))},
	})
	if err != nil {
		t.Fatal(err)
	}
	if msg.Usage.InferenceGeo != "us" {
		t.Fatalf("the SDK reads inference_geo %q", msg.Usage.InferenceGeo)
	}
	if e := s.settled(t, 1)[0]; e.ActualCost < want {
		t.Errorf("billed %v, the global price; Anthropic bills US inference 1.1x: %v", e.ActualCost, want)
	}
}

// TestProviderAttackResponsesFileSearchCalls: the Responses API's
// file_search tool is billed per call, $2.50 per 1,000 calls, besides the
// tokens (OpenAI, "Pricing", built-in tools: "File search tool call");
// each call is a file_search_call item of the output, as each web search
// is a web_search_call, and both are billed.
func TestProviderAttackResponsesFileSearchCalls(t *testing.T) {
	const (
		model = "gpt-4.1-mini"
		calls = 40
	)
	var items strings.Builder
	for i := range calls {
		fmt.Fprintf(&items, `{"type":"file_search_call","id":"fs_%d","status":"completed","queries":["q"],"results":null},`, i)
	}
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_1","object":"response","status":"completed","model":%q,"service_tier":"default","output":[%s`+
			`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],`+
			`"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":12}}`, model, items.String())
	}}
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const perCall = costmodel.NanoUSD(2_500_000) // $2.50 per 1,000 calls
	want := est.Cost(model, costmodel.Usage{InputTokens: 10, OutputTokens: 2}) + calls*perCall
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll, upstream: up})
	resp, err := s.client("cg-test-acme").Responses.New(context.Background(), responses.ResponseNewParams{
		Model: model,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What do my files say?")},
		Tools: []responses.ToolUnionParam{{OfFileSearch: &responses.FileSearchToolParam{VectorStoreIDs: []string{"vs_1"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.Output); n != calls+1 {
		t.Fatalf("the SDK reads %d output items", n)
	}
	if e := s.settled(t, 1)[0]; e.ActualCost < want {
		t.Errorf("billed %v for %d file search calls; OpenAI bills %v", e.ActualCost, calls, want)
	}
}

// TestProviderAttackResponsesIdleUpstream: a Responses stream whose
// upstream goes quiet after some text, while the client stays connected
// and reading, ends within the upstream's timeout and is settled: the
// prompt (OpenAI bills the input it read) and the text streamed, and, for
// a reasoning model (its hidden reasoning tokens are billed as output and
// never streamed), never less than the reservation. (The test stack sets
// a timeout on its openai upstream only, hence this route.)
func TestProviderAttackResponsesIdleUpstream(t *testing.T) {
	for _, model := range []string{"gpt-4.1-mini", "gpt-5-mini"} {
		t.Run(model, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"model\":%q,\"output\":[]}}\n\n", model)
				for i := range 50 {
					fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":%d,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\" word\"}\n\n", i+1)
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
				case <-release:
				}
			}}
			const timeout = 2 * time.Second
			s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll, upstream: up, upstreamTimeout: timeout})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			st := s.client("cg-test-acme").Responses.NewStreaming(ctx, responses.ResponseNewParams{
				Model:           model,
				Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(strings.Repeat("Summarize this paragraph. ", 400))},
				MaxOutputTokens: openai.Int(8000),
			})
			words := 0
			for st.Next() {
				if st.Current().Type == "response.output_text.delta" {
					words++
				}
			}
			st.Close()
			if took := time.Since(start); took > timeout+5*time.Second || ctx.Err() != nil {
				t.Fatalf("the stream took %v to end against an upstream timeout of %v", took, timeout)
			}
			e := s.settled(t, 1)[0]
			if e.Actual.InputTokens < e.Estimated.InputTokens || e.Actual.OutputTokens < int64(words) || words != 50 {
				t.Errorf("billed %d input and %d output tokens; the prompt is %d tokens and the client got %d words", e.Actual.InputTokens, e.Actual.OutputTokens, e.Estimated.InputTokens, words)
			}
			if model == "gpt-5-mini" && e.ActualCost < e.EstimatedCost {
				t.Errorf("a cut reasoning stream billed %v, less than its reservation %v", e.ActualCost, e.EstimatedCost)
			}
		})
	}
}

// provAtkFramed writes an SSE stream one byte per TCP write (flushed), its
// lines ended by eol, with comments, "data:" without its space, and each
// event's JSON cut over two data lines.
type provAtkFramed struct {
	events []string // JSON payloads
	eol    string
}

func (u *provAtkFramed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	var b strings.Builder
	b.WriteString(": ping" + u.eol + u.eol)
	for i, ev := range u.events {
		cut := strings.Index(ev, ",")
		fmt.Fprintf(&b, "event: e%d%s: comment%sdata:%s%sdata: %s%s%s", i, u.eol, u.eol, ev[:cut+1], u.eol, ev[cut+1:], u.eol, u.eol)
	}
	f := w.(http.Flusher)
	for _, c := range []byte(b.String()) {
		w.Write([]byte{c})
		f.Flush()
	}
}

// TestProviderAttackFramingByteByByte: an Anthropic and a Responses stream
// whose usage reports arrive a byte per TCP write, framed as the SSE
// format allows (CRLF, CR or LF line ends, comments, "data:" without a
// space, an event's data over several lines), are billed their reports,
// with the stream guard off and on (which splits events itself).
func TestProviderAttackFramingByteByByte(t *testing.T) {
	anthropicEvents := []string{
		`{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[],"usage":{"input_tokens":700,"cache_read_input_tokens":300,"cache_creation_input_tokens":0,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":700,"cache_read_input_tokens":300,"cache_creation_input_tokens":0,"output_tokens":900,"server_tool_use":{"web_search_requests":3}}}`,
		`{"type":"message_stop"}`,
	}
	responsesEvents := []string{
		`{"type":"response.created","sequence_number":0,"response":{"id":"r","object":"response","status":"in_progress","model":"gpt-4.1-mini","output":[]}}`,
		`{"type":"response.output_text.delta","sequence_number":1,"item_id":"m","output_index":0,"content_index":0,"delta":"Hi"}`,
		`{"type":"response.completed","sequence_number":2,"response":{"id":"r","object":"response","status":"completed","model":"gpt-4.1-mini","service_tier":"priority","output":[],` +
			`"usage":{"input_tokens":1000,"input_tokens_details":{"cached_tokens":300},"output_tokens":900,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1900}}}`,
	}
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path, body string
		events           []string
		model            string
		want             costmodel.Usage
	}{
		{"messages", "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":2000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			anthropicEvents, "claude-haiku-4-5", costmodel.Usage{InputTokens: 1000, CachedInputTokens: 300, OutputTokens: 900, WebSearchRequests: 3}},
		{"responses", "/v1/responses", `{"model":"gpt-4.1-mini","max_output_tokens":2000,"stream":true,"input":"hi"}`,
			responsesEvents, "gpt-4.1-mini", costmodel.Usage{InputTokens: 1000, CachedInputTokens: 300, OutputTokens: 900, ServiceTier: "priority"}},
	} {
		want := est.Cost(c.model, c.want)
		for _, eol := range []string{"\n", "\r\n", "\r"} {
			for _, guard := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/eol=%q/guard=%v", c.name, eol, guard), func(t *testing.T) {
					extra := roomyLimits
					if guard {
						extra = guardConfig("100", 16)
					}
					s := newStackWith(t, stackOptions{extra: extra, policies: allowAll, upstream: &provAtkFramed{events: c.events, eol: eol}})
					e, _ := oneEntry(t, s, c.path, c.body, nil)
					if e.ActualCost != want || e.Actual.OutputTokens != 900 {
						t.Errorf("billed %+v, %v; the upstream reported %+v, %v", e.Actual, e.ActualCost, c.want, want)
					}
				})
			}
		}
	}
}

// TestProviderAttackAnthropicThinkingCut: with extended thinking, Anthropic
// bills the full thinking tokens as output while a Claude 4 stream shows
// only their summary (Anthropic, "Extended thinking": "you're charged for
// the full thinking tokens generated, not the summary tokens"). A stream
// cut after its summary, before message_delta says what was produced, is
// billed no less than its reservation, since costgate cannot count it.
func TestProviderAttackAnthropicThinkingCut(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-haiku-4-5\",\"content\":[],\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n")
		fmt.Fprint(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n")
		fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Short summary.\"}}\n\n")
		// The connection ends here: no message_delta, no message_stop.
	}}
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll, upstream: up})
	e, _ := oneEntry(t, s, "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":16000,"thinking":{"type":"enabled","budget_tokens":12000},"stream":true,"messages":[{"role":"user","content":"Prove it."}]}`, nil)
	if e.Actual.OutputTokens < e.Estimated.OutputTokens || e.ActualCost < e.EstimatedCost {
		t.Errorf("billed %d output tokens (%v) for a cut thinking stream; reserved %d (%v)", e.Actual.OutputTokens, e.ActualCost, e.Estimated.OutputTokens, e.EstimatedCost)
	}
}
