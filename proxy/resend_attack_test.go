package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/cuttest"
)

// perCallStack is a stack whose upstream gen, at url, is a generic API
// that bills $0.001 a call.
func perCallStack(t *testing.T, url string) *stack {
	t.Helper()
	return newStackWith(t, stackOptions{extra: `
  - name: gen
    kind: generic
    base_url: ` + url + `
    cost: {per_call: "0.001"}
` + roomyLimits})
}

// TestResendAtkProxyReplayable: a generic upstream bills $0.001 a call.
// A request net/http's Transport takes for replayable (GET, HEAD, or any
// method with an Idempotency-Key or X-Idempotency-Key header, and no
// body) reaches the upstream on a kept-alive connection, which serves it
// and loses its answer (the connection closes before the status line).
// The Transport sent it again on a new connection, unasked: the upstream
// served the request twice and costgate billed it once, $0.001 for $0.002
// (3 calls served, 2 billed, for each method). What must hold: costgate
// sends a request that may have reached the upstream once; the client is
// answered 502 and the request is charged as the upstream bills it, and
// the upstream serves no more requests than costgate bills. The request
// goes out as it did: no Content-Length or Transfer-Encoding on a GET, a
// HEAD or a DELETE, Content-Length: 0 on a POST, and the key's value
// under its name (in another case: a server reads field names in any).
func TestResendAtkProxyReplayable(t *testing.T) {
	for _, c := range []struct {
		method, header string
	}{
		{http.MethodGet, ""},
		{http.MethodHead, ""},
		{http.MethodPost, "Idempotency-Key"},
		{http.MethodDelete, "X-Idempotency-Key"},
	} {
		t.Run(strings.TrimSpace(c.method+" "+c.header), func(t *testing.T) {
			up := cuttest.New(t, `{"ok":true}`)
			s := perCallStack(t, up.URL())
			send := func() int {
				req, err := http.NewRequest(c.method, s.url+"/u/gen/search?q=x", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer cg-test-acme")
				if c.header != "" {
					req.Header.Set(c.header, "k-1")
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			if st := send(); st != http.StatusOK {
				t.Fatalf("first request: status %d", st)
			}
			// The next request on the kept-alive connection is cut. One
			// that finds no idle connection goes on a new one, answered;
			// the next one then finds it.
			up.Armed.Store(true)
			sent := 1
			for ; sent < 6 && up.Cuts.Load() == 0; sent++ {
				send()
			}
			if up.Cuts.Load() != 1 {
				t.Fatalf("no request was cut in %d", sent)
			}
			es := s.settled(t, sent)
			var billed costmodel.NanoUSD
			for _, e := range es {
				billed += e.ActualCost
			}
			served := up.Served.Load()
			if want := costmodel.NanoUSD(served) * costmodel.Dollar / 1000; billed < want {
				t.Errorf("the upstream served %d calls (%v), costgate billed %v for %d requests", served, want, billed, sent)
			}
			for i, r := range up.Requests() {
				h := r.Header
				cl, te := h.Get("Content-Length"), r.TransferEncoding
				if c.method == http.MethodPost && cl != "0" || c.method != http.MethodPost && cl != "" || len(te) != 0 {
					t.Errorf("request %d went out with Content-Length %q, Transfer-Encoding %q", i, cl, te)
				}
				if c.header != "" && h.Get(c.header) == "" {
					t.Errorf("request %d went out without its %s", i, c.header)
				}
			}
		})
	}
}

// TestResendAtkProxyIdlePool: the Transport sends a replayable request
// again on each kept-alive connection it holds to the upstream, and on a
// new one last. An upstream (its load balancer) that cuts every request
// on a kept-alive connection after running it, as one does a request
// that outlasts its idle timeout, ran one GET once per idle connection
// and once more: with 4 idle connections, 5 runs for 1 request billed,
// 9 calls served and 5 billed in all ($0.005 for $0.009). What must hold:
// the upstream serves no more requests than costgate bills.
func TestResendAtkProxyIdlePool(t *testing.T) {
	const idle = 4
	up := cuttest.New(t, `{"ok":true}`)
	up.Warm = idle
	s := perCallStack(t, up.URL())
	send := func() int {
		req, err := http.NewRequest(http.MethodGet, s.url+"/u/gen/search?q=x", nil)
		if err != nil {
			t.Error(err)
			return 0
		}
		req.Header.Set("Authorization", "Bearer cg-test-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	var wg sync.WaitGroup
	for range idle {
		wg.Go(func() {
			if st := send(); st != http.StatusOK {
				t.Errorf("warm request: status %d", st)
			}
		})
	}
	wg.Wait()
	up.CutAll.Store(true)
	send()
	es := s.settled(t, idle+1)
	var billed costmodel.NanoUSD
	for _, e := range es {
		billed += e.ActualCost
	}
	served := up.Served.Load()
	if want := costmodel.NanoUSD(served) * costmodel.Dollar / 1000; billed < want {
		t.Errorf("the upstream served %d calls (%v, %d cut), costgate billed %v for %d requests", served, want, up.Cuts.Load(), billed, idle+1)
	}
}

// TestResendRedirectIsTheAnswer: an upstream's 307 (which would have an
// http.Client send the request, body and all, to another URL) is the
// client's answer: costgate does not follow it, so the upstream serves
// one request for the one billed, and the client sees the redirect.
func TestResendRedirectIsTheAnswer(t *testing.T) {
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Location", "/elsewhere")
		w.WriteHeader(http.StatusTemporaryRedirect)
	}))
	defer up.Close()
	s := perCallStack(t, up.URL)
	req, err := http.NewRequest(http.MethodPost, s.url+"/u/gen/run", strings.NewReader(`{"q":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	e := s.settled(t, 1)[0]
	if resp.StatusCode != http.StatusTemporaryRedirect || calls.Load() != 1 || e.ActualCost != costmodel.Dollar/1000 {
		t.Errorf("status %d, %d upstream calls, charged %v: want the 307, 1 call, $0.001", resp.StatusCode, calls.Load(), e.ActualCost)
	}
}
