package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestSettleCountsAtkFileSearchesOffTheBill: a settlement with counts
// cannot say the searches a call made, so the searches its reservation
// holds are charged with them (TestSettleAnswerAtkChatSearchIsCharged).
// A Responses request with a file_search tool reserves its file searches
// ($2.50 per 1,000 calls) beside its web searches; settled with counts,
// its web searches were charged and its file searches dropped, on the
// replica that made the reservation and on another. What must hold: the
// counts are charged every search the reservation holds, web and file.
func TestSettleCountsAtkFileSearchesOffTheBill(t *testing.T) {
	const acme = "cg-test-acme"
	body := `{"model":"gpt-4o-mini","input":"What do my files say?","max_output_tokens":100,` +
		`"tools":[{"type":"file_search","vector_store_ids":["vs_1"]},{"type":"web_search"}]}`
	est, err := estimator(t).Estimate(costmodel.Responses, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	reserved := est.Usage
	if reserved.FileSearchCalls == 0 || reserved.WebSearchRequests == 0 {
		t.Fatalf("the request reserves %d file and %d web searches; the attack needs both", reserved.FileSearchCalls, reserved.WebSearchRequests)
	}
	want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 20, OutputTokens: 30,
		WebSearchRequests: reserved.WebSearchRequests, FileSearchCalls: reserved.FileSearchCalls})
	a, b := replicaPair(t, "")
	for _, on := range []*stack{a, b} {
		where := "the replica that made it"
		if on == b {
			where = "another replica"
		}
		id := reserveOn(t, a, acme, `{"kind":"responses","body":`+body+`}`)
		code, out := reserveCall(t, on.srv.Handler(), acme, "/v1/costgate/settle",
			fmt.Sprintf(`{"reservation_id":%q,"usage":{"input_tokens":20,"output_tokens":30}}`, id))
		if code != http.StatusOK {
			t.Fatalf("on %s, settle: %d %v", where, code, out)
		}
		if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) != want {
			t.Errorf("on %s, settled with counts: charged %v; want %v, its %d web and %d file searches reserved",
				where, costmodel.NanoUSD(got), want, reserved.WebSearchRequests, reserved.FileSearchCalls)
		}
	}
}
