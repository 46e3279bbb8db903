package client_test

import (
	"compress/flate"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/client"
)

// roundTripFunc is an http.RoundTripper of one function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClientAtkCodedAnswerUnderABase: the Transport's Base is a wrapper
// (an SDK's or a service mesh's transport) that asks the API for a
// compressed answer itself after the Transport dropped the caller's
// Accept-Encoding, so http.Transport hands the coded bytes through. The
// API bills 40 credits for a request that estimated 2. The Transport read
// the coded bytes as no JSON and settled the estimate. What must hold: a
// gzip answer is read decoded (40, as TestClientAttackGzipAnswer reads
// one the caller asked for), and one in a coding the Transport cannot
// read (deflate, br) is charged as an answer whose report was not read,
// the most its rule lets it report (Actual.Max, 50); the caller gets the
// answer as the API sent it.
func TestClientAtkCodedAnswerUnderABase(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := json.Marshal(map[string]any{"results": []string{"a"}, "units_used": 40})
		w.Header().Set("Content-Type", "application/json")
		switch ae := r.Header.Get("Accept-Encoding"); {
		case strings.Contains(ae, "gzip"):
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			zw.Write(body)
			zw.Close()
		case strings.Contains(ae, "deflate"):
			w.Header().Set("Content-Encoding", "deflate")
			zw, _ := flate.NewWriter(w, flate.BestSpeed)
			zw.Write(body)
			zw.Close()
		default:
			w.Write(body)
		}
	})
	for _, c := range []struct {
		coding string
		want   int64
	}{
		{"gzip", 40},
		{"deflate", 50},
	} {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Accept-Encoding", c.coding)
			return http.DefaultTransport.RoundTrip(r)
		})
		var ends attackEnds
		hc := &http.Client{Transport: &client.Transport{Base: base, Client: s.client("cg-test-acme"), Rule: creditsRuleUpTo(50), Settled: ends.hook}}
		resp, err := hc.Get(api + "/search?count=2")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.Header.Get("Content-Encoding") != c.coding || len(raw) == 0 || raw[0] == '{' {
			t.Errorf("%s: the caller got %q in %q, want the coded answer", c.coding, raw, resp.Header.Get("Content-Encoding"))
		}
		n, sts, errs := ends.snapshot()
		if n != 1 || errs[0] != nil || sts[0] == nil {
			t.Fatalf("%s: Settled %d times, %v", c.coding, n, errs)
		}
		e := s.entry(t, "acme", sts[0].RequestID, final)
		if e.Actual.Units != c.want || e.ActualCost != creditsCost(c.want) {
			t.Errorf("%s answer reporting 40 credits (estimate 2): ledger %d units %v, want %d", c.coding, e.Actual.Units, e.ActualCost, c.want)
		}
	}
}
