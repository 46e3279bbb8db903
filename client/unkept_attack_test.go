package client_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/client"
)

// TestClientAtkUnkeptAnswerBillsTheActualMax: the API reports the units it
// billed in an answer the Transport does not keep whole as one JSON
// document: one longer than MaxBody (many results), or a stream of
// server-sent events. The Transport settled the estimate, 2 credits, for
// 40 billed, where the proxy charges such an answer on a generic route
// the most its rule lets it report (Actual.Max), as it charges an LLM
// answer it cannot read its output limit. What must hold: the Transport
// charges such an answer as the proxy does, unless its header reports the
// units; a stream that is one JSON document (a server that ignored the
// stream) is read as one.
func TestClientAtkUnkeptAnswerBillsTheActualMax(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("as") {
		case "long":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"units_used":40,"results":["%s"]}`, strings.Repeat("r", 4000))
		case "long-header":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Units", "5")
			fmt.Fprintf(w, `{"units_used":5,"results":["%s"]}`, strings.Repeat("r", 4000))
		case "stream":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"result\":\"a\"}\n\ndata: {\"units_used\":40}\n\n")
		case "json-stream":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, ` {"units_used":6}`)
		}
	})
	rule := creditsRuleUpTo(30)
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: rule, MaxBody: 1000, Settled: ends.hook}}
	for i, c := range []struct {
		as   string
		want int64
	}{
		{"long", 30},
		{"long-header", 5},
		{"stream", 30},
		{"json-stream", 6},
	} {
		resp, err := hc.Get(api + "/search?count=2&as=" + c.as)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if c.as == "long" && len(b) < 4000 {
			t.Errorf("%s: the caller read %d bytes, want the whole answer", c.as, len(b))
		}
		n, sts, errs := ends.snapshot()
		if n != i+1 || errs[i] != nil || sts[i] == nil {
			t.Fatalf("%s: Settled %d times, %v", c.as, n, errs)
		}
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if e.Actual.Units != c.want || e.ActualCost != creditsCost(c.want) {
			t.Errorf("%s answer: ledger %d units %v, want %d (%v)", c.as, e.Actual.Units, e.ActualCost, c.want, creditsCost(c.want))
		}
	}
}
