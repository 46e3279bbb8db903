package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestSettleKindAtkAnswerOfAnotherAPI: a chat completion that searches
// (web_search_options) is reserved with its search, which its answer
// never reports and which a settlement from that answer is charged
// (TestSettleAnswerAtkChatSearchIsCharged). The settlement names the
// answer's API itself (kind), and the answer confirms only the kind it is
// labelled with: a tenant that settled the same call as a completion or a
// Responses answer, the same counts relabelled, was charged its tokens
// alone, the search off the bill, on the replica that made the
// reservation and on another. What must hold: a reservation estimated
// from an LLM body is settled by an answer of that body's API; another
// kind is 400 invalid_kind and leaves the reservation open.
func TestSettleKindAtkAnswerOfAnotherAPI(t *testing.T) {
	const acme = "cg-test-acme"
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Weather in Paris?"}],"web_search_options":{},"max_tokens":100}`
	relabelled := []struct{ kind, answer string }{
		{"completions", `{"id":"cmpl-1","object":"text_completion","created":1,"model":"gpt-4o-mini",` +
			`"choices":[{"index":0,"text":"It is sunny.","finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":20,"completion_tokens":30,"total_tokens":50}}`},
		{"responses", `{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"gpt-4o-mini",` +
			`"output":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"It is sunny."}]}],` +
			`"usage":{"input_tokens":20,"output_tokens":30,"total_tokens":50}}`},
		{"chat_completions", `{"id":"chatcmpl-1","created":1,"model":"gpt-4o-mini",` + // no "object": an answer that says no API
			`"choices":[{"index":0,"message":{"role":"assistant","content":"It is sunny."},"finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":20,"completion_tokens":30,"total_tokens":50}}`},
	}
	want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 20, OutputTokens: 30, WebSearchRequests: 1})
	a, b := replicaPair(t, "")
	for _, on := range []*stack{a, b} {
		where := "the replica that made it"
		if on == b {
			where = "another replica"
		}
		for _, r := range relabelled {
			id := reserveOn(t, a, acme, `{"kind":"chat_completions","body":`+body+`}`)
			code, out := reserveCall(t, on.srv.Handler(), acme, "/v1/costgate/settle",
				fmt.Sprintf(`{"reservation_id":%q,"kind":%q,"response":%s}`, id, r.kind, r.answer))
			switch {
			case r.kind == "chat_completions":
				// The reservation's own API: charged as the proxy charges it.
				if got, _ := out["cost_nanousd"].(float64); code != http.StatusOK || costmodel.NanoUSD(got) != want {
					t.Errorf("on %s, settled as its own API: %d %v; want 200 and %v", where, code, out, want)
				}
				continue
			case code == http.StatusOK:
				got, _ := out["cost_nanousd"].(float64)
				t.Errorf("on %s, a chat completion settled as a %s answer: charged %v; the proxy charges %v, its search included",
					where, r.kind, costmodel.NanoUSD(got), want)
				continue
			case code != http.StatusBadRequest || errCode(out) != "invalid_kind":
				t.Errorf("on %s, settled as a %s answer: %d %v; want 400 invalid_kind", where, r.kind, code, out)
			}
			// Still open: its own answer settles it, search charged.
			code, out = reserveCall(t, on.srv.Handler(), acme, "/v1/costgate/settle",
				fmt.Sprintf(`{"reservation_id":%q,"kind":"chat_completions","response":%s}`, id, relabelled[2].answer))
			if got, _ := out["cost_nanousd"].(float64); code != http.StatusOK || out["already_settled"] != false || costmodel.NanoUSD(got) != want {
				t.Errorf("on %s, its own answer after the refusal: %d %v; want 200, a first settlement, %v", where, code, out, want)
			}
		}
	}
}
