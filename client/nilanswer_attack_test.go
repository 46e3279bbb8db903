package client_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/ledger"
)

// TestClientAtkBaseAnswersNothing: the Transport's Base is a hand-written
// RoundTripper (a test double, a mesh's wrapper) that breaks the
// RoundTripper contract as http.Client tolerates: it answers with no body
// (http.Client reads a nil Body as empty, and refuses one whose
// Content-Length promised bytes), or with neither a response nor an error
// (http.Client answers an error). Each time the metered API was called
// and served 2 credits, reported in its JSON body and, but for the second
// call, in X-Units. The Transport panicked on the nil Body or
// response, which http.Client does not recover: the program died and
// the reservation was left to expire. What must hold: no panic; an
// answer with no body and no length is settled by its header (X-Units:
// 2); one whose length promised a body that never came is charged as a
// cut answer, the most its rule lets it report (Actual.Max, 30), and so
// is a call answered with nothing; each reservation ends once.
func TestClientAtkBaseAnswersNothing(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("header") != "" {
			w.Header().Set("X-Units", "2")
		}
		io.WriteString(w, `{"units_used":2}`)
	})
	for _, c := range []struct {
		name    string
		query   string
		answer  func(resp *http.Response) *http.Response
		wantErr bool
		want    int64
	}{
		{"nil body", "&header=1", func(resp *http.Response) *http.Response {
			resp.Body, resp.ContentLength = nil, -1
			return resp
		}, false, 2},
		{"nil body, length promised", "", func(resp *http.Response) *http.Response {
			resp.Body, resp.ContentLength = nil, 2
			return resp
		}, true, 30},
		{"nil response", "&header=1", func(*http.Response) *http.Response { return nil }, true, 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := http.DefaultTransport.RoundTrip(r)
				if err != nil {
					return nil, err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return c.answer(resp), nil
			})
			var ends attackEnds
			hc := &http.Client{Transport: &client.Transport{Base: base, Client: s.client("cg-test-acme"), Rule: creditsRuleUpTo(30), Settled: ends.hook}}
			var resp *http.Response
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("the Transport panicked: %v", p)
					}
				}()
				resp, err = hc.Get(api + "/search?count=5" + c.query)
			}()
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				if rerr != nil || len(b) != 0 {
					t.Errorf("the caller read %q, %v; want an empty body", b, rerr)
				}
			}
			if (err != nil) != c.wantErr {
				t.Errorf("err %v, want an error: %v", err, c.wantErr)
			}
			n, sts, errs := ends.snapshot()
			if n != 1 || errs[0] != nil || sts[0] == nil {
				t.Fatalf("Settled %d times, %v", n, errs)
			}
			e := s.entry(t, "acme", sts[0].RequestID, final)
			if e.Status != ledger.StatusSettled || e.Actual.Units != c.want || e.ActualCost != creditsCost(c.want) {
				t.Errorf("ledger %s %d units %v, want settled at %d (%v)", e.Status, e.Actual.Units, e.ActualCost, c.want, creditsCost(c.want))
			}
		})
	}
}
