package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestSettleAnswerAtkChatSearchIsCharged: a chat completion that searches
// the web (web_search_options, or a -search-preview model) is billed per
// request for the search, and its answer's usage never reports it: the
// proxy charges the search its request asked for. A tenant that reserves
// such a request through the reserve API, estimated from its body
// (which reserves the search), and settles it with the upstream's own
// raw answer (kind and response) was charged its tokens alone: $0.025 of
// search a request off the bill, at the table's gpt-4o-mini price. What
// must hold: settled from its answer, the call is charged as the proxy
// charges the same request and answer.
func TestSettleAnswerAtkChatSearchIsCharged(t *testing.T) {
	const answer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"It is sunny."},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":20,"completion_tokens":30,"total_tokens":50}}`
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	})
	s := newStackWith(t, stackOptions{upstream: up, policies: allowAll, extra: roomyLimits})
	const acme = "cg-test-acme"
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Weather in Paris?"}],"web_search_options":{},"max_tokens":100}`

	// Through the proxy.
	resp := s.postAs(t, acme, "/v1/chat/completions", body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("proxied: %d", resp.StatusCode)
	}
	proxied := s.settled(t, 1)[0]

	want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 20, OutputTokens: 30, WebSearchRequests: 1})
	if proxied.ActualCost != want || proxied.Actual.WebSearchRequests != 1 {
		t.Fatalf("the proxy charged %v for %d searches, want %v for 1", proxied.ActualCost, proxied.Actual.WebSearchRequests, want)
	}

	// Reserved from the same body, settled with the same answer or its
	// counts (which cannot say the search: the one reserved is charged),
	// on the replica that made the reservation or on another.
	a, b := replicaPair(t, "")
	for _, c := range []struct{ name, settle string }{
		{"its answer", `"kind":"chat_completions","response":` + answer},
		{"its counts", `"usage":{"input_tokens":20,"output_tokens":30}`},
	} {
		for _, on := range []*stack{a, b} {
			id := reserveOn(t, a, acme, `{"kind":"chat_completions","body":`+body+`}`)
			code, out := reserveCall(t, on.srv.Handler(), acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,%s}`, id, c.settle))
			if code != http.StatusOK {
				t.Fatalf("settle: %d %v", code, out)
			}
			where := "the replica that made it"
			if on == b {
				where = "another replica"
			}
			if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) != want {
				t.Errorf("settled with %s on %s: charged %v; the proxy charges %v, its search included",
					c.name, where, costmodel.NanoUSD(got), want)
			}
		}
	}
}

// TestSettleAnswerReportedSearchesAreRead: a Responses request that may
// search is reserved for several searches (its calls times its search
// tools); its answer reports the searches it made, which are what it is
// charged when it is settled with that answer, on either replica: the
// reserved searches are a chat completion's charge alone, whose answer
// never reports one.
func TestSettleAnswerReportedSearchesAreRead(t *testing.T) {
	const answer = `{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"gpt-4o-mini",` +
		`"output":[{"type":"web_search_call","id":"ws_1","status":"completed"},` +
		`{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Sunny."}]}],` +
		`"usage":{"input_tokens":20,"output_tokens":30,"total_tokens":50}}`
	const acme = "cg-test-acme"
	body := `{"model":"gpt-4o-mini","input":"Weather in Paris?","tools":[{"type":"web_search"}],"max_output_tokens":100}`
	want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 20, OutputTokens: 30, WebSearchRequests: 1})
	a, b := replicaPair(t, "")
	for _, on := range []*stack{a, b} {
		id := reserveOn(t, a, acme, `{"kind":"responses","body":`+body+`}`)
		code, out := reserveCall(t, on.srv.Handler(), acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"kind":"responses","response":%s}`, id, answer))
		if code != http.StatusOK {
			t.Fatalf("settle: %d %v", code, out)
		}
		if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) != want {
			t.Errorf("settled with its answer of one search: charged %v, want %v", costmodel.NanoUSD(got), want)
		}
	}
}
