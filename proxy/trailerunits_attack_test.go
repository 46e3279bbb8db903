package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBillAtkGenericUnitsInTrailer: a generic upstream reports the units a
// call cost in a header its rule reads, sent as a trailer once the answer
// is written (as a server that knows the cost only at the end does; the
// client gets it, ReverseProxy copies trailers). costgate read the header
// alone and charged the estimate, 1 credit, where the upstream bills 40.
// A trailer is read as the header it names is, and one beside the header
// is that header given twice: charged the actual's max.
func TestBillAtkGenericUnitsInTrailer(t *testing.T) {
	const credits = "40"
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("also") == "header" {
			w.Header().Set("X-Credits-Used", "1")
		}
		w.Header().Set("Trailer", "X-Credits-Used")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"content":"<html>small</html>"}`)
		w.Header().Set("X-Credits-Used", credits)
	})
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	rule := strings.Replace(billAtkGeneric(srv.URL), "actual: {json: credits_used, max: 100}", "actual: {header: X-Credits-Used, max: 100}", 1)
	for _, q := range []string{"", "also=header"} {
		t.Run("trailer"+q, func(t *testing.T) {
			s := newStackWith(t, stackOptions{policies: allowAll, extra: rule})
			req, _ := http.NewRequest(http.MethodGet, s.url+"/u/scrape/fetch?"+q, nil)
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			e := billAtkEntry(t, s, resp.Header.Get("X-Request-Id"))
			if e.Actual.Units < 40 {
				t.Errorf("charged %d credits (%v); the upstream reported %s in its trailer (the client got %q)", e.Actual.Units, e.ActualCost, credits, resp.Trailer.Get("X-Credits-Used"))
			}
		})
	}
}
