package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestSettleAtkRunningResponsesAnswer: the reserve API settles from the
// upstream's raw answer, "its usage read as the proxy reads it". A
// Responses request run in the background is answered at once, queued or
// in progress, with a usage of zeros: the run, billed later, is not over.
// The proxy charges such an answer its output limit
// (TestStreamAtkBackgroundZeroUsage); a settlement with it charged $0, so
// that a caller who settles with the answer it got (client.SettleResponse)
// paid nothing for a run the upstream bills in full. The settlement is
// refused, as one of an answer without usage is: the reservation stays
// open for the run's final answer, or is charged its estimate at expiry.
func TestSettleAtkRunningResponsesAnswer(t *testing.T) {
	const reserveBody = `{"model":"o3","background":true,"max_output_tokens":20000,"input":"think hard"}`
	for _, status := range []string{"queued", "in_progress"} {
		t.Run(status, func(t *testing.T) {
			s := newStackWith(t, stackOptions{policies: allowAll, extra: "\ncosts:\n  output_reserve: 10\n" + roomyLimits})
			h := s.srv.Handler()
			id := reserveOn(t, s, "cg-test-acme", `{"kind":"responses","body":`+reserveBody+`}`)
			running := fmt.Sprintf(`{"id":"resp_1","object":"response","status":%q,"background":true,"model":"o3-2025-04-16","output":[],"usage":{"input_tokens":0,"output_tokens":0,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":0}}`, status)
			code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle",
				`{"reservation_id":"`+id+`","kind":"responses","response":`+running+`}`)
			floor := estimator(t).Cost("o3", costmodel.Usage{OutputTokens: 20000})
			switch code {
			case http.StatusOK:
				if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) < floor {
					t.Fatalf("a %s answer settled at %v; its run may bill up to 20000 output tokens (%v)", status, costmodel.NanoUSD(got), floor)
				}
				return
			case http.StatusBadRequest:
			default:
				t.Fatalf("settle: %d %v", code, out)
			}
			// Refused: the run's final answer settles it.
			done := `{"id":"resp_1","object":"response","status":"completed","model":"o3-2025-04-16","output":[],"usage":{"input_tokens":12,"output_tokens":15000,"output_tokens_details":{"reasoning_tokens":14000},"total_tokens":15012}}`
			code, out = reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle",
				`{"reservation_id":"`+id+`","kind":"responses","response":`+done+`}`)
			if code != http.StatusOK {
				t.Fatalf("settle with the final answer: %d %v", code, out)
			}
			want := estimator(t).Cost("o3", costmodel.Usage{InputTokens: 12, OutputTokens: 15000, ReasoningTokens: 14000})
			if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) != want {
				t.Errorf("the final answer settled at %v, want %v", costmodel.NanoUSD(got), want)
			}
		})
	}
}
