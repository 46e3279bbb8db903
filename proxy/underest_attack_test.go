package proxy_test

// Attacks of a tenant whose requests reserve far less than the upstream
// then bills: a small body that names server-side state (a stored
// response, a conversation, a stored prompt), hosted tools the upstream
// calls as often as it likes, prompt-cache writes billed above the input
// rate. The tenant holds as many such requests in flight as costgate
// admits, against a dollar budget; the stub upstream answers them all at
// once with the usage the provider would report. The README bounds what a
// budget can be exceeded by: "the in-flight requests' actual cost beyond
// their estimates (with output_reserve: 100, only input tokens costgate
// cannot count)", and parts costgate cannot count are reserved at an upper
// bound (costmodel/parts.go). So, with output_reserve 100, a reservation
// must cover what the upstream bills, and the settled spend of the
// admitted requests stays within the budget.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// ueHeld is a stub upstream that holds every request until release is
// closed, then answers answer as JSON.
type ueHeld struct {
	arrived chan struct{}
	release chan struct{}
	answer  string
	n       atomic.Int64
}

func (u *ueHeld) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.n.Add(1)
	u.arrived <- struct{}{}
	<-u.release
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, u.answer)
}

// ueResult is what one attack did: the requests admitted and in flight at
// once, what they reserved and what the upstream billed, in all.
type ueResult struct {
	admitted          int
	refusedWith       int // the status of the first refusal; 0: none before maxInFlight
	reserved, settled costmodel.NanoUSD
}

func (r ueResult) String() string {
	return fmt.Sprintf("%d admitted in flight (refusal %d), reserved %v, settled %v", r.admitted, r.refusedWith, r.reserved, r.settled)
}

// ueAttack sends body to path with acme's key, one request after another,
// each held at the upstream, until costgate refuses one or maxInFlight are
// in flight; then the upstream answers them all with answer, and the
// settled ledger entries are summed. acme has a daily budget of budget
// dollars; costs is more of the config (a costs: section), or "".
func ueAttack(t *testing.T, budget, costs, path, body, answer string, maxInFlight int) ueResult {
	t.Helper()
	up := &ueHeld{arrived: make(chan struct{}, maxInFlight+1), release: make(chan struct{}), answer: answer}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	released := false
	release := func() {
		if !released {
			released = true
			close(up.release)
		}
	}
	t.Cleanup(release)
	extra := roomyLimits + fmt.Sprintf("budgets:\n  - name: acme-daily\n    scope: tenant\n    amount: %q\n", budget) + costs
	s := newStackWith(t, stackOptions{extra: extra, policies: allowAll, upstream: up, upstreamURL: ts.URL})
	// The stored answer the Responses requests continue is the tenant's own.
	if err := s.srv.Gate().OwnObject(t.Context(), "acme", "resp_0123456789abcdef"); err != nil {
		t.Fatal(err)
	}

	type answered struct {
		status int
		body   string
	}
	var wg sync.WaitGroup
	var res ueResult
	for res.admitted < maxInFlight {
		done := make(chan answered, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", s.url+path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			req.Header.Set("X-Api-Key", "cg-test-acme")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- answered{status: -1, body: err.Error()}
				return
			}
			defer resp.Body.Close()
			var b strings.Builder
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				b.Write(buf[:n])
				if err != nil {
					break
				}
			}
			done <- answered{status: resp.StatusCode, body: b.String()}
		}()
		select {
		case <-up.arrived:
			res.admitted++
			continue
		case a := <-done:
			if a.status == http.StatusOK {
				t.Fatalf("request answered before the upstream was released: %s", a.body)
			}
			if a.status != http.StatusPaymentRequired && a.status != http.StatusBadRequest {
				t.Fatalf("request %d: %d %s", res.admitted+1, a.status, a.body)
			}
			res.refusedWith = a.status
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d neither reached the upstream nor was answered", res.admitted+1)
		}
		break
	}
	release()
	wg.Wait()
	for _, e := range s.settled(t, res.admitted) {
		res.reserved += e.EstimatedCost
		res.settled += e.ActualCost
	}
	return res
}

// ueUSD parses a dollar amount of a budget.
func ueUSD(t *testing.T, s string) costmodel.NanoUSD {
	t.Helper()
	v, err := costmodel.ParseUSD(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ueResponse is a completed Responses answer of model with the output items
// items before its message, and the given usage.
func ueResponse(model, items string, in, cached, out int64) string {
	return fmt.Sprintf(`{"id":"resp_2","object":"response","status":"completed","model":%q,"service_tier":"default","output":[%s`+
		`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],`+
		`"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}`,
		model, items, in, cached, out, in+out)
}

// ueCheck fails the test when the admitted requests were billed more than
// the budget: their reservations, taken from the budget before they were
// forwarded, did not cover what the upstream billed.
func ueCheck(t *testing.T, budget costmodel.NanoUSD, r ueResult) {
	t.Helper()
	t.Logf("budget %v: %v", budget, r)
	if r.settled > budget {
		t.Errorf("the tenant spent %v against a budget of %v (%.1fx; %d requests reserved %v in all, %v each): "+
			"the reservation does not cover what the upstream bills, and the over-admission grows with the requests in flight",
			r.settled, budget, float64(r.settled)/float64(budget), r.admitted, r.reserved, r.reserved/costmodel.NanoUSD(max(r.admitted, 1)))
	}
}

// TestUnderEstAttackStoredContext: a Responses request that names
// server-side state (previous_response_id, a conversation, a stored prompt
// by id, an item_reference) is a body of a few dozen bytes, but OpenAI
// bills the stored context as input tokens: a conversation grown to 250,000
// tokens (under gpt-4.1's 1M window) makes each such request cost $0.50.
// costgate reserves only the tokens in the body (about 20), so a tenant
// with a $2 budget and 20 requests in flight is billed $10; with more in
// flight, more: the over-admission is unbounded and the README's bound
// names only "input tokens costgate cannot count" without a size. What
// must hold: a reference to stored context is reserved at an upper bound,
// as a document by file id is (docMaxTokens, 300,000 tokens), so that the
// admitted requests stay within the budget.
func TestUnderEstAttackStoredContext(t *testing.T) {
	const (
		model   = "gpt-4.1" // $2.00 per million input tokens, $8.00 output
		stored  = 250_000   // the stored context OpenAI bills as input
		budget  = "2.00"
		inFight = 20
	)
	answer := ueResponse(model, "", stored+10, 0, 16)
	for _, c := range []struct{ name, field string }{
		{"previous_response_id", `"previous_response_id":"resp_0123456789abcdef"`},
		{"conversation", `"conversation":"conv_0123456789abcdef"`},
		{"stored prompt", `"prompt":{"id":"pmpt_0123456789abcdef","version":"2"}`},
		{"item_reference", `"input":[{"type":"item_reference","id":"msg_0123456789abcdef"},{"role":"user","content":"and?"}]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"model":%q,%s,"max_output_tokens":16}`, model, c.field)
			if !strings.Contains(c.field, `"input"`) {
				body = fmt.Sprintf(`{"model":%q,%s,"input":"and?","max_output_tokens":16}`, model, c.field)
			}
			ueCheck(t, ueUSD(t, budget), ueAttack(t, budget, "", "/v1/responses", body, answer, inFight))
		})
	}
}

// TestUnderEstAttackHostedToolCalls: a Responses request with the
// web_search tool lets the model search as often as it likes (no
// max_tool_calls), and OpenAI bills every web_search_call ($25 per 1,000
// on gpt-4.1-mini); file_search calls are billed per call too ($2.50 per
// 1,000). costgate reserves one web search and no file search, even when
// the request sets max_tool_calls itself, while the Anthropic route
// reserves a web search tool's max_uses (10 without one). What must hold: a
// hosted tool's calls are reserved up to the request's max_tool_calls, or
// a documented default when it sets none, so that the admitted requests
// stay within the budget.
func TestUnderEstAttackHostedToolCalls(t *testing.T) {
	const model = "gpt-4.1-mini"
	web := strings.Repeat(`{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"q"}},`, 8)
	files := strings.Repeat(`{"type":"file_search_call","id":"fs_1","status":"completed","queries":["q"],"results":null},`, 8)
	for _, c := range []struct{ name, tools, items string }{
		{"web_search, no max_tool_calls", `"tools":[{"type":"web_search"}]`, web},
		{"web_search, max_tool_calls 8", `"tools":[{"type":"web_search"}],"max_tool_calls":8`, web},
		{"file_search, max_tool_calls 8", `"tools":[{"type":"file_search","vector_store_ids":["vs_1"]}],"max_tool_calls":8`, files},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"model":%q,"input":"news?",%s,"max_output_tokens":16}`, model, c.tools)
			const budget = "0.20"
			ueCheck(t, ueUSD(t, budget), ueAttack(t, budget, "", "/v1/responses", body, ueResponse(model, c.items, 20, 0, 16), 20))
		})
	}
}

// TestUnderEstAttackAnthropicCacheWrites: an Anthropic request that marks
// its prompt with cache_control is billed its cache writes at 1.25 times
// the input rate (5-minute cache) or twice it ("ttl": "1h"). costgate counts
// these tokens (they are in the body) but reserves them at the input rate,
// so each such request overruns its reservation by up to its whole input
// cost (the 5/4 margin of the Claude token approximation hides part of a
// 5-minute write): with output_reserve 100 the README allows only input
// tokens costgate cannot count beyond the estimates. Against $1, 13
// requests in flight were billed $1.08 (5m) and $1.72 (1h). What must hold: a prompt
// with cache_control is reserved at the cache-write rate of its ttl (the
// input up to the last breakpoint), so the admitted requests stay within
// the budget.
func TestUnderEstAttackAnthropicCacheWrites(t *testing.T) {
	const model = "claude-sonnet-4-5" // $3 input, $3.75 5-minute writes, $6 1-hour writes, $15 output
	system := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 2000)
	for _, c := range []struct {
		name, ttl string
		oneHour   bool
	}{{"5m", "", false}, {"1h", `,"ttl":"1h"`, true}} {
		t.Run(c.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"model":%q,"max_tokens":16,"system":[{"type":"text","text":%q,"cache_control":{"type":"ephemeral"%s}}],"messages":[{"role":"user","content":"hi"}]}`,
				model, system, c.ttl)
			// What the upstream bills: the system prompt written to the
			// cache. costgate counts it 25,009 (o200k's 20,007 times 5/4,
			// an upper bound of Claude's count); Claude's tokenizer gives
			// English about a tenth more tokens than o200k.
			const written = 22_000
			h5, h1 := written, 0
			if c.oneHour {
				h5, h1 = 0, written
			}
			answer := fmt.Sprintf(`{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn",`+
				`"usage":{"input_tokens":5,"cache_creation_input_tokens":%d,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":%d,"ephemeral_1h_input_tokens":%d},"output_tokens":16}}`,
				model, written, h5, h1)
			const budget = "1.00"
			ueCheck(t, ueUSD(t, budget), ueAttack(t, budget, "", "/v1/messages", body, answer, 40))
		})
	}
}

// TestUnderEstAttackChatAudioByID: a chat message may name a previous
// answer's audio by id ({"role": "assistant", "audio": {"id": ...}}):
// OpenAI bills it as audio input tokens ($40 per million on
// gpt-4o-audio-preview), up to the model's maximum output (16,384 tokens)
// per reference, none of it in the body. costgate reserves nothing for it,
// so a request of 300 bytes naming three answers of 12,000 audio tokens is
// billed $1.44 on a reservation of $0.0002. What must hold: each audio
// reference is reserved at its upper bound, the model's maximum output in
// audio tokens, so that the admitted requests stay within the budget.
func TestUnderEstAttackChatAudioByID(t *testing.T) {
	const model = "gpt-4o-audio-preview"
	ref := `{"role":"assistant","audio":{"id":"audio_0123456789abcdef"}},{"role":"user","content":"again"},`
	body := fmt.Sprintf(`{"model":%q,"modalities":["text"],"max_tokens":16,"messages":[%s{"role":"user","content":"and?"}]}`, model, strings.Repeat(ref, 3))
	const audio = 3 * 12_000
	answer := fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":%d,"completion_tokens":16,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":%d},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0}}}`,
		model, audio+30, audio+46, audio)
	const budget = "2.00"
	ueCheck(t, ueUSD(t, budget), ueAttack(t, budget, "", "/v1/chat/completions", body, answer, 20))
}

// TestUnderEstAttackBoundedPartsHold: parts whose size is not in the
// request are reserved at their upper bound, so a tenant holding many in
// flight stays within its budget: a Responses file by id (300,000 tokens
// reserved; the upstream bills 200,000), an image by URL (the most tiles;
// the upstream bills them), a reasoning model with no max_output_tokens
// (the model's maximum output reserved; the upstream bills 90,000
// reasoning tokens), and a background response (its whole output limit).
func TestUnderEstAttackBoundedPartsHold(t *testing.T) {
	reasoning := func(model string, in, out int64) string {
		return strings.Replace(ueResponse(model, "", in, 0, out), `"reasoning_tokens":0`, fmt.Sprintf(`"reasoning_tokens":%d`, out-2), 1)
	}
	for _, c := range []struct{ name, budget, body, answer string }{
		{"input_file by file_id", "2.00",
			`{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-abc"},{"type":"input_text","text":"summarize"}]}],"max_output_tokens":16}`,
			ueResponse("gpt-4.1", "", 200_000, 0, 16)},
		{"input_image by URL", "0.05",
			`{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://example.com/huge.png"},{"type":"input_text","text":"what?"}]}],"max_output_tokens":16}`,
			ueResponse("gpt-4.1", "", 85+170*8+12, 0, 16)},
		{"o3 without max_output_tokens", "20.00",
			`{"model":"o3","input":"prove it","reasoning":{"effort":"high"}}`,
			reasoning("o3", 10, 90_000)},
		{"background", "2.00",
			`{"model":"gpt-4.1","input":"write","background":true}`,
			ueResponse("gpt-4.1", "", 10, 0, 32_000)},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := ueAttack(t, c.budget, "", "/v1/responses", c.body, c.answer, 40)
			if r.refusedWith == 0 {
				t.Fatalf("the budget never refused: the attack did not reach it (%v)", r)
			}
			ueCheck(t, ueUSD(t, c.budget), r)
		})
	}
}

// TestUnderEstAttackToolContentAsInput: hosted tools bring content into
// the prompt that the upstream bills as input tokens, none of it in the
// request: Anthropic's web search results (each search adds thousands of
// tokens of results), a web_fetch of a page or a PDF (up to the context
// window, unless the tool sets max_content_tokens), and the tool list an
// OpenAI Responses mcp tool imports from its server. costgate reserves the
// searches' fees (Anthropic: max_uses) and nothing for the content, so a
// request of 300 bytes is billed 40,000 to 150,000 input tokens beyond its
// reservation, per request in flight. What must hold: such content is
// reserved at a documented upper bound (per search, per fetch: the tool's
// max_content_tokens or a default; per mcp tool), so that the admitted
// requests stay within the budget.
func TestUnderEstAttackToolContentAsInput(t *testing.T) {
	const claude = "claude-sonnet-4-5"
	anthropicAnswer := func(in, searches int64) string {
		return fmt.Sprintf(`{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn",`+
			`"usage":{"input_tokens":%d,"output_tokens":16,"server_tool_use":{"web_search_requests":%d}}}`, claude, in, searches)
	}
	for _, c := range []struct{ name, path, body, answer string }{
		{"anthropic web_search results", "/v1/messages",
			fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"news?"}],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}]}`, claude),
			anthropicAnswer(40_000, 5)},
		{"anthropic web_fetch", "/v1/messages",
			fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"read https://example.com/big.pdf"}],"tools":[{"type":"web_fetch_20250910","name":"web_fetch","max_uses":1}]}`, claude),
			anthropicAnswer(150_000, 0)},
		{"responses mcp tool list", "/v1/responses",
			`{"model":"gpt-4.1","input":"go","tools":[{"type":"mcp","server_label":"big","server_url":"https://mcp.example.com/sse","require_approval":"never"}],"max_output_tokens":16}`,
			ueResponse("gpt-4.1", `{"type":"mcp_list_tools","id":"mcpl_1","server_label":"big","tools":[]},`, 60_000, 0, 16)},
	} {
		t.Run(c.name, func(t *testing.T) {
			const budget = "1.00"
			ueCheck(t, ueUSD(t, budget), ueAttack(t, budget, "", c.path, c.body, c.answer, 20))
		})
	}
}
