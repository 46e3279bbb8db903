package client_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// The attacks on the Transport run a real costgate (newStack, in-memory
// store and embedded ledger) and a metered API stub on loopback.

// creditsRule is a metered API that bills what it reports: the request
// states the credits it expects in ?count (the estimate), the answer the
// credits it spent in "units_used" or X-Units, which may be more.
var creditsRule = costmodel.Rule{
	Unit:    "credits",
	PerCall: costmodel.Dollar / 1000,  // $0.001
	PerUnit: costmodel.Dollar / 10000, // $0.0001
	Units:   &costmodel.Source{Query: "count", JSON: "count", Default: 10, Max: 50},
	Actual:  &costmodel.Source{JSON: "units_used", Header: "X-Units"},
}

// creditsCost is what creditsRule charges for n credits.
func creditsCost(n int64) costmodel.NanoUSD {
	return costmodel.Dollar/1000 + costmodel.NanoUSD(n)*costmodel.Dollar/10000
}

// attackEnds records the Settled hook's calls.
type attackEnds struct {
	mu    sync.Mutex
	sts   []*client.Settlement
	errs  []error
	calls int
}

func (a *attackEnds) hook(_ *http.Request, st *client.Settlement, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	a.sts = append(a.sts, st)
	a.errs = append(a.errs, err)
}

func (a *attackEnds) snapshot() (int, []*client.Settlement, []error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls, append([]*client.Settlement(nil), a.sts...), append([]error(nil), a.errs...)
}

// meteredStub starts a metered API whose handler is h, counting its calls.
func meteredStub(t *testing.T, h http.HandlerFunc) (string, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &calls
}

// waitFinal waits up to 10 s for every ledger entry of acme to be final
// and returns them.
func waitFinal(t *testing.T, s *stack) []ledger.Entry {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		es := s.entries(t, "acme")
		open := 0
		for _, e := range es {
			if !e.Status.Final() {
				open++
			}
		}
		if open == 0 {
			return es
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d reservations still held: %+v", open, len(es), es)
		}
	}
}

// TestClientAttackGzipAnswer: an application asks the metered API for a
// gzip answer itself (Accept-Encoding: gzip, as many HTTP stacks do), so
// http.Transport hands the compressed bytes through. The API bills 40
// credits for a request that estimated 1. The Transport must settle the
// 40 credits the answer reports, as the proxy does (it drops the client's
// Accept-Encoding and meters the decoded answer), not the estimate: the
// tenant would otherwise pay for 1 credit what the upstream billed 40.
func TestClientAttackGzipAnswer(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := json.Marshal(map[string]any{"results": []string{"a"}, "units_used": 40})
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			zw.Write(body)
			zw.Close()
			return
		}
		w.Write(body)
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRule, Settled: ends.hook}}
	for _, enc := range []string{"", "gzip"} {
		req, _ := http.NewRequest("GET", api+"/search?count=1", nil)
		if enc != "" {
			req.Header.Set("Accept-Encoding", enc)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	n, sts, errs := ends.snapshot()
	if n != 2 || errs[0] != nil || errs[1] != nil {
		t.Fatalf("Settled %d times, errors %v", n, errs)
	}
	for i, enc := range []string{"identity", "gzip"} {
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if want := creditsCost(40); e.ActualCost != want || e.Actual.Units != 40 {
			t.Errorf("%s answer reporting 40 credits (estimate 1): ledger charged %v for %d units, want %v",
				enc, e.ActualCost, e.Actual.Units, want)
		}
	}
}

// TestClientAttackHugeUnits: a metered API reports a usage far beyond what
// a dollar amount can hold (10^14 credits at $0.0001, $10 billion; int64's
// maximum; a float beyond it). The proxy, on its /u/search route, settles
// such an answer at the ledger's largest charge ($9,007,199.254740992).
// Through the Transport, costgate's settle is refused (400: without
// Upstream the Transport sends the saturated "9223372036.854775807" dollars,
// which costgate cannot read; with it, cost_exceeds_limit), the Transport
// gives up, and the reservation stays held for its whole TTL and is then
// charged its estimate, $0.0011. What must hold: the call is settled at
// once and charged what the proxy charges for the same answer.
func TestClientAttackHugeUnits(t *testing.T) {
	reported := []string{"100000000000000", "9223372036854775807", "1e300"}
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		i, _ := strconv.Atoi(r.URL.Query().Get("i"))
		fmt.Fprintf(w, `{"units_used":%s}`, reported[i])
	})
	s := &stack{costgate: startCostgate(t, "memory", fmt.Sprintf(baseYAML, "http://127.0.0.1:1", api), nil)}
	seen := map[string]bool{}
	newEntry := func() ledger.Entry {
		t.Helper()
		var got []ledger.Entry
		for _, e := range s.entries(t, "acme") {
			if !seen[e.RequestID] {
				seen[e.RequestID] = true
				got = append(got, e)
			}
		}
		if len(got) != 1 {
			t.Fatalf("%d new ledger entries", len(got))
		}
		return got[0]
	}
	// What the proxy charges for each answer.
	var proxied []costmodel.NanoUSD
	for i := range reported {
		req, _ := http.NewRequest("GET", s.url+"/u/search/search?count=1&i="+strconv.Itoa(i), nil)
		req.Header.Set("Authorization", "Bearer cg-test-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		waitFinal(t, s)
		proxied = append(proxied, newEntry().ActualCost)
	}
	for _, upstream := range []string{"", "search"} {
		t.Run("upstream="+upstream, func(t *testing.T) {
			var ends attackEnds
			hc := &http.Client{Transport: &client.Transport{
				Client: s.client("cg-test-acme"), Rule: creditsRule, Upstream: upstream, Settled: ends.hook,
			}}
			for i, units := range reported {
				resp, err := hc.Get(api + "/search?count=1&i=" + strconv.Itoa(i))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				_, _, errs := ends.snapshot()
				if errs[i] != nil {
					t.Errorf("units_used %s: the settle failed (%v)", units, errs[i])
				}
				// A reservation left held expires after its TTL at its
				// estimate.
				if e := newEntry(); e.Status != ledger.StatusSettled || e.ActualCost != proxied[i] {
					t.Errorf("units_used %s: ledger %s %v (estimate %v), the proxy charges %v",
						units, e.Status, e.ActualCost, e.EstimatedCost, proxied[i])
				}
			}
		})
	}
}

// throttlingFront is a load balancer in front of costgate that answers
// the first settle or release call 429 with Retry-After: 1 (as a
// rate-limiting gateway or a WAF does), and passes everything else.
type throttlingFront struct {
	url     string
	path    string
	tripped atomic.Bool
}

func newThrottlingFront(t *testing.T, target, path string, jsonBody bool) *throttlingFront {
	t.Helper()
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	f := &throttlingFront{path: path}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, f.path) && f.tripped.CompareAndSwap(false, true) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Retry-After", "1")
			if jsonBody {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				io.WriteString(w, `{"error":{"type":"rate_limit_exceeded","message":"slow down"}}`)
				return
			}
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, "<html>429 Too Many Requests</html>")
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// TestClientAttackSettleThrottled: a gateway in front of costgate answers
// a settle (or a release) 429 with Retry-After: 1 — a "try again later"
// by definition, and one that says costgate never saw the call. The
// Transport takes it as final and gives up after one attempt: the
// reservation stays held until it expires and is charged its estimate
// instead of the units served (or $0 for a call that was not made). What
// must hold: a 429 to a settle or release is retried within the
// Transport's settle deadline, as a 5xx is, and the reservation ends as
// the call did.
func TestClientAttackSettleThrottled(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"units_used":3}`)
	})
	for _, tc := range []struct {
		name, path string
		json       bool
	}{
		{"settle 429 html", "/settle", false},
		{"settle 429 json", "/settle", true},
		{"release 429 html", "/release", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			front := newThrottlingFront(t, s.url, tc.path, tc.json)
			var ends attackEnds
			hc := &http.Client{Transport: &client.Transport{
				Client: client.New(front.url, "cg-test-acme"), Rule: creditsRule, Upstream: "search", Settled: ends.hook,
			}}
			target := api + "/search?count=20"
			if tc.path == "/release" {
				target = "http://127.0.0.1:1/search?count=20" // nobody listens: released
			}
			seen := map[string]bool{}
			for _, e := range s.entries(t, "acme") {
				seen[e.RequestID] = true
			}
			resp, err := hc.Get(target)
			if err == nil {
				resp.Body.Close()
			}
			n, _, errs := ends.snapshot()
			if n != 1 {
				t.Fatalf("Settled called %d times", n)
			}
			if errs[0] != nil {
				t.Errorf("the %s was not retried after a 429: %v", tc.path, errs[0])
			}
			want, status := creditsCost(3), ledger.StatusSettled
			if tc.path == "/release" {
				want, status = 0, ledger.StatusFailed
			}
			for _, e := range s.entries(t, "acme") {
				if !seen[e.RequestID] && (e.Status != status || e.ActualCost != want) {
					t.Errorf("ledger %s %v (it expires at its estimate, %v), want %s %v",
						e.Status, e.ActualCost, e.EstimatedCost, status, want)
				}
			}
		})
	}
}

// TestClientAttackConcurrentBudget: 40 goroutines share one Transport
// against a budget that fits about a quarter of their calls. The API is
// called exactly as many times as reservations were admitted; each call is
// settled once with the units it reported; the ledger total is the sum of
// what the API billed and within the budget; no reservation is left held.
func TestClientAttackConcurrentBudget(t *testing.T) {
	s := newStack(t, "memory", `
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.02"
`, nil)
	var billed atomic.Int64 // nano-dollars the API billed
	api, calls := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("served"), 10, 64)
		billed.Add(int64(creditsCost(n)))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"units_used":%d}`, n)
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRule, Settled: ends.hook}}
	var wg sync.WaitGroup
	var refused, other atomic.Int64
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Get(fmt.Sprintf("%s/x?count=20&served=%d", api, i%7))
			switch {
			case errors.Is(err, client.ErrBudgetExceeded):
				refused.Add(1)
			case err != nil:
				other.Add(1)
				t.Errorf("call %d: %v", i, err)
			default:
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	n, _, errs := ends.snapshot()
	for _, err := range errs {
		if err != nil {
			t.Errorf("settle: %v", err)
		}
	}
	if int64(n) != calls.Load() || int64(n)+refused.Load()+other.Load() != 40 || refused.Load() == 0 {
		t.Errorf("API called %d times, %d settled, %d refused, %d failed", calls.Load(), n, refused.Load(), other.Load())
	}
	var sum costmodel.NanoUSD
	for _, e := range waitFinal(t, s) {
		sum += e.ActualCost
	}
	if sum != costmodel.NanoUSD(billed.Load()) || sum > 20*milli {
		t.Errorf("ledger %v, API billed %v, budget $0.02", sum, costmodel.NanoUSD(billed.Load()))
	}
}

// TestClientAttackRedirectResendsBody: the API answers a POST 307 to
// another path, and http.Client resends the body (GetBody) to it. Each hop
// is one upstream call: both are reserved and settled once, by the body
// each one received, and the caller reads the final answer whole.
func TestClientAttackRedirectResendsBody(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, calls := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Count int64 }
		json.NewDecoder(r.Body).Decode(&in)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/old" {
			w.Header().Set("Location", "/new")
			w.WriteHeader(http.StatusTemporaryRedirect)
			io.WriteString(w, `{"units_used":0}`)
			return
		}
		fmt.Fprintf(w, `{"units_used":%d}`, in.Count)
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRule, Settled: ends.hook}}
	resp, err := hc.Post(api+"/old", "application/json", bytes.NewReader([]byte(`{"count":6}`)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != `{"units_used":6}` || calls.Load() != 2 {
		t.Fatalf("caller read %q after %d calls", body, calls.Load())
	}
	n, sts, errs := ends.snapshot()
	if n != 2 || errs[0] != nil || errs[1] != nil {
		t.Fatalf("Settled %d times: %v", n, errs)
	}
	for i, want := range []int64{0, 6} {
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if e.Actual.Units != want || e.ActualCost != creditsCost(want) || e.EstimatedCost != creditsCost(6) {
			t.Errorf("hop %d: ledger %d units %v (estimate %v), want %d units", i, e.Actual.Units, e.ActualCost, e.EstimatedCost, want)
		}
	}
}

// TestClientAttackCutAndCancelled: the connection is cut in the middle of
// the answer's body, or the caller's context ends while the body is on its
// way, or before any answer. A call that got an answer is settled once
// (by the header's units); one that got none, its request in the API's
// hands, is settled at its estimate (the API may have served and billed
// it, as the proxy charges a request that reached its upstream); RoundTrip
// returns an error and no reservation is left held.
func TestClientAttackCutAndCancelled(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	release := make(chan struct{})
	defer close(release)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/cut":
			w.Header().Set("X-Units", "4")
			w.Header().Set("Content-Length", "1000")
			io.WriteString(w, `{"units_used":`)
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		case "/stall":
			w.Header().Set("X-Units", "5")
			io.WriteString(w, `{"units_used":`)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case "/silent":
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRule, Settled: ends.hook}}
	for i, tc := range []struct {
		path  string
		units int64
		ended bool
	}{{"/cut", 4, true}, {"/stall", 5, true}, {"/silent", 9, true}} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "GET", api+tc.path+"?count=9", nil)
		resp, err := hc.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: no error", tc.path)
		}
		n, sts, errs := ends.snapshot()
		if n != i+1 || errs[i] != nil {
			t.Fatalf("%s: Settled %d times, last error %v", tc.path, n, errs[i])
		}
		if tc.ended != (sts[i] != nil) {
			t.Errorf("%s: settlement %v, want settled=%v", tc.path, show(sts[i]), tc.ended)
		}
		if sts[i] != nil {
			e := s.entry(t, "acme", sts[i].RequestID, final)
			if e.Actual.Units != tc.units || e.ActualCost != creditsCost(tc.units) {
				t.Errorf("%s: ledger %d units %v, want %d", tc.path, e.Actual.Units, e.ActualCost, tc.units)
			}
		}
	}
	for _, e := range waitFinal(t, s) {
		if e.Status == ledger.StatusFailed && e.ActualCost != 0 {
			t.Errorf("released call charged %v", e.ActualCost)
		}
	}
}

// TestClientAttackOddUnits: the API reports units the rule cannot read
// (negative, NaN, a word, given twice, an object's fields) or reads in
// another spelling (a string, a fraction). The unreadable ones settle the
// estimate, never less; the readable ones their value (a fraction rounded
// up); each call is settled once.
func TestClientAttackOddUnits(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	cases := []struct {
		body   string
		header []string
		want   int64
	}{
		{`{"units_used":-5}`, nil, 9},
		{`{"units_used":"NaN"}`, nil, 9},
		{`{"units_used":"lots"}`, nil, 9},
		{`{"units_used":null}`, []string{"2"}, 2},
		{`{"units_used":"3"}`, nil, 3},
		{`{"units_used":2.1}`, nil, 3},
		{`{"units_used":1}`, []string{"1", "30"}, 9},
		{`{"units_used":1}`, []string{"30"}, 30},
	}
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(r.URL.Query().Get("i"))
		for _, h := range cases[i].header {
			w.Header().Add("X-Units", h)
		}
		io.WriteString(w, cases[i].body)
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRule, Settled: ends.hook}}
	for i, tc := range cases {
		resp, err := hc.Get(fmt.Sprintf("%s/x?count=9&i=%d", api, i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		n, sts, errs := ends.snapshot()
		if n != i+1 || errs[i] != nil {
			t.Fatalf("%s %v: Settled %d times, %v", tc.body, tc.header, n, errs[i])
		}
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if e.ActualCost != creditsCost(tc.want) {
			t.Errorf("%s %v: charged %v, want %d units (%v)", tc.body, tc.header, e.ActualCost, tc.want, creditsCost(tc.want))
		}
	}
}

// TestClientAttackHostileCostgate: what answers a reserve call is not
// costgate, or a broken one: an HTML page with 200, a 200 JSON without a
// reservation id, an answer of 2 MiB, a 503 with Retry-After, a 429 with
// a RetryAfter, and one that never answers. The metered API is never
// called, each error says what went wrong, and RoundTrip returns within
// its context.
func TestClientAttackHostileCostgate(t *testing.T) {
	api, calls := meteredStub(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") })
	hang := make(chan struct{})
	cg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Query().Get("mode") {
		case "html":
			io.WriteString(w, "<html>welcome</html>")
		case "noid":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"estimate":{"cost_usd":"1"}}`)
		case "huge":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"reservation_id":"rsv_x","pad":"`+strings.Repeat("a", 2<<20)+`"}`)
		case "503":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(503)
			io.WriteString(w, `{"error":{"type":"unavailable","message":"store down"}}`)
		case "429":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "99999999999999999999")
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"type":"rate_limit_exceeded","code":"rpm","retry_after_ms":-5}}`)
		case "hang":
			<-hang
		}
	}))
	defer cg.Close()
	defer close(hang) // before Close: the abandoned reserve call is still under way
	for _, tc := range []struct {
		mode string
		is   error
		want string
	}{
		{"html", client.ErrNotJSON, "not JSON"},
		{"noid", nil, "no reservation_id"},
		{"huge", client.ErrNotJSON, "over"},
		{"503", client.ErrUnavailable, "store down"},
		{"429", client.ErrRateLimited, "rpm"},
		{"hang", context.DeadlineExceeded, "deadline"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			var ends attackEnds
			// modeTransport tells the fake costgate which answer to give.
			c := client.New(cg.URL, "k", client.WithHTTPClient(&http.Client{Transport: modeTransport(tc.mode)}))
			hc := &http.Client{Transport: &client.Transport{Client: c, Rule: creditsRule, Settled: ends.hook}}
			// Only the hanging costgate needs the deadline; the others
			// answer, the huge one 2 MiB that a machine under load (the
			// race detector, other packages' tests) may take longer than
			// half a second to send.
			timeout, bound := 10*time.Second, 12*time.Second
			if tc.mode == "hang" {
				timeout, bound = 500*time.Millisecond, 3*time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", api+"/x", nil)
			start := time.Now()
			resp, err := hc.Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("admitted by a broken costgate")
			}
			if time.Since(start) > bound {
				t.Errorf("RoundTrip took %v", time.Since(start))
			}
			if (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %v mentioning %q", err, tc.is, tc.want)
			}
			var refused *client.RefusedError
			if errors.As(err, &refused) && (refused.RetryAfter < 0 || refused.RetryAfter > 366*24*time.Hour) {
				t.Errorf("RetryAfter %v", refused.RetryAfter)
			}
			if errors.Is(err, client.ErrRateLimited) && errors.Is(err, client.ErrUnavailable) {
				t.Errorf("%v is both a refusal and an outage", err)
			}
			if n, _, _ := ends.snapshot(); n != 0 || calls.Load() != 0 {
				t.Errorf("Settled %d times, API called %d times", n, calls.Load())
			}
		})
	}
}

// modeTransport adds ?mode= to each call to the fake costgate.
type modeTransport string

func (m modeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.RawQuery = "mode=" + string(m)
	return http.DefaultTransport.RoundTrip(r)
}

// TestClientAttackHeaderUnitsBesideOtherBody: the API reports the units it
// billed in its X-Units header and answers a body that is not JSON (CSV,
// as the caller asked with ?format=csv). The rule reads "units_used" or
// X-Units; the body holding no JSON, the rule errs on the JSON field and
// drops the header too: the call is settled at its estimate, 1 credit, for
// 40 billed. What must hold: a body that is not JSON states no JSON field,
// and the header's units are settled (the proxy reads answers by the same
// rule, so it charges its generic routes the same way).
func TestClientAttackHeaderUnitsBesideOtherBody(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Units", "40")
		w.Header().Set("Content-Type", "text/csv")
		io.WriteString(w, "id,title\n1,a\n")
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRule, Upstream: "search", Settled: ends.hook}}
	resp, err := hc.Get(api + "/search?count=1&format=csv")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, sts, errs := ends.snapshot()
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	e := s.entry(t, "acme", sts[0].RequestID, final)
	if e.Actual.Units != 40 || e.ActualCost != creditsCost(40) {
		t.Errorf("CSV answer with X-Units: 40 (estimate 1): ledger %d units %v, want 40 (%v)", e.Actual.Units, e.ActualCost, creditsCost(40))
	}
}

// TestClientAttackUpgradeAnswer: the API answers 101 Switching Protocols
// (a WebSocket-style upgrade the caller asked for) and keeps the
// connection open. The Transport reads "the whole body" of the answer,
// which is the live connection: RoundTrip must not hang past the caller's
// context, the call must be settled once, and the caller must get a body
// it can write to (net/http's contract for a 101 answer).
func TestClientAttackUpgradeAnswer(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	done := make(chan struct{})
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: metered\r\nConnection: Upgrade\r\nX-Units: 2\r\n\r\n")
		brw.Flush()
		<-done
	})
	defer close(done)
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRule, Settled: ends.hook}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", api+"/stream?count=3", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "metered")
	type result struct {
		resp *http.Response
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := hc.Do(req)
		got <- result{resp, err}
	}()
	var res result
	select {
	case res = <-got:
	case <-time.After(2 * time.Second):
		cancel()
		select {
		case res = <-got:
			t.Errorf("RoundTrip of a 101 answer returned only when its context was cancelled, 2 s later: %v", res.err)
		case <-time.After(2 * time.Second):
			t.Fatalf("RoundTrip of a 101 answer hangs, even past its context")
		}
	}
	if res.err == nil {
		defer res.resp.Body.Close()
		if _, ok := res.resp.Body.(io.ReadWriteCloser); !ok {
			t.Errorf("the 101 answer's body is a %T, not the connection (io.ReadWriteCloser)", res.resp.Body)
		}
	}
	if n, _, errs := ends.snapshot(); n != 1 || errs[0] != nil {
		t.Errorf("Settled %d times: %v", n, errs)
	}
}

// TestClientAttackReserveAnswerUnusable: a gateway in front of costgate
// relabels its JSON answers text/plain (or a broken costgate sends a 200
// the client cannot use). costgate made the reservation; the client
// refuses the answer (ErrNotJSON), the call is not made, and nobody
// releases it: it is held for its TTL and charged its estimate for a call
// that never happened. What must hold: a reservation the client learns
// the id of and cannot use is released (ledger failed, $0).
func TestClientAttackReserveAnswerUnusable(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	u, _ := url.Parse(s.url)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		if strings.HasSuffix(resp.Request.URL.Path, "/reserve") {
			resp.Header.Set("Content-Type", "text/plain")
		}
		return nil
	}
	front := httptest.NewServer(rp)
	defer front.Close()
	api, calls := meteredStub(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"units_used":1}`) })
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: client.New(front.URL, "cg-test-acme"), Rule: creditsRule, Settled: ends.hook}}
	_, err := hc.Get(api + "/x?count=5")
	if !errors.Is(err, client.ErrNotJSON) || calls.Load() != 0 {
		t.Fatalf("err %v, API called %d times; want ErrNotJSON and no call", err, calls.Load())
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		es := s.entries(t, "acme")
		if len(es) != 1 {
			t.Fatalf("%d ledger entries", len(es))
		}
		if e := es[0]; e.Status == ledger.StatusFailed && e.ActualCost == 0 {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the reservation of an unusable answer is left %s; it expires at its estimate %v", e.Status, e.EstimatedCost)
		}
	}
}
