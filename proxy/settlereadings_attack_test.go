package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestSettleAtkTwoReadingsOfOneAnswer: a settlement with an upstream's
// raw answer is read once, as the proxy reads it: its usage and model by
// ParseResponse, whose members match in any case and spelling. Two other
// checks read the same answer another way: whether a Responses run is
// over read the first "status" member, in its exact spelling, and the
// API an answer names was read by encoding/json, which takes the last
// "object". A background run's answer with two statuses ("completed",
// then "in_progress"), or one spelled "Status", was read as over and
// settled at its zeros ($0.000002 for a run that may bill 20,000 output
// tokens, $0.88); a Responses answer with two objects ("response", then
// "chat.completion") settled as a chat completion lost its web searches.
// What must hold: any member that says the run is not over refuses the
// settlement, and any member that names another API than the kind
// settled refuses it; an answer read as over and of its kind is charged
// no less than what it states.
func TestSettleAtkTwoReadingsOfOneAnswer(t *testing.T) {
	const acme = "cg-test-acme"
	const reserveBody = `{"model":"o3","background":true,"max_output_tokens":20000,"input":"think hard"}`
	usage := `"usage":{"input_tokens":0,"output_tokens":0,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":0}`
	running := []struct{ name, answer string }{
		{"two statuses, the first over", `{"id":"resp_1","object":"response","status":"completed","status":"in_progress","model":"o3","output":[],` + usage + `}`},
		{"two statuses, the last over", `{"id":"resp_1","object":"response","status":"queued","status":"completed","model":"o3","output":[],` + usage + `}`},
		{"status in another case", `{"id":"resp_1","object":"response","Status":"in_progress","model":"o3","output":[],` + usage + `}`},
		{"status escaped", `{"id":"resp_1","object":"response","st\u0061tus":"in_progress","model":"o3","output":[],` + usage + `}`},
		{"a status that is no string first", `{"id":"resp_1","object":"response","status":1,"status":"in_progress","model":"o3","output":[],` + usage + `}`},
	}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: "\ncosts:\n  output_reserve: 10\n" + roomyLimits})
	h := s.srv.Handler()
	floor := estimator(t).Cost("o3", costmodel.Usage{OutputTokens: 20000})
	for _, tc := range running {
		t.Run(tc.name, func(t *testing.T) {
			id := reserveOn(t, s, acme, `{"kind":"responses","body":`+reserveBody+`}`)
			code, out := reserveCall(t, h, acme, "/v1/costgate/settle",
				`{"reservation_id":"`+id+`","kind":"responses","response":`+tc.answer+`}`)
			switch code {
			case http.StatusBadRequest:
			case http.StatusOK:
				if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) < floor {
					t.Fatalf("an answer one reading takes for a running one settled at %v; its run may bill %v", costmodel.NanoUSD(got), floor)
				}
			default:
				t.Fatalf("settle: %d %v", code, out)
			}
		})
	}
	t.Run("two objects", func(t *testing.T) {
		answer := `{"id":"resp_2","object":"response","object":"chat.completion","status":"completed","model":"gpt-4o-mini",` +
			`"output":[{"type":"web_search_call","id":"ws_1","status":"completed"},{"type":"web_search_call","id":"ws_2","status":"completed"},` +
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}],` +
			`"usage":{"prompt_tokens":40,"completion_tokens":10,"input_tokens":40,"output_tokens":10,"total_tokens":50}}`
		u, err := costmodel.ParseUsage(costmodel.Responses, []byte(answer))
		if err != nil || u.WebSearchRequests != 2 {
			t.Fatalf("read as a Responses answer: %+v, %v; the case needs its 2 searches", u, err)
		}
		want := estimator(t).Cost("gpt-4o-mini", u)
		id := reserveOn(t, s, acme, `{"cost":{"tokens":1000},"model":"gpt-4o-mini"}`)
		code, out := reserveCall(t, h, acme, "/v1/costgate/settle",
			fmt.Sprintf(`{"reservation_id":%q,"kind":"chat_completions","response":%s}`, id, answer))
		switch code {
		case http.StatusBadRequest:
		case http.StatusOK:
			if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) < want {
				t.Fatalf("a Responses answer that also names a chat completion settled as one at %v; as the answer it is, %v", costmodel.NanoUSD(got), want)
			}
		default:
			t.Fatalf("settle: %d %v", code, out)
		}
	})
}
