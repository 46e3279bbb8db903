package client_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/costgate/costgate/client"
)

// TestClientAtkCutAnswerBillsTheActualMax: the API serves and bills the
// call, then its answer is cut before the end of the body that reports
// the units (the connection dropped, or the caller's context ended while
// the body was on its way). The Transport settled the estimate, 2 credits
// for 40 billed, where the proxy charges a generic answer cut before its
// end the most its rule lets it report (Actual.Max), and the Transport
// itself charges so a call that got no answer at all. What must hold: an
// answer cut short is settled at Actual.Max, unless its header reports the
// units; RoundTrip still returns the error.
func TestClientAtkCutAnswerBillsTheActualMax(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	release := make(chan struct{})
	defer close(release)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("header") != "" {
			w.Header().Set("X-Units", "5")
		}
		switch r.URL.Query().Get("as") {
		case "cut":
			w.Header().Set("Content-Length", "1000")
			io.WriteString(w, `{"results":["a","b"],`)
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		case "stall":
			io.WriteString(w, `{"results":["a","b"],`)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRuleUpTo(30), Settled: ends.hook}}
	for i, c := range []struct {
		query string
		want  int64
	}{
		{"as=cut", 30},
		{"as=stall", 30},
		{"as=cut&header=1", 5},
		{"as=stall&header=1", 5},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "GET", api+"/search?count=2&"+c.query, nil)
		resp, err := hc.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		cancel()
		if err == nil {
			t.Errorf("%s: no error from a cut answer", c.query)
		}
		n, sts, errs := ends.snapshot()
		if n != i+1 || errs[i] != nil || sts[i] == nil {
			t.Fatalf("%s: Settled %d times, %v", c.query, n, errs)
		}
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if e.Actual.Units != c.want || e.ActualCost != creditsCost(c.want) {
			t.Errorf("%s: ledger %d units %v, want %d (%v)", c.query, e.Actual.Units, e.ActualCost, c.want, creditsCost(c.want))
		}
	}
}
