package client_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/costgate/costgate/client"
)

// TestClientAtkAnswerStatesNoUnits: the API bills the call 40 credits and
// reports them in its JSON answer (units_used), unless the caller asks
// for the answer in a form that leaves the report out: another format
// (?format=csv) or some fields only (?fields=results). The Transport read
// such an answer whole, found no units and settled the estimate, 2
// credits for 40 billed. What must hold: an answer that states no units
// is settled as one whose report cannot be read, at Actual.Max, as the
// proxy charges it.
func TestClientAtkAnswerStatesNoUnits(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		switch q := r.URL.Query(); {
		case q.Get("format") == "csv":
			w.Header().Set("Content-Type", "text/csv")
			io.WriteString(w, "id,title\n1,a\n2,b\n")
		case q.Get("fields") == "results":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"results":["a","b"]}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"results":["a","b"],"units_used":40}`)
		}
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRuleUpTo(50), Settled: ends.hook}}
	for i, c := range []struct {
		query string
		want  int64
	}{
		{"", 40},
		{"&format=csv", 50},
		{"&fields=results", 50},
	} {
		resp, err := hc.Get(api + "/search?count=2" + c.query)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		n, sts, errs := ends.snapshot()
		if n != i+1 || errs[i] != nil || sts[i] == nil {
			t.Fatalf("%q: Settled %d times, %v", c.query, n, errs)
		}
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if e.Actual.Units != c.want || e.ActualCost != creditsCost(c.want) {
			t.Errorf("%q: ledger %d units %v, want %d (%v); the API billed 40", c.query, e.Actual.Units, e.ActualCost, c.want, creditsCost(c.want))
		}
	}
}
