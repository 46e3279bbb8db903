package proxy_test

// Attacks on how costgate reads the actual cost of a call at settlement,
// by a tenant who wants to be billed less than the upstream charges: it
// controls the request and may cut its connection at any moment, and the
// upstream bills what it generated. Each test compares what the ledger
// records with what the upstream reported (or would bill).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// billAtkFetch sends acme's GET /u/scrape/fetch?credits=3 (billAtkGeneric's
// route) to s and returns its answer, read whole and closed, and its
// body.
func billAtkFetch(t *testing.T, s *stack) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.url+"/u/scrape/fetch?credits=3", nil)
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// billAtkEntry returns acme's one settled ledger entry whose request id is
// id.
func billAtkEntry(t *testing.T, s *stack, id string) ledger.Entry {
	t.Helper()
	for _, e := range s.settled(t, 1) {
		if e.RequestID == id {
			return e
		}
	}
	t.Fatalf("no ledger entry for request %s", id)
	return ledger.Entry{}
}

// TestBillAtkUpstreamTimeoutBillsNothing: a tenant sends a request the
// upstream takes longer than upstreams[].timeout to answer (a long
// reasoning run with a large output limit). costgate answers 504 and
// charges nothing, but the request reached the upstream, which ran it to
// its end and bills it: the tenant gets the generation free, as often as
// its request limit allows.
func TestBillAtkUpstreamTimeoutBillsNothing(t *testing.T) {
	var billed atomic.Int64 // output tokens the upstream generated and bills
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		time.Sleep(time.Second) // generating; a gone client does not stop it
		billed.Store(4000)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"..."},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":4000}}`)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up, upstreamTimeout: 300 * time.Millisecond})
	var resp *http.Response
	_, err := s.client("cg-test-acme").Chat.Completions.New(context.Background(), chatParams("write a long essay", 4000), option.WithResponseInto(&resp))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("want costgate's 504, got %v", err)
	}
	e := billAtkEntry(t, s, resp.Header.Get("X-Request-Id"))
	for billed.Load() == 0 {
		time.Sleep(10 * time.Millisecond) // the upstream finishes the run
	}
	want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 10, OutputTokens: billed.Load()})
	if e.ActualCost < want {
		t.Errorf("ledger: %s (%v, %+v); the upstream generated %d output tokens and bills %s",
			e.Status, e.ActualCost, e.Actual, billed.Load(), want)
	}
}

// billAtkGeneric is a generic upstream "scrape" priced per credit: the
// request asks for no credits (1 by default), the answer reports the
// credits it cost in credits_used (at most 100).
func billAtkGeneric(base string) string {
	return `
  - name: scrape
    kind: generic
    base_url: ` + base + `
    api_key: scrape-secret
    auth_header: X-Scrape-Key
    cost:
      unit: credits
      per_unit: "0.001"
      units: {query: credits, default: 1, max: 100}
      actual: {json: credits_used, max: 100}
` + roomyLimits
}

// TestBillAtkGenericActualUnread: a generic upstream reports the credits a
// call cost in its JSON answer (a JavaScript-rendered page costs 40). A
// tenant that makes the answer one costgate does not read whole (a page
// over 8 MiB), or asks for it as a stream, is charged the estimate, 1
// credit, though the upstream bills 40. An LLM answer that cannot be read
// is charged its output limit; a generic one should be charged its
// actual's max. So is an answer whose report costgate cannot read (the
// field in two spellings, or not a count).
func TestBillAtkGenericActualUnread(t *testing.T) {
	const credits = 40
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		page := "<html>small</html>"
		switch r.URL.Query().Get("page") {
		case "big":
			page = strings.Repeat("x", 9<<20)
		case "two-spellings", "not-a-count":
			// A report costgate cannot read: the field in two spellings
			// (a decoder keeps the other one), or not a count.
			bad := `"credits_used":1,"Credits_Used":40`
			if r.URL.Query().Get("page") == "not-a-count" {
				bad = `"credits_used":"forty"`
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"content":%q,%s}`, page, bad)
			return
		}
		if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"chunk\":%q}\n\ndata: {\"credits_used\":%d}\n\n", page, credits)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"content":%q,"credits_used":%d}`, page, credits)
	})
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	for _, c := range []struct{ name, query, accept string }{
		{"small-json", "page=small", ""}, // held: read whole
		{"large-json", "page=big", ""},
		{"event-stream", "page=small", "text/event-stream"},
		{"two-spellings", "page=two-spellings", ""},
		{"not-a-count", "page=not-a-count", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, stackOptions{policies: allowAll, extra: billAtkGeneric(srv.URL)})
			req, _ := http.NewRequest(http.MethodGet, s.url+"/u/scrape/fetch?"+c.query, nil)
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			if c.accept != "" {
				req.Header.Set("Accept", c.accept)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			e := billAtkEntry(t, s, resp.Header.Get("X-Request-Id"))
			if e.Actual.Units < credits {
				t.Errorf("charged %d credits (%v); the upstream reported and bills %d", e.Actual.Units, e.ActualCost, credits)
			}
		})
	}
}

// TestBillAtkGenericTimeoutBillsNothing: a generic upstream takes longer
// than its timeout to answer (a page that renders slowly). costgate
// answers 504, but the upstream has the request, runs it and bills it: a
// tenant that asks for slow pages must not have them free. As an LLM call
// with no answer in time is charged its output limit, a generic one is
// charged the most its rule lets the upstream report (the actual's max),
// or, without an actual, its estimate.
func TestBillAtkGenericTimeoutBillsNothing(t *testing.T) {
	const credits = 40
	var billed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Second) // rendering; a gone client does not stop it
		billed.Store(credits)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"content":"<html/>","credits_used":%d}`, credits)
	}))
	t.Cleanup(srv.Close)
	withActual := strings.Replace(billAtkGeneric(srv.URL), "    cost:\n", "    timeout: 300ms\n    cost:\n", 1)
	estimateOnly := strings.Replace(withActual, "      actual: {json: credits_used, max: 100}\n", "", 1)
	for _, c := range []struct {
		name, cfg string
		want      int64 // credits charged at least
	}{
		{"actual", withActual, credits},
		{"estimate", estimateOnly, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, stackOptions{policies: allowAll, extra: c.cfg})
			resp, _ := billAtkFetch(t, s)
			if resp.StatusCode != http.StatusGatewayTimeout {
				t.Fatalf("status %d, want 504", resp.StatusCode)
			}
			e := billAtkEntry(t, s, resp.Header.Get("X-Request-Id"))
			if e.Actual.Units < c.want || e.ActualCost < costmodel.NanoUSD(c.want)*1_000_000 {
				t.Errorf("charged %d credits (%v) for a call the upstream ran and bills; want at least %d", e.Actual.Units, e.ActualCost, c.want)
			}
		})
	}
}

// billAtkAnthropicAnswer is an Anthropic message whose prompt was mostly
// read from and written to the prompt cache: input_tokens counts only
// the rest.
const billAtkAnthropicAnswer = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"cache_creation_input_tokens":50000,"cache_read_input_tokens":100000,"output_tokens":20}}`

// billAtkResponsesAnswer is a Responses answer that ran three web searches.
const billAtkResponsesAnswer = `{"id":"resp_1","object":"response","status":"completed","model":"gpt-4o","output":[{"type":"web_search_call","id":"ws_1","status":"completed"},{"type":"web_search_call","id":"ws_2","status":"completed"},{"type":"web_search_call","id":"ws_3","status":"completed"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}],"usage":{"input_tokens":100,"output_tokens":20}}`

// TestBillAtkSettleResponseOfAnotherKind: the reserve API settles from the
// upstream's raw answer, "its usage read as the proxy reads it". A
// reservation made for one API (kind and body) is settled with its
// upstream's answer, unaltered, under another kind: an Anthropic answer
// read as a chat completion loses its cache reads and writes (150,000 of
// its 150,010 input tokens), a Responses answer read as a chat completion
// its web searches. The kind must match the answer (or the reservation).
func TestBillAtkSettleResponseOfAnotherKind(t *testing.T) {
	est := estimator(t)
	for _, c := range []struct {
		name, reserveKind, reserveBody, answerKind, answer string
		kind                                               costmodel.Kind
		model                                              string
	}{
		{"anthropic-as-chat", "anthropic_messages", `{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`,
			"chat_completions", billAtkAnthropicAnswer, costmodel.AnthropicMessages, "claude-sonnet-4-5"},
		{"responses-as-chat", "responses", `{"model":"gpt-4o","max_output_tokens":100,"input":"news today","tools":[{"type":"web_search"}]}`,
			"chat_completions", billAtkResponsesAnswer, costmodel.Responses, "gpt-4o"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits})
			h := s.srv.Handler()
			id := reserveOn(t, s, "cg-test-acme", `{"kind":"`+c.reserveKind+`","body":`+c.reserveBody+`}`)
			code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle",
				`{"reservation_id":"`+id+`","kind":"`+c.answerKind+`","response":`+c.answer+`}`)
			if code == http.StatusBadRequest {
				return // refused: the kind does not match
			}
			if code != http.StatusOK {
				t.Fatalf("settle: %d %v", code, out)
			}
			u, err := costmodel.ParseUsage(c.kind, []byte(c.answer))
			if err != nil {
				t.Fatal(err)
			}
			want := est.Cost(c.model, u)
			got, _ := out["cost_nanousd"].(float64)
			if costmodel.NanoUSD(got) < want {
				t.Errorf("settled at %v; the answer, read as the %s answer it is, costs %v (%+v)", costmodel.NanoUSD(got), c.kind, want, u)
			}
		})
	}
}

// billAtkCutAfter sends body to path with acme's key, reads the answer up
// to the first line holding mark, and hangs up. It returns the request id.
func billAtkCutAfter(t *testing.T, s *stack, path, body, mark string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := s.post(t, ctx, path, body)
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if strings.Contains(line, mark) || err != nil {
			break
		}
	}
	cancel()
	resp.Body.Close()
	return resp.Header.Get("X-Request-Id")
}

// billAtkPaced writes events one by one, pausing after the first so that
// the client can hang up while the upstream is still generating.
func billAtkPaced(events ...string) http.Handler {
	return &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i, ev := range events {
			fmt.Fprint(w, ev)
			f.Flush()
			if i == 0 {
				time.Sleep(300 * time.Millisecond)
			}
		}
	}}
}

// TestBillAtkStreamCutHolds: a client that hangs up after the stream's
// first event, before its usage report, is billed the report the upstream
// went on to send: Anthropic's split usage (input and cache tokens in
// message_start, output in the last message_delta), a Responses stream
// that ends incomplete or failed with its usage, an OpenAI stream whose
// client turned include_usage off.
func TestBillAtkStreamCutHolds(t *testing.T) {
	anth := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	chat := func(data string) string { return "data: " + data + "\n\n" }
	cases := []struct {
		name, path, body, mark string
		events                 []string
		want                   costmodel.Usage
	}{
		{"anthropic-split-usage", "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":8000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "message_start",
			[]string{
				anth("message_start", `{"type":"message_start","message":{"id":"m","model":"claude-haiku-4-5","usage":{"input_tokens":12,"cache_creation_input_tokens":3000,"cache_read_input_tokens":5000,"output_tokens":1}}}`),
				anth("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`),
				anth("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":6000}}`),
				anth("message_stop", `{"type":"message_stop"}`),
			}, costmodel.Usage{InputTokens: 8012, CachedInputTokens: 5000, CacheWriteTokens: 3000, OutputTokens: 6000}},
		{"responses-incomplete", "/v1/responses", `{"model":"gpt-4o-mini","max_output_tokens":6000,"stream":true,"input":"hi"}`, "response.created",
			[]string{
				chat(`{"type":"response.created","response":{"id":"r","model":"gpt-4o-mini","status":"in_progress","usage":null}}`),
				chat(`{"type":"response.output_text.delta","delta":"Hi"}`),
				chat(`{"type":"response.incomplete","response":{"id":"r","model":"gpt-4o-mini","status":"incomplete","usage":{"input_tokens":9,"output_tokens":6000}}}`),
			}, costmodel.Usage{InputTokens: 9, OutputTokens: 6000}},
		{"responses-failed", "/v1/responses", `{"model":"gpt-4o-mini","max_output_tokens":6000,"stream":true,"input":"hi"}`, "response.created",
			[]string{
				chat(`{"type":"response.created","response":{"id":"r","model":"gpt-4o-mini","status":"in_progress","usage":null}}`),
				chat(`{"type":"response.output_text.delta","delta":"Hi"}`),
				chat(`{"type":"response.failed","response":{"id":"r","model":"gpt-4o-mini","status":"failed","usage":{"input_tokens":9,"output_tokens":5000}}}`),
			}, costmodel.Usage{InputTokens: 9, OutputTokens: 5000}},
		{"chat-include_usage-off", "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":6000,"stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`, "data:",
			[]string{
				chat(`{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hi"}}]}`),
				chat(`{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`),
				chat(`{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":6000}}`),
				"data: [DONE]\n\n",
			}, costmodel.Usage{InputTokens: 9, OutputTokens: 6000}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: billAtkPaced(c.events...)})
			e := billAtkEntry(t, s, billAtkCutAfter(t, s, c.path, c.body, c.mark))
			a := e.Actual
			if a.InputTokens < c.want.InputTokens || a.OutputTokens < c.want.OutputTokens || a.CacheWriteTokens < c.want.CacheWriteTokens {
				t.Errorf("charged %+v; the upstream reported %+v", a, c.want)
			}
		})
	}
}

// TestBillAtkErrorWithUsageHolds: an upstream error that carries usage
// (the upstream billed the work before it failed) is charged that usage.
func TestBillAtkErrorWithUsageHolds(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"type":"server_error","message":"failed after generating"},"usage":{"prompt_tokens":10,"completion_tokens":3000}}`)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	var resp *http.Response
	_, err := s.client("cg-test-acme").Chat.Completions.New(context.Background(), chatParams("hi", 4000), option.WithResponseInto(&resp))
	if err == nil {
		t.Fatal("want the upstream's 500")
	}
	e := billAtkEntry(t, s, resp.Header.Get("X-Request-Id"))
	if want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 10, OutputTokens: 3000}); e.ActualCost < want {
		t.Errorf("charged %v (%+v); the error reported usage costing %v", e.ActualCost, e.Actual, want)
	}
}

// TestBillAtkStreamFlagSpellingsHold: "stream" as a string or a number
// (which a lax OpenAI-compatible server reads as true, and streams without
// the usage report costgate would have asked for) is refused, and so is
// stream_options.include_usage given twice or in another case.
func TestBillAtkStreamFlagSpellingsHold(t *testing.T) {
	var reached atomic.Int64
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		reached.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	const msgs = `"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]`
	for _, body := range []string{
		`{` + msgs + `,"stream":"true"}`,
		`{` + msgs + `,"stream":1}`,
		`{` + msgs + `,"stream":true,"Stream":false}`,
		`{` + msgs + `,"stream":true,"stream_options":{"include_usage":false,"INCLUDE_USAGE":true}}`,
		`{` + msgs + `,"stream":true,"stream_options":{"include_usage":"true"}}`,
	} {
		resp := s.post(t, context.Background(), "/v1/chat/completions", body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d; want 400", body, resp.StatusCode)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d of them reached the upstream", n)
	}
}

// TestBillAtkAnthropicSDKStreamHolds: through the official Anthropic SDK,
// a stream whose cache tokens come in message_start and output in several
// cumulative message_delta events is billed the last report.
func TestBillAtkAnthropicSDKStreamHolds(t *testing.T) {
	anth := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	up := billAtkPaced(
		anth("message_start", `{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"claude-haiku-4-5","usage":{"input_tokens":12,"cache_read_input_tokens":7000,"output_tokens":1}}}`),
		anth("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		anth("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`),
		anth("message_delta", `{"type":"message_delta","delta":{},"usage":{"output_tokens":100}}`),
		anth("content_block_stop", `{"type":"content_block_stop","index":0}`),
		anth("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5000}}`),
		anth("message_stop", `{"type":"message_stop"}`),
	)
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	c := anthropic.NewClient(aoption.WithBaseURL(s.url), aoption.WithAPIKey("cg-test-acme"), aoption.WithMaxRetries(0))
	st := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{
		Model: "claude-haiku-4-5", MaxTokens: 8000,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	})
	for st.Next() {
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	a := s.settled(t, 1)[0].Actual
	if a.OutputTokens != 5000 || a.CachedInputTokens != 7000 || a.InputTokens != 7012 {
		t.Errorf("charged %+v; the upstream reported 12 input, 7000 cache reads, 5000 output", a)
	}
}

// TestBillAtkGuardStopHidesReasoning: a reasoning model (o4-mini) thinks
// 20,000 hidden tokens before its first visible one, billed in the usage
// report at the stream's end. When the stream guard stops the stream at
// the budget it closes the upstream's connection, so that report never
// comes: the request is billed the visible text counted (or the 1%
// reserved), not the reasoning the upstream generated and bills.
func TestBillAtkGuardStopHidesReasoning(t *testing.T) {
	const reasoning = 20000
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		chunk := func(s string) bool {
			_, err := fmt.Fprint(w, "data: "+s+"\n\n")
			f.Flush()
			return err == nil
		}
		// The reasoning is done before the first visible token.
		for i := 0; i < 2000; i++ {
			if !chunk(`{"id":"c","object":"chat.completion.chunk","model":"o4-mini-2025-04-16","choices":[{"index":0,"delta":{"content":" word"}}]}`) {
				return
			}
		}
		chunk(fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","model":"o4-mini-2025-04-16","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":%d,"completion_tokens_details":{"reasoning_tokens":%d}}}`, reasoning+2000, reasoning))
		fmt.Fprint(w, "data: [DONE]\n\n")
	}}
	extra := `
costs:
  output_reserve: 1
stream_guard:
  enabled: true
  increment_tokens: 32
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.002"
` + roomyLimits
	s := newStackWith(t, stackOptions{policies: allowAll, extra: extra, upstream: up})
	st := s.client("cg-test-acme").Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:               "o4-mini",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("think, then write")},
		MaxCompletionTokens: openai.Int(30000),
	})
	for st.Next() {
	}
	if st.Err() == nil {
		t.Fatal("the guard did not stop the stream")
	}
	e := s.settled(t, 1)[0]
	if e.Actual.OutputTokens < reasoning {
		t.Errorf("charged %d output tokens (%v); the upstream had generated %d reasoning tokens before the first visible one, and bills them",
			e.Actual.OutputTokens, e.ActualCost, reasoning)
	}
}

// TestBillAtkTimeoutMidStreamHidesReasoning: a reasoning stream that runs
// past upstreams[].timeout is cut by costgate before its usage report:
// it is billed the visible text counted (or the 1% reserved), not the
// hidden reasoning the upstream generated before it and bills.
func TestBillAtkTimeoutMidStreamHidesReasoning(t *testing.T) {
	const reasoning = 20000
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 10 {
			fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","model":"o4-mini-2025-04-16","choices":[{"index":0,"delta":{"content":" word"}}]}`+"\n\n")
		}
		w.(http.Flusher).Flush()
		time.Sleep(time.Second) // still writing
		fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"o4-mini-2025-04-16","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":%d,"completion_tokens_details":{"reasoning_tokens":%d}}}`+"\n\ndata: [DONE]\n\n", reasoning+10, reasoning)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: "\ncosts:\n  output_reserve: 1\n" + roomyLimits, upstream: up, upstreamTimeout: 400 * time.Millisecond})
	st := s.client("cg-test-acme").Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:               "o4-mini",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("think, then write")},
		MaxCompletionTokens: openai.Int(30000),
	})
	for st.Next() {
	}
	e := s.settled(t, 1)[0]
	if e.Actual.OutputTokens < reasoning {
		t.Errorf("charged %d output tokens (%v); the upstream had generated %d reasoning tokens before the first visible one, and bills them",
			e.Actual.OutputTokens, e.ActualCost, reasoning)
	}
}
