package proxy_test

// Attacks on the stream guard's counting with every kind of output an
// upstream streams: each test streams thousands of one-token deltas of one
// kind through costgate to a tenant whose budget holds about 1,700 output
// tokens, with streams admitted on 1% of their output and increments of 16
// tokens, and checks the README's bound ("a budget is exceeded by less
// than one increment per stream in flight") on what the client received,
// and that the ledger bills at least that.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

const (
	gkBudget = costmodel.NanoUSD(1_000_000) // $0.001, guardConfig("0.001", gkInc)
	gkInc    = 16
	gkEvents = 10_000 // deltas the upstream would stream: far past the budget
)

// gkEmit writes events to w, flushing every few events, until the
// upstream's client goes away.
type gkEmit struct {
	w http.ResponseWriter
	r *http.Request
	i int
}

func (e *gkEmit) send(s string) bool {
	if _, err := io.WriteString(e.w, s); err != nil || e.r.Context().Err() != nil {
		return false
	}
	if e.i++; e.i%20 == 0 {
		e.w.(http.Flusher).Flush()
	}
	return true
}

// gkStream runs one streamed request through costgate in front of an
// upstream that writes events with emit, and returns what the client got
// and the request's settled ledger entry.
func gkStream(t *testing.T, path, body string, emit func(e *gkEmit)) ([]byte, ledger.Entry) {
	t.Helper()
	return gkStreamBudget(t, "0.001", path, body, emit)
}

// gkStack is costgate with a daily budget of amount dollars, in front of
// an upstream that streams with emit.
func gkStack(t *testing.T, amount string, emit func(e *gkEmit)) *stack {
	t.Helper()
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		emit(&gkEmit{w: w, r: r})
	}}
	return newStackWith(t, stackOptions{policies: allowAll, extra: guardConfig(amount, gkInc), upstream: up})
}

// gkStreamBudget is gkStream with a daily budget of amount dollars.
func gkStreamBudget(t *testing.T, amount, path, body string, emit func(e *gkEmit)) ([]byte, ledger.Entry) {
	t.Helper()
	s := gkStack(t, amount, emit)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := s.post(t, ctx, path, body)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	return got, s.settled(t, 1)[0]
}

// gkCheck checks the bound on a stream of model that carried shown output
// tokens to the client: what the client got costs no more than the budget
// and one increment, and the ledger bills at least it.
func gkCheck(t *testing.T, model string, shown int64, e ledger.Entry) {
	t.Helper()
	gkCheckBudget(t, gkBudget, model, shown, e)
}

// gkCheckBudget is gkCheck with a budget of budget.
func gkCheckBudget(t *testing.T, budget costmodel.NanoUSD, model string, shown int64, e ledger.Entry) {
	t.Helper()
	est := estimator(t)
	bound := est.Cost(model, costmodel.Usage{OutputTokens: gkInc})
	served := est.Cost(model, costmodel.Usage{InputTokens: e.Actual.InputTokens, OutputTokens: shown})
	t.Logf("client got %d output tokens (%v); ledger: %d output tokens, %v; budget %v, bound %v",
		shown, served, e.Actual.OutputTokens, e.ActualCost, budget, bound)
	if shown < 100 {
		t.Fatalf("the client got only %d tokens: the attack did not run", shown)
	}
	if served > budget+bound {
		t.Errorf("the client was served %v against a %v budget: over by %v, more than one increment (%v)", served, budget, served-budget, bound)
	}
	if e.Actual.OutputTokens < shown {
		t.Errorf("billed %d output tokens; the client got %d", e.Actual.OutputTokens, shown)
	}
	if e.Status != ledger.StatusSettled {
		t.Errorf("entry status %s, want settled", e.Status)
	}
}

func gkChunk(choices string) string {
	return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[` + choices + "]}\n\n"
}

// TestGuardKindsAttackChatDeltaKinds: a chat completion streams its output
// as content, tool call arguments, a legacy function call's arguments, a
// refusal, with logprobs beside it, or with its text spelled in unicode
// escapes; each delta is one token. Whatever the kind, the stream stops
// within one increment past the budget and the ledger bills what the
// client got.
func TestGuardKindsAttackChatDeltaKinds(t *testing.T) {
	for _, c := range []struct {
		name, first, delta, marker string
	}{
		{"content", `{"index":0,"delta":{"role":"assistant","content":""}}`, `{"index":0,"delta":{"content":" word"}}`, `" word"`},
		{"tool call arguments", `{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"write","arguments":""}}]}}`,
			`{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" word"}}]}}`, `" word"`},
		{"function call arguments", `{"index":0,"delta":{"role":"assistant","function_call":{"name":"write","arguments":""}}}`,
			`{"index":0,"delta":{"function_call":{"arguments":" word"}}}`, `" word"`},
		{"refusal", `{"index":0,"delta":{"role":"assistant","refusal":""}}`, `{"index":0,"delta":{"refusal":" word"}}`, `" word"`},
		{"custom tool input", `{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"custom","custom":{"name":"write","input":""}}]}}`,
			`{"index":0,"delta":{"tool_calls":[{"index":0,"type":"custom","custom":{"input":" word"}}]}}`, `" word"`},
		{"logprobs", `{"index":0,"delta":{"role":"assistant","content":""}}`,
			`{"index":0,"delta":{"content":" word"},"logprobs":{"content":[{"token":" word","logprob":-0.1,"bytes":[32,119,111,114,100],"top_logprobs":[{"token":" word","logprob":-0.1,"bytes":[32,119,111,114,100]},{"token":" text","logprob":-2.5,"bytes":[32,116,101,120,116]}]}],"refusal":null}}`, `"content":" word"`},
		{"unicode escapes", `{"index":0,"delta":{"role":"assistant","content":""}}`, `{"index":0,"delta":{"content":"\u0020\u0077\u006f\u0072\u0064"}}`, `\u0020\u0077\u006f\u0072\u0064`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, e := gkStream(t, "/v1/chat/completions",
				`{"model":"gpt-4o-mini","stream":true,"max_tokens":16000,"messages":[{"role":"user","content":"write"}],"tools":[{"type":"function","function":{"name":"write","parameters":{"type":"object"}}}]}`,
				func(e *gkEmit) {
					e.send(gkChunk(c.first))
					for range gkEvents {
						if !e.send(gkChunk(c.delta)) {
							return
						}
					}
					e.send("data: [DONE]\n\n")
				})
			gkCheck(t, "gpt-4o-mini", int64(bytes.Count(got, []byte(c.marker))), e)
			if !bytes.Contains(got, []byte(`"budget_exceeded"`)) {
				t.Errorf("the stream was not stopped at the budget: ...%s", got[max(len(got)-300, 0):])
			}
		})
	}
}

// TestGuardKindsAttackInterleavedChoices: a chat completion (or a
// completion) with n=2 streams its two choices interleaved, one token per
// chunk, as OpenAI does; here short tokens with no space between them (hex,
// base64, code a tenant asks for). The guard appends every choice's text to
// one buffer and counts it as one text, where the tokens of the two choices
// run together into a few long ones ("a"+"b"+"a"+"b" is one token per four
// letters), while the upstream bills, and the meter counts, each choice
// apart. Must hold: the stream stops within one increment past the budget.
func TestGuardKindsAttackInterleavedChoices(t *testing.T) {
	for _, c := range []struct {
		name, path, body, delta string
	}{
		{"chat", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"n":2,"max_tokens":16000,"messages":[{"role":"user","content":"hex"}]}`, `{"index":%d,"delta":{"content":%q}}`},
		{"completions", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","stream":true,"n":2,"max_tokens":3000,"prompt":"hex"}`, `{"index":%d,"text":%q}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			model := "gpt-4o-mini"
			if c.name == "completions" {
				model = "gpt-3.5-turbo-instruct"
			}
			got, e := gkStream(t, c.path, c.body, func(e *gkEmit) {
				for range gkEvents / 2 {
					for i, tok := range []string{"a", "b"} {
						ch := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"` + model + `","choices":[` + fmt.Sprintf(c.delta, i, tok) + "]}\n\n"
						if !e.send(ch) {
							return
						}
					}
				}
				e.send("data: [DONE]\n\n")
			})
			shown := int64(bytes.Count(got, []byte(`"a"`)) + bytes.Count(got, []byte(`"b"`)))
			gkCheck(t, model, shown, e)
		})
	}
}

func gkResponsesEvent(typ, delta string) string {
	return fmt.Sprintf("event: %s\ndata: {\"type\":%q,\"item_id\":\"it\",\"output_index\":0,\"content_index\":0,\"delta\":%q}\n\n", typ, typ, delta)
}

const gkResponsesCreated = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"object\":\"response\",\"model\":\"gpt-4.1-mini\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n"

// TestGuardKindsAttackResponsesDeltaKinds: the Responses API streams its
// output as output text, refusal, function call arguments, reasoning
// summary and reasoning text deltas, with or without an "event:" line. Each
// kind is output the upstream bills: the stream stops within one increment
// past the budget and the ledger bills what the client got.
func TestGuardKindsAttackResponsesDeltaKinds(t *testing.T) {
	for _, c := range []struct {
		name, typ   string
		noEventLine bool
	}{
		{"output text", "response.output_text.delta", false},
		{"output text, no event line", "response.output_text.delta", true},
		{"refusal", "response.refusal.delta", false},
		{"function call arguments", "response.function_call_arguments.delta", false},
		{"reasoning summary", "response.reasoning_summary_text.delta", false},
		{"reasoning text", "response.reasoning_text.delta", false},
		{"shell call command", "response.shell_call_command.delta", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, e := gkStream(t, "/v1/responses", `{"model":"gpt-4.1-mini","stream":true,"max_output_tokens":30000,"input":"write"}`, func(e *gkEmit) {
				e.send(gkResponsesCreated)
				ev := gkResponsesEvent(c.typ, " word")
				if c.noEventLine {
					ev = ev[strings.Index(ev, "\n")+1:]
				}
				for range gkEvents {
					if !e.send(ev) {
						return
					}
				}
			})
			gkCheck(t, "gpt-4.1-mini", int64(bytes.Count(got, []byte(`"delta":" word"`))), e)
		})
	}
}

// TestGuardKindsAttackResponsesSearches: a Responses request with the
// web_search or file_search tool and no max_tool_calls is admitted on 10
// searches (and their results), but OpenAI sets no limit then; each
// web_search_call ($0.025 for gpt-4.1-mini) or file_search_call ($0.0025)
// the upstream runs is billed apart, shown in the stream as it completes
// (response.output_item.done). A tenant whose budget holds the reservation
// ($0.30, $0.07) asks for research that runs 40 searches:
// the guard debits only output tokens, so the searches pass uncounted
// while the stream runs, and it goes past the budget by most of them. Must
// hold: what the client got stays within one increment and one search past
// the budget (the guard can count a search as it passes, as it counts
// text), and the ledger bills every search.
func TestGuardKindsAttackResponsesSearches(t *testing.T) {
	const searches = 40
	for _, c := range []struct {
		tool, item string
		budget     costmodel.NanoUSD // what the reservation needs: 10 searches with their results
	}{
		{`{"type":"web_search"}`, "web_search_call", 300_000_000},
		{`{"type":"file_search","vector_store_ids":["vs_1"]}`, "file_search_call", 70_000_000},
	} {
		t.Run(c.item, func(t *testing.T) {
			got, e := gkStreamBudget(t, c.budget.String()[1:], "/v1/responses", `{"model":"gpt-4.1-mini","stream":true,"max_output_tokens":30000,"input":"research","tools":[`+c.tool+`]}`, func(e *gkEmit) {
				e.send(gkResponsesCreated)
				short := strings.TrimSuffix(c.item, "_call")
				for i := range searches {
					id := fmt.Sprintf("s_%d", i)
					for _, ev := range []string{
						`{"type":"response.output_item.added","output_index":%d,"item":{"id":"%s","type":"` + c.item + `","status":"in_progress"}}`,
						`{"type":"response.` + short + `_call.in_progress","output_index":%d,"item_id":"%s"}`,
						`{"type":"response.` + short + `_call.searching","output_index":%d,"item_id":"%s"}`,
						`{"type":"response.` + short + `_call.completed","output_index":%d,"item_id":"%s"}`,
						`{"type":"response.output_item.done","output_index":%d,"item":{"id":"%s","type":"` + c.item + `","status":"completed","queries":["q"]}}`,
					} {
						body := fmt.Sprintf(ev, i, id)
						typ := body[9 : strings.Index(body[9:], `"`)+9]
						if !e.send("event: " + typ + "\ndata: " + body + "\n\n") {
							return
						}
					}
					if !e.send(gkResponsesEvent("response.output_text.delta", " word")) {
						return
					}
				}
				e.send(fmt.Sprintf("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"object\":\"response\",\"model\":\"gpt-4.1-mini\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":20,\"output_tokens\":%d,\"total_tokens\":%d}}}\n\n", searches, searches+20))
			})
			shown := int64(bytes.Count(got, []byte(`"delta":" word"`)))
			done := int64(bytes.Count(got, []byte(`"type":"response.output_item.done"`)))
			var used, one, billed costmodel.Usage
			used.OutputTokens = shown // and the input, whose results the upstream reports at the end
			one.OutputTokens = gkInc
			if c.item == "web_search_call" {
				used.WebSearchRequests, one.WebSearchRequests, billed.WebSearchRequests = done, 1, e.Actual.WebSearchRequests
			} else {
				used.FileSearchCalls, one.FileSearchCalls, billed.FileSearchCalls = done, 1, e.Actual.FileSearchCalls
			}
			est := estimator(t)
			budget := c.budget
			bound := est.Cost("gpt-4.1-mini", one)
			served := est.Cost("gpt-4.1-mini", used)
			t.Logf("client got %d searches and %d tokens (%v); ledger: %+v, %v; budget %v", done, shown, served, e.Actual, e.ActualCost, budget)
			if done < 2 {
				t.Fatalf("the client got %d searches: the attack did not run", done)
			}
			if served > budget+bound {
				t.Errorf("the client was served %d searches (%v) against a %v budget: over by %v", done, served, budget, served-budget)
			}
			if billed.WebSearchRequests+billed.FileSearchCalls < done || e.Actual.OutputTokens < shown {
				t.Errorf("billed %d searches and %d output tokens; the client got %d and %d", billed.WebSearchRequests+billed.FileSearchCalls, e.Actual.OutputTokens, done, shown)
			}
		})
	}
}

const gkAnthropicStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-haiku-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n"

// TestGuardKindsAttackAnthropicDeltaKinds: with a budget of $0.01, the Messages API streams its
// output as text, tool input (input_json_delta, also of a server tool such
// as code execution), thinking, with signature and citation deltas beside
// them, with or without an "event:" line. Each kind the upstream bills as
// output stops within one increment past the budget, and the ledger bills
// what the client got.
func TestGuardKindsAttackAnthropicDeltaKinds(t *testing.T) {
	for _, c := range []struct {
		name, start, delta, marker string
		noEventLine                bool
	}{
		{"text", `{"type":"text","text":""}`, `{"type":"text_delta","text":" word"}`, `"text":" word"`, false},
		{"text, no event line", `{"type":"text","text":""}`, `{"type":"text_delta","text":" word"}`, `"text":" word"`, true},
		{"tool input", `{"type":"tool_use","id":"toolu_1","name":"write","input":{}}`, `{"type":"input_json_delta","partial_json":" word"}`, `"partial_json":" word"`, false},
		{"server tool input", `{"type":"server_tool_use","id":"srvtoolu_1","name":"code_execution","input":{}}`, `{"type":"input_json_delta","partial_json":" word"}`, `"partial_json":" word"`, false},
		{"thinking", `{"type":"thinking","thinking":"","signature":""}`, `{"type":"thinking_delta","thinking":" word"}`, `"thinking":" word"`, false},
		{"text with citations", `{"type":"text","text":"","citations":[]}`, `{"type":"text_delta","text":" word"}`, `"text":" word"`, false},
		{"compaction summary", `{"type":"compaction","content":""}`, `{"type":"compaction_delta","content":" word"}`, `"content":" word"`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, e := gkStreamBudget(t, "0.01", "/v1/messages", `{"model":"claude-haiku-4-5","stream":true,"max_tokens":30000,"messages":[{"role":"user","content":"write"}],"tools":[{"name":"write","input_schema":{"type":"object"}}]}`, func(e *gkEmit) {
				ev := func(typ, data string) bool {
					if c.noEventLine {
						return e.send("data: " + data + "\n\n")
					}
					return e.send("event: " + typ + "\ndata: " + data + "\n\n")
				}
				ev("message_start", gkAnthropicStart[len("event: message_start\ndata: "):len(gkAnthropicStart)-2])
				ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":`+c.start+`}`)
				for i := range gkEvents {
					if !ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":`+c.delta+`}`) {
						return
					}
					if c.name == "text with citations" && i%10 == 0 {
						ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","cited_text":"a cited text of some length","url":"https://example.com","title":"t","encrypted_index":"eyJ"}}}`)
					}
				}
				if c.name == "thinking" {
					ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}}`)
				}
				ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
			})
			gkCheckBudget(t, 10_000_000, "claude-haiku-4-5", int64(bytes.Count(got, []byte(c.marker))), e)
		})
	}
}

// gkChatText is the text of the chat chunks of an SSE body, whatever its
// line ends.
func gkChatText(t *testing.T, body []byte) string {
	t.Helper()
	var text strings.Builder
	lines := strings.FieldsFunc(string(body), func(r rune) bool { return r == '\r' || r == '\n' })
	for _, l := range lines {
		v, ok := strings.CutPrefix(l, "data:")
		if !ok || strings.TrimSpace(v) == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(v), &c); err != nil {
			t.Fatalf("the client got a chunk that is not JSON: %q: %v", v, err)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	return text.String()
}

// TestGuardKindsAttackFraming: an upstream frames its events in every way
// the SSE format allows: CRLF or CR line ends, "data:" without a space,
// comments (": ping") between events, writes of a few bytes that cut
// events mid-line, mid-JSON and mid-rune (two- and three-byte runes, and
// text with unicode escapes). The guard finds every event's end as the
// meter does: the stream stops within one increment past the budget, the
// client gets whole, valid chunks, and the ledger bills the text it got.
func TestGuardKindsAttackFraming(t *testing.T) {
	for _, c := range []struct {
		name    string
		nl      string // line end
		sep     string // after "data:"
		comment bool
		frag    int // bytes per write; 0: whole events
		content string
	}{
		{"CRLF", "\r\n", " ", false, 0, " word"},
		{"CR", "\r", " ", false, 0, " word"},
		{"data: without space", "\n", "", false, 0, " word"},
		{"comments", "\n", " ", true, 0, " word"},
		{"CRLF cut every 7 bytes", "\r\n", " ", true, 7, " word"},
		{"two-byte runes cut every 3 bytes", "\n", "", false, 3, " café"},
		{"three-byte runes cut every 5 bytes", "\r\n", " ", false, 5, " 中文"},
		{"escaped runes cut every 4 bytes", "\n", " ", false, 4, `\u4e2d\u6587`},
	} {
		for _, inPlace := range []bool{false, true} {
			name, opts := c.name, ""
			if inPlace {
				// The client asks for the usage report: costgate hides
				// nothing and passes the stream in place.
				name, opts = c.name+", in place", `"stream_options":{"include_usage":true},`
			}
			t.Run(name, func(t *testing.T) {
				got, e := gkStream(t, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,`+opts+`"max_tokens":16000,"messages":[{"role":"user","content":"write"}]}`, func(e *gkEmit) {
					for range gkEvents {
						ev := "data:" + c.sep + `{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"` + c.content + `"}}]}` + c.nl + c.nl
						if c.comment {
							ev = ": ping" + c.nl + c.nl + ev
						}
						if c.frag == 0 {
							if !e.send(ev) {
								return
							}
							continue
						}
						for b := ev; len(b) > 0; {
							n := min(c.frag, len(b))
							if _, err := io.WriteString(e.w, b[:n]); err != nil || e.r.Context().Err() != nil {
								return
							}
							e.w.(http.Flusher).Flush()
							b = b[n:]
						}
					}
					e.send("data: [DONE]" + c.nl + c.nl)
				})
				text := gkChatText(t, got)
				if !utf8.ValidString(text) {
					t.Errorf("the client got text that is not UTF-8")
				}
				shown := estimator(t).CountText("gpt-4o-mini", text)
				gkCheck(t, "gpt-4o-mini", shown, e)
				if !bytes.Contains(got, []byte(`"budget_exceeded"`)) {
					t.Errorf("the stream was not stopped at the budget: ...%q", got[max(len(got)-300, 0):])
				}
			})
		}
	}
}

// TestGuardKindsAttackAnthropicWebSearches: a Messages request with the
// web_search tool and no max_uses is admitted on 10 searches, but the
// upstream may run more; each is billed apart ($0.01) and shows in the
// stream as it runs (a server_tool_use block named web_search, then its
// web_search_tool_result block); the count is reported only in
// message_delta at the end. A tenant with a $0.21 budget (what the
// reservation needs: 10 searches with their results) asks for research
// that runs 30 searches ($0.30), then a long answer: the guard debits only
// the text, so the searches pass uncounted, and when the guard stops the
// text the stream never reaches message_delta, so the ledger bills the 10
// searches reserved, not the 30 the client got. Must hold: what the client
// got stays within one increment (and one search) past the budget, and the
// ledger bills every search it got.
func TestGuardKindsAttackAnthropicWebSearches(t *testing.T) {
	const searches = 30
	got, e := gkStreamBudget(t, "0.21", "/v1/messages", `{"model":"claude-haiku-4-5","stream":true,"max_tokens":30000,"messages":[{"role":"user","content":"research"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, func(e *gkEmit) {
		ev := func(typ, data string) bool { return e.send("event: " + typ + "\ndata: " + data + "\n\n") }
		ev("message_start", gkAnthropicStart[len("event: message_start\ndata: "):len(gkAnthropicStart)-2])
		i := 0
		for s := range searches {
			ev("content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"server_tool_use","id":"srvtoolu_%d","name":"web_search","input":{}}}`, i, s))
			ev("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"input_json_delta","partial_json":"{\"query\":\"q\"}"}}`, i))
			ev("content_block_stop", fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, i))
			i++
			ev("content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_%d","content":[{"type":"web_search_result","title":"t","url":"https://example.com","encrypted_content":"EqgfCioIARgB","page_age":null}]}}`, i, s))
			if !ev("content_block_stop", fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, i)) {
				return
			}
			i++
		}
		ev("content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"text","text":""}}`, i))
		for range gkEvents {
			if !ev("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":" word"}}`, i)) {
				return
			}
		}
		ev("content_block_stop", fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, i))
		ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d,"server_tool_use":{"web_search_requests":%d}}}`, gkEvents+100, searches))
		ev("message_stop", `{"type":"message_stop"}`)
	})
	shown := int64(bytes.Count(got, []byte(`"text":" word"`)))
	done := int64(bytes.Count(got, []byte(`"type":"web_search_tool_result"`)))
	est := estimator(t)
	budget := costmodel.NanoUSD(210_000_000)
	bound := est.Cost("claude-haiku-4-5", costmodel.Usage{OutputTokens: gkInc, WebSearchRequests: 1})
	served := est.Cost("claude-haiku-4-5", costmodel.Usage{OutputTokens: shown, WebSearchRequests: done}) // and the input, whose results the upstream reports at the end
	t.Logf("client got %d searches and %d tokens (%v); ledger: %d searches, %d output tokens, %v; budget %v", done, shown, served, e.Actual.WebSearchRequests, e.Actual.OutputTokens, e.ActualCost, budget)
	if served > budget+bound {
		t.Errorf("the client was served %d web searches and %d tokens (%v) against a %v budget: over by %v", done, shown, served, budget, served-budget)
	}
	if e.Actual.WebSearchRequests < done {
		t.Errorf("billed %d searches; the client got %d", e.Actual.WebSearchRequests, done)
	}
}

// TestGuardKindsAttackChatReasoningContent: OpenAI-compatible upstreams
// (DeepSeek, vLLM, SGLang, OpenRouter) stream a reasoning model's
// reasoning as visible text in delta.reasoning_content (or
// delta.reasoning), billed as output tokens. It is not hidden reasoning:
// the guard can count it as it passes. A tenant asks for a long chain of
// thought (the stub plays such a server; the model's name only picks its
// price): must hold, the stream stops within one increment past the
// budget, and the ledger bills what the client got.
func TestGuardKindsAttackChatReasoningContent(t *testing.T) {
	for _, field := range []string{"reasoning_content", "reasoning"} {
		t.Run(field, func(t *testing.T) {
			got, e := gkStream(t, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"max_tokens":16000,"messages":[{"role":"user","content":"think"}]}`, func(e *gkEmit) {
				for range gkEvents {
					if !e.send(gkChunk(`{"index":0,"delta":{"` + field + `":" word"}}`)) {
						return
					}
				}
				e.send(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":10000,"total_tokens":10009}}` + "\n\n")
				e.send("data: [DONE]\n\n")
			})
			gkCheck(t, "gpt-4o-mini", int64(bytes.Count(got, []byte(`":" word"`))), e)
		})
	}
}

// TestGuardKindsAttackLongEvents: an upstream sends each delta as one long
// event (thousands of tokens, longer than half of the proxy's copy buffer,
// or longer than the whole of it), which costgate passes on before the
// event ends. The README's bound for such an upstream is the output of the
// one event whose increment was refused: the client gets no more than the
// budget, one increment and one event.
func TestGuardKindsAttackLongEvents(t *testing.T) {
	for _, words := range []int{1_000, 3_500, 7_000, 20_000} {
		for _, inPlace := range []bool{false, true} {
			opts := ""
			if inPlace {
				opts = `"stream_options":{"include_usage":true},`
			}
			t.Run(fmt.Sprintf("%d words, in place %v", words, inPlace), func(t *testing.T) {
				content := strings.Repeat(" word", words)
				got, e := gkStreamBudget(t, "0.01", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,`+opts+`"max_tokens":100000,"messages":[{"role":"user","content":"write"}]}`, func(e *gkEmit) {
					for range 50 {
						if !e.send(gkChunk(`{"index":0,"delta":{"content":"` + content + `"}}`)) {
							return
						}
						e.w.(http.Flusher).Flush()
					}
					e.send("data: [DONE]\n\n")
				})
				shown := int64(bytes.Count(got, []byte(" word")))
				est := estimator(t)
				budget := costmodel.NanoUSD(10_000_000)
				bound := est.Cost("gpt-4o-mini", costmodel.Usage{OutputTokens: gkInc + int64(words)})
				served := est.Cost("gpt-4o-mini", costmodel.Usage{InputTokens: e.Actual.InputTokens, OutputTokens: shown})
				t.Logf("client got %d tokens (%v); ledger %d tokens, %v; budget %v, bound %v", shown, served, e.Actual.OutputTokens, e.ActualCost, budget, bound)
				if served > budget+bound {
					t.Errorf("the client was served %v against a %v budget: over by %v, more than one event and one increment (%v)", served, budget, served-budget, bound)
				}
				if e.Actual.OutputTokens < shown {
					t.Errorf("billed %d output tokens; the client got %d", e.Actual.OutputTokens, shown)
				}
			})
		}
	}
}

// TestGuardKindsAttackInterleavedChoicesSDK is
// TestGuardKindsAttackInterleavedChoices through openai-go: the client
// asks for two choices and reads them apart, as an SDK user does.
func TestGuardKindsAttackInterleavedChoicesSDK(t *testing.T) {
	s := gkStack(t, "0.001", func(e *gkEmit) {
		for range gkEvents / 2 {
			for i, tok := range []string{"a", "b"} {
				if !e.send(gkChunk(fmt.Sprintf(`{"index":%d,"delta":{"content":%q}}`, i, tok))) {
					return
				}
			}
		}
		e.send("data: [DONE]\n\n")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := chatParams("Write two long hex strings.", 16000)
	p.N = openai.Int(2)
	st := s.client("cg-test-acme").Chat.Completions.NewStreaming(ctx, p)
	var shown int64
	for st.Next() {
		for _, c := range st.Current().Choices {
			shown += int64(len(c.Delta.Content)) // one token per one-letter chunk
		}
	}
	err := st.Err()
	st.Close()
	if err == nil || !strings.Contains(err.Error(), "budget_exceeded") {
		t.Errorf("the stream did not end with the budget's error: %v", err)
	}
	gkCheck(t, "gpt-4o-mini", shown, s.settled(t, 1)[0])
}
