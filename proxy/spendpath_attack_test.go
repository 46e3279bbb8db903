package proxy_test

// Attacks of a tenant that has the upstream spend money costgate neither
// reserved nor billed: endpoints under the upstream's base that costgate
// does not price, other methods on priced paths, and request bodies that
// ask for server-side tools billed per call (web search, image generation,
// containers). Each request either is priced (reserved before it is
// forwarded, and billed at least what the upstream bills) or is refused
// before it reaches the upstream; the stub upstream records what reached it.

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// spAtkSend sends body to path with method and acme's key, and returns the
// answer's status and body.
func spAtkSend(t *testing.T, s *stack, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	req.Header.Set("X-Api-Key", "cg-test-acme")
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Transport{}).RoundTrip(req) // redirects are answers, not followed
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// spAtkStack is costgate with both LLM upstreams at up, which records
// every request that reaches it. extra is more config (after the limits).
func spAtkStack(t *testing.T, up *routeAtkSpy, extra string) *stack {
	t.Helper()
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	return newStackWith(t, stackOptions{extra: roomyLimits + extra, policies: allowAll, upstream: up, upstreamURL: ts.URL})
}

// spAtkJSON answers every request with body as JSON.
func spAtkJSON(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, body)
	})
}

// TestSpendPathAttackUnpricedEndpointsReachNothing: OpenAI and Anthropic
// bill many endpoints costgate does not price (images, audio, batches,
// files, fine-tuning, vector stores, assistants, realtime sessions, stored
// responses and completions, message batches, token counting, the legacy
// completions of Anthropic). The README lists the paths served; a request
// to any other path under /v1, or another method on a priced path, is
// answered by costgate (404 or 405) and never reaches the upstream with
// costgate's credential.
func TestSpendPathAttackUnpricedEndpointsReachNothing(t *testing.T) {
	up := &routeAtkSpy{next: spAtkJSON(`{"ok":true}`)}
	s := spAtkStack(t, up, "")
	body := `{"model":"gpt-image-1","prompt":"a cat","n":10,"size":"1536x1024","quality":"high"}`
	cases := []struct{ method, path string }{
		{"POST", "/v1/images/generations"},
		{"POST", "/v1/images/edits"},
		{"POST", "/v1/images/variations"},
		{"POST", "/v1/audio/speech"},
		{"POST", "/v1/audio/transcriptions"},
		{"POST", "/v1/audio/translations"},
		{"POST", "/v1/moderations"},
		{"POST", "/v1/batches"},
		{"POST", "/v1/batches/batch_1/cancel"},
		{"POST", "/v1/files"},
		{"POST", "/v1/uploads"},
		{"POST", "/v1/fine_tuning/jobs"},
		{"POST", "/v1/vector_stores"},
		{"POST", "/v1/vector_stores/vs_1/file_batches"},
		{"POST", "/v1/assistants"},
		{"POST", "/v1/threads/runs"},
		{"POST", "/v1/threads/th_1/runs"},
		{"POST", "/v1/realtime/sessions"},
		{"POST", "/v1/realtime/client_secrets"},
		{"POST", "/v1/conversations"},
		{"POST", "/v1/containers"},
		{"POST", "/v1/videos"},
		{"POST", "/v1/evals"},
		{"GET", "/v1/responses/resp_1"},
		{"GET", "/v1/responses/resp_1?stream=true"},
		{"POST", "/v1/responses/resp_1/cancel"},
		{"GET", "/v1/responses/resp_1/input_items"},
		{"POST", "/v1/responses/input_tokens"},
		{"POST", "/v1/responses/compact"},
		{"DELETE", "/v1/responses/resp_1"},
		{"GET", "/v1/chat/completions/chatcmpl_1"},
		{"POST", "/v1/chat/completions/chatcmpl_1"},
		{"GET", "/v1/chat/completions/chatcmpl_1/messages"},
		{"POST", "/v1/messages/batches"},
		{"POST", "/v1/messages/count_tokens"},
		{"POST", "/v1/complete"},
		{"POST", "/v1/files?beta=true"},
		{"POST", "/v1/skills"},
		{"GET", "/v1/chat/completions"},
		{"PUT", "/v1/chat/completions"},
		{"PATCH", "/v1/responses"},
		{"DELETE", "/v1/messages"},
		{"HEAD", "/v1/embeddings"},
		{"OPTIONS", "/v1/completions"},
		{"POST", "/v1/models"},
		{"POST", "/v2/chat/completions"},
		{"POST", "/chat/completions"},
		{"POST", "/v1"},
		{"POST", "/"},
	}
	for _, c := range cases {
		status, out := spAtkSend(t, s, c.method, c.path, body)
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: %d %s; want 404 or 405", c.method, c.path, status, out)
		}
		if seen := up.take(); len(seen) != 0 {
			t.Errorf("%s %s reached the upstream as %s %s", c.method, c.path, seen[0].method, seen[0].path)
		}
	}
	// GET /v1/models is costgate's own list.
	if status, out := spAtkSend(t, s, "GET", "/v1/models", ""); status != http.StatusOK {
		t.Errorf("GET /v1/models: %d %s", status, out)
	}
	if seen := up.take(); len(seen) != 0 {
		t.Errorf("GET /v1/models reached the upstream as %s %s", seen[0].method, seen[0].path)
	}
	if es := routeAtkEntries(t, s, "acme"); len(es) != 0 {
		t.Errorf("%d ledger entries for requests that reached no upstream", len(es))
	}
}

// spAtkResponse is a completed Responses answer of model with the output
// items items before its message, 10 input and 2 output tokens.
func spAtkResponse(model, items string) string {
	return fmt.Sprintf(`{"id":"resp_1","object":"response","status":"completed","model":%q,"service_tier":"default","output":[%s`+
		`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],`+
		`"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":12}}`, model, items)
}

// TestSpendPathAttackPriceOverrideKeepsPerCallTools: an operator who
// restates a model's token prices under costs.prices (a negotiated rate, or
// the built-in row copied as is) must not make the model's per-call tools
// free. OpenAI bills each web_search_call of a Responses answer ($25 per
// 1,000 for gpt-4.1-mini), Anthropic each web search of its usage ($10 per
// 1,000): the tenant is billed at least those, with or without the
// override.
func TestSpendPathAttackPriceOverrideKeepsPerCallTools(t *testing.T) {
	const searches = 4
	items := strings.Repeat(`{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"q"}},`, searches)
	anthropic := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi"}],` +
		`"stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":2,"server_tool_use":{"web_search_requests":4}}}`
	cases := []struct {
		name, model, path, body, answer, override string
		perSearch                                 costmodel.NanoUSD
	}{
		{"responses web_search", "gpt-4.1-mini", "/v1/responses",
			`{"model":"gpt-4.1-mini","input":"news?","tools":[{"type":"web_search"}]}`,
			spAtkResponse("gpt-4.1-mini", items), `{input: "0.40", cached_input: "0.10", output: "1.60", max_output_tokens: 32768}`, 25_000_000},
		{"anthropic web_search", "claude-sonnet-4-5", "/v1/messages",
			`{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{"role":"user","content":"news?"}],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":4}]}`,
			anthropic, `{input: "3.00", cached_input: "0.30", cache_write: "3.75", output: "15.00", max_output_tokens: 64000}`, 10_000_000},
	}
	for _, c := range cases {
		for _, override := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/override=%v", c.name, override), func(t *testing.T) {
				extra := ""
				if override {
					extra = "costs:\n  prices:\n    " + c.model + ": " + c.override + "\n"
				}
				up := &routeAtkSpy{next: spAtkJSON(c.answer)}
				s := spAtkStack(t, up, extra)
				if status, out := spAtkSend(t, s, "POST", c.path, c.body); status != http.StatusOK {
					t.Fatalf("%d %s", status, out)
				}
				e := s.settled(t, 1)[0]
				if floor := searches * c.perSearch; e.ActualCost < floor {
					t.Errorf("billed %v (searches %d) for %d web searches the upstream bills at least %v",
						e.ActualCost, e.Actual.WebSearchRequests, searches, floor)
				}
			})
		}
	}
}

// TestSpendPathAttackPerCallPricesConfigurable: the README documents
// costs.prices.<model>.web_search, file_search and container as per-call
// prices an operator may set. A config that sets them is accepted (an
// operator who cannot set them cannot price a model's tools at all).
func TestSpendPathAttackPerCallPricesConfigurable(t *testing.T) {
	for _, field := range []string{`web_search: "0.01"`, `file_search: "0.0025"`, `container: "0.03"`} {
		yaml := fmt.Sprintf("admin_token: test-admin\ndata_dir: %q\nupstreams:\n  - name: openai\n    kind: openai\n    base_url: http://127.0.0.1:1\n"+
			"tenants:\n  - name: acme\n    plan: free\n    keys:\n      - {id: k, key: cg-test-acme}\n"+
			"costs:\n  prices:\n    my-model: {input: \"1.00\", output: \"2.00\", max_output_tokens: 1000, %s}\n", t.TempDir(), field)
		if _, err := config.Parse([]byte(yaml)); err != nil {
			t.Errorf("costs.prices.my-model.%s: %v", strings.SplitN(field, ":", 2)[0], err)
		}
	}
}

// TestSpendPathAttackChatWebSearchOptions: a chat completion with
// web_search_options has OpenAI run a web search (its search models search
// on every request) and bill it per call besides the tokens; the answer's
// usage does not count it. The model's web_search price is charged for the
// call, or the request is refused: never the tokens alone.
func TestSpendPathAttackChatWebSearchOptions(t *testing.T) {
	const model = "gpt-4o-mini" // $25 per 1,000 web searches in the built-in table
	answer := fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,`+
		`"message":{"role":"assistant","content":"It rained.","annotations":[{"type":"url_citation","url_citation":{"url":"https://example.com","title":"x","start_index":0,"end_index":3}}]},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`, model)
	up := &routeAtkSpy{next: spAtkJSON(answer)}
	s := spAtkStack(t, up, "")
	body := `{"model":"` + model + `","web_search_options":{"search_context_size":"high"},"messages":[{"role":"user","content":"weather?"}],"max_tokens":50}`
	e, served := spAtkServed(t, s, up, "/v1/chat/completions", body)
	if !served {
		return // refused: holds
	}
	const perSearch = costmodel.NanoUSD(25_000_000)
	if e.ActualCost < perSearch || e.EstimatedCost < perSearch {
		t.Errorf("reserved %v and billed %v for a chat completion with web_search_options; OpenAI bills the search alone %v",
			e.EstimatedCost, e.ActualCost, perSearch)
	}
}

// TestSpendPathAttackResponsesImageGeneration: a Responses request with the
// image_generation tool has OpenAI generate images, billed at the image
// model's rates apart from the response's usage (the cheapest image it
// makes costs $0.005). costgate has no image price: such a request must be
// refused, or billed at least per image_generation_call of the answer;
// never the text tokens alone.
func TestSpendPathAttackResponsesImageGeneration(t *testing.T) {
	const model = "gpt-4.1-mini"
	items := strings.Repeat(`{"type":"image_generation_call","id":"ig_1","status":"completed","result":"iVBORw0KGgo="},`, 4)
	up := &routeAtkSpy{next: spAtkJSON(spAtkResponse(model, items))}
	s := spAtkStack(t, up, "")
	body := `{"model":"` + model + `","input":"draw four cats","tools":[{"type":"image_generation","quality":"high","size":"1536x1024"}]}`
	e, served := spAtkServed(t, s, up, "/v1/responses", body)
	if !served {
		return
	}
	const perImage = costmodel.NanoUSD(5_000_000)
	if e.ActualCost < 4*perImage {
		t.Errorf("billed %v for 4 generated images; OpenAI bills them at least %v", e.ActualCost, 4*perImage)
	}
}

// TestSpendPathAttackResponsesToolTypeTwice: a Responses tool's type decides
// what costgate reserves and bills beyond the tokens (a 64 GB automatic
// container is $1.92 a session, and no answer says it was created). The
// README: a priced JSON field given twice, or in two spellings, is 400,
// since an upstream may read the other one. A tool whose type, container
// type or memory_limit is given twice must be refused, or billed as the
// costlier reading.
func TestSpendPathAttackResponsesToolTypeTwice(t *testing.T) {
	const model = "gpt-4.1-mini"
	const auto64 = `"container":{"type":"auto","memory_limit":"64g"}`
	cases := []struct{ name, tool string }{
		{"type twice", `{"type":"code_interpreter",` + auto64 + `,"type":"function","name":"f"}`},
		{"type in two spellings", `{"type":"code_interpreter",` + auto64 + `,"Type":"function","name":"f"}`},
		{"container type in two spellings", `{"type":"code_interpreter","container":{"type":"auto","memory_limit":"64g","TYPE":"cntr_1"}}`},
		{"memory_limit in two spellings", `{"type":"code_interpreter","container":{"type":"auto","memory_limit":"64g","Memory_Limit":"1g"}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := &routeAtkSpy{next: spAtkJSON(spAtkResponse(model, ""))}
			s := spAtkStack(t, up, "")
			body := `{"model":"` + model + `","input":"hi","tools":[` + c.tool + `]}`
			e, served := spAtkServed(t, s, up, "/v1/responses", body)
			if !served {
				return
			}
			if e.ActualCost < 64*containerGBPrice {
				t.Errorf("billed %v; read as the upstream may read it, it creates a 64 GB container, %v",
					e.ActualCost, 64*containerGBPrice)
			}
		})
	}
}

// TestSpendPathAttackAnthropicSearchToolTwoSpellings: an Anthropic web
// search tool reserves max_uses searches before the request is forwarded
// ($10 per 1,000), so that a tenant's limits hold what its searches may
// cost. The README: a priced field given in two spellings is 400 (an
// upstream that reads keys exactly would serve the one costgate does not
// price). A tool whose type or max_uses is given in two spellings is
// refused, or reserved as its costlier reading.
func TestSpendPathAttackAnthropicSearchToolTwoSpellings(t *testing.T) {
	const model = "claude-sonnet-4-5"
	const uses = 1000
	answer := `{"id":"msg_1","type":"message","role":"assistant","model":"` + model + `","content":[{"type":"text","text":"Hi"}],` +
		`"stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":2}}`
	cases := []struct{ name, tool string }{
		{"type in two spellings", fmt.Sprintf(`{"type":"web_search_20250305","name":"web_search","max_uses":%d,"Type":"custom","input_schema":{"type":"object"}}`, uses)},
		{"max_uses in two spellings", fmt.Sprintf(`{"type":"web_search_20250305","name":"web_search","max_uses":%d,"Max_Uses":1}`, uses)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := &routeAtkSpy{next: spAtkJSON(answer)}
			s := spAtkStack(t, up, "")
			body := `{"model":"` + model + `","max_tokens":10,"messages":[{"role":"user","content":"news?"}],"tools":[` + c.tool + `]}`
			e, served := spAtkServed(t, s, up, "/v1/messages", body)
			if !served {
				return
			}
			if e.EstimatedCost < uses*10_000_000 {
				t.Errorf("reserved %v for a tool the upstream may run %d searches with (%v)",
					e.EstimatedCost, uses, costmodel.NanoUSD(uses*10_000_000))
			}
		})
	}
}

// TestSpendPathAttackProtocolUpgrade: a WebSocket upgrade (the Realtime
// API's, or the Responses API's WebSocket mode) would turn the exchange
// into a tunnel whose frames costgate never reads, carrying costgate's
// credential. Neither a GET upgrade on a priced path nor a POST with
// Upgrade headers gives the client a switched protocol, and no upgrade
// reaches the upstream: costgate asks it for a plain answer.
func TestSpendPathAttackProtocolUpgrade(t *testing.T) {
	var upgraded atomic.Int32
	up := &routeAtkSpy{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"ok":true}`)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		upgraded.Add(1)
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw) // echo until the peer closes
	})}
	s := spAtkStack(t, up, "")
	host := strings.TrimPrefix(s.url, "http://")
	const upgrade = "Authorization: Bearer cg-test-acme\nConnection: Upgrade\nUpgrade: websocket\nSec-WebSocket-Version: 13\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\n"
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/chat/completions"},
		{"POST", "/v1/responses"},
		{"GET", "/v1/responses"},
		{"GET", "/v1/realtime?model=gpt-realtime"},
	} {
		body := routeAtkChatBody
		if c.path == "/v1/responses" {
			body = `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":16}`
		}
		req := fmt.Sprintf("%s %s HTTP/1.1\nHost: %s\nContent-Type: application/json\nContent-Length: %d\n%s\n%s", c.method, c.path, host, len(body), upgrade, body)
		got := sendRaw(t, s.url, req)
		if got.status == http.StatusSwitchingProtocols {
			t.Errorf("%s %s with Upgrade: the client got a switched protocol", c.method, c.path)
		}
	}
	if n := upgraded.Load(); n != 0 {
		t.Errorf("%d upgrade requests reached the upstream and were answered 101 there", n)
	}
	for _, e := range routeAtkEntries(t, s, "acme") {
		if e.Status == ledger.StatusReserved {
			t.Errorf("entry %s left reserved", e.RequestID)
		}
	}
}

// spAtkServed POSTs body to path on s. A 400 is a refusal, which must not
// have reached up: served is false. Otherwise the answer must be 200, and
// e is the request's settled entry.
func spAtkServed(t *testing.T, s *stack, up *routeAtkSpy, path, body string) (e ledger.Entry, served bool) {
	t.Helper()
	status, out := spAtkSend(t, s, "POST", path, body)
	if status == http.StatusBadRequest {
		if len(up.take()) != 0 {
			t.Fatal("refused, yet the request reached the upstream")
		}
		return ledger.Entry{}, false
	}
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	return s.settled(t, 1)[0], true
}
