package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
)

// searchAPI is a metered search API: GET /search?q=...&count=N (or a JSON
// body {"count":N}) returns min(N, 7) results and reports them in
// "units_used"; /missing is a 404; /big returns a body of ?size bytes with
// the units in the X-Units header.
type searchAPI struct {
	calls atomic.Int64
	url   string
	// block, when set, holds each call until the request's context ends,
	// after a send on started.
	block   atomic.Bool
	started chan struct{}
}

func newSearchAPI(t *testing.T) *searchAPI {
	t.Helper()
	s := &searchAPI{started: make(chan struct{}, 1)}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *searchAPI) serve(w http.ResponseWriter, r *http.Request) {
	s.calls.Add(1)
	if s.block.Load() {
		s.started <- struct{}{}
		<-r.Context().Done()
		return
	}
	switch r.URL.Path {
	case "/search":
		n, _ := strconv.Atoi(r.URL.Query().Get("count"))
		if r.Method == http.MethodPost {
			var body struct{ Count int }
			json.NewDecoder(r.Body).Decode(&body)
			n = body.Count
		}
		n = min(n, 7)
		results := make([]string, n)
		for i := range results {
			results[i] = "result " + strconv.Itoa(i+1)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"query": r.URL.Query().Get("q"), "results": results, "units_used": n})
	case "/big":
		size, _ := strconv.Atoi(r.URL.Query().Get("size"))
		w.Header().Set("X-Units", "3")
		w.Write(bytes.Repeat([]byte("x"), size))
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":"not found","units_used":9}`))
	}
}

// searchRule reads the units asked for from ?count or {"count"}, and the
// units used from the answer's "units_used" or its X-Units header.
var searchRule = costmodel.Rule{
	Unit:    "results",
	PerCall: costmodel.Dollar / 1000,  // $0.001
	PerUnit: costmodel.Dollar / 10000, // $0.0001
	Units:   &costmodel.Source{Query: "count", JSON: "count", Default: 10, Max: 50},
	Actual:  &costmodel.Source{JSON: "units_used", Header: "X-Units"},
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

func cost(m map[string]any, key string) map[string]any {
	c, _ := m[key].(map[string]any)
	return c
}

func TestTransport(t *testing.T) {
	ctx := context.Background()
	type settled struct {
		s   *client.Settlement
		err error
	}
	setup := func(t *testing.T, upstream string) (*fakeCostgate, *searchAPI, *http.Client, *[]settled) {
		f := newFakeCostgate(t)
		api := newSearchAPI(t)
		var reports []settled
		tr := &client.Transport{
			Client: client.New(f.url, "cg-key"), Rule: searchRule, Upstream: upstream, Route: "search.web",
			Settled: func(_ *http.Request, s *client.Settlement, err error) { reports = append(reports, settled{s, err}) },
		}
		return f, api, &http.Client{Transport: tr}, &reports
	}

	t.Run("reserves what the request asks, settles what the answer reports", func(t *testing.T) {
		f, api, hc, reports := setup(t, "search")
		req, _ := http.NewRequestWithContext(ctx, "GET", api.url+"/search?q=go&count=20", nil)
		req.Header.Set("X-Api-Key", "search-secret")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Results   []string
			UnitsUsed int `json:"units_used"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(got.Results) != 7 || got.UnitsUsed != 7 {
			t.Errorf("the caller read %+v", got)
		}
		reserves, settles, releases := f.calls()
		if len(reserves) != 1 || len(settles) != 1 || len(releases) != 0 {
			t.Fatalf("reserves %v settles %v releases %v", reserves, settles, releases)
		}
		if c := cost(reserves[0], "cost"); num(c["units"]) != 20 || num(c["requests"]) != 1 || c["usd"] != nil ||
			reserves[0]["upstream"] != "search" || reserves[0]["route"] != "search.web" {
			t.Errorf("reserved %v: want 20 units, 1 request, no usd (the upstream prices)", reserves[0])
		}
		if u := cost(settles[0], "usage"); num(u["units"]) != 7 || u["requests"] != nil || settles[0]["status"] != nil {
			t.Errorf("settled %v: want 7 units", settles[0])
		}
		if len(*reports) != 1 || (*reports)[0].err != nil || (*reports)[0].s.Cost != 123_000 {
			t.Errorf("Settled hook saw %+v", *reports)
		}
		if req.Header.Get("X-Api-Key") != "search-secret" || len(req.Header) != 1 {
			t.Errorf("the request was modified: %v", req.Header)
		}
	})

	t.Run("without an upstream it prices in dollars by its rule", func(t *testing.T) {
		f, api, hc, _ := setup(t, "")
		body := `{"count":5}`
		req, _ := http.NewRequestWithContext(ctx, "POST", api.url+"/search", strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"units_used":5`) {
			t.Errorf("the API did not get the body: %s", b)
		}
		reserves, settles, _ := f.calls()
		if c := cost(reserves[0], "cost"); num(c["units"]) != 5 || c["usd"] != "0.0015" || reserves[0]["upstream"] != nil {
			t.Errorf("reserved %v: want 5 units at $0.0015", reserves[0])
		}
		if u := cost(settles[0], "usage"); num(u["units"]) != 5 || u["usd"] != "0.0015" {
			t.Errorf("settled %v", settles[0])
		}
	})

	t.Run("refused: the API is not called", func(t *testing.T) {
		for _, status := range []int{429, 402} {
			f, api, hc, reports := setup(t, "search")
			f.setRefuse(status)
			body := &closeCounter{Reader: strings.NewReader(`{}`)}
			req, _ := http.NewRequestWithContext(ctx, "POST", api.url+"/search?count=3", body)
			_, err := hc.Do(req)
			var refused *client.RefusedError
			if !errors.As(err, &refused) || refused.Status != status {
				t.Fatalf("error %v, want a refusal %d", err, status)
			}
			if status == 429 && (!errors.Is(err, client.ErrRateLimited) || refused.RetryAfter.Milliseconds() != 6500 || refused.Code != "calls" || refused.RateLimit == "") {
				t.Errorf("429: %+v", refused)
			}
			if status == 402 && (!errors.Is(err, client.ErrBudgetExceeded) || refused.Policy != "budgets") {
				t.Errorf("402: %+v", refused)
			}
			if api.calls.Load() != 0 {
				t.Error("the API was called")
			}
			if body.closed.Load() != 1 {
				t.Errorf("request body closed %d times, want once", body.closed.Load())
			}
			if len(*reports) != 0 {
				t.Errorf("a refused call was reported settled: %v", *reports)
			}
		}
	})

	t.Run("an error answer is settled as failed, with no units", func(t *testing.T) {
		f, api, hc, _ := setup(t, "search")
		resp, err := hc.Get(api.url + "/missing?count=4")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || !strings.Contains(string(b), "not found") {
			t.Errorf("answer %d %s", resp.StatusCode, b)
		}
		_, settles, _ := f.calls()
		if u := cost(settles[0], "usage"); settles[0]["status"] != "failed" || u["units"] != nil || u["usd"] != "0" {
			t.Errorf("settled %v, want failed, free, with no units", settles[0])
		}
	})

	t.Run("no answer: released", func(t *testing.T) {
		f, _, hc, reports := setup(t, "search")
		dead := httptest.NewServer(http.NotFoundHandler())
		dead.Close()
		if _, err := hc.Get(dead.URL + "/search?count=2"); err == nil {
			t.Fatal("no error from a closed server")
		}
		_, settles, releases := f.calls()
		if len(settles) != 0 || len(releases) != 1 || releases[0] != "rsv_1" {
			t.Errorf("settles %v releases %v, want rsv_1 released", settles, releases)
		}
		if len(*reports) != 1 || (*reports)[0].s != nil || (*reports)[0].err != nil {
			t.Errorf("Settled hook saw %+v", *reports)
		}
	})

	t.Run("the answer cut after the request reached the API: settled at the estimate", func(t *testing.T) {
		f, _, hc, reports := setup(t, "search")
		cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // served, and billed, but never answered
			}
		}))
		defer cut.Close()
		if _, err := hc.Get(cut.URL + "/search?count=20"); err == nil {
			t.Fatal("no error from a cut answer")
		}
		_, settles, releases := f.calls()
		if len(releases) != 0 || len(settles) != 1 || num(cost(settles[0], "usage")["units"]) != 20 {
			t.Errorf("settles %v releases %v, want rsv_1 settled at its 20 units", settles, releases)
		}
		if len(*reports) != 1 || (*reports)[0].s == nil || (*reports)[0].err != nil {
			t.Errorf("Settled hook saw %+v", *reports)
		}
	})

	t.Run("a call cancelled while the API works is settled at the estimate and ends with its context", func(t *testing.T) {
		f, api, hc, _ := setup(t, "search")
		api.block.Store(true)
		cctx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(cctx, "GET", api.url+"/search?count=2", nil)
		done := make(chan error)
		go func() {
			_, err := hc.Do(req)
			done <- err
		}()
		select {
		case <-api.started:
		case err := <-done:
			t.Fatalf("ended before the API got it: %v", err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("error %v, want context.Canceled", err)
		}
		if _, settles, releases := f.calls(); len(releases) != 0 || len(settles) != 1 || num(cost(settles[0], "usage")["units"]) != 2 {
			t.Errorf("settles %v releases %v, want one settled at its 2 units", settles, releases)
		}
	})

	t.Run("a body over the bound is settled by its header and passed on whole", func(t *testing.T) {
		f, api, hc, _ := setup(t, "search")
		hc.Transport.(*client.Transport).MaxBody = 1000
		resp, err := hc.Get(api.url + "/big?size=5000&count=4")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if len(b) != 5000 {
			t.Errorf("the caller read %d bytes, want 5000", len(b))
		}
		_, settles, _ := f.calls()
		if u := cost(settles[0], "usage"); num(u["units"]) != 3 {
			t.Errorf("settled %v, want the header's 3 units", settles[0])
		}
	})

	t.Run("a request body over the bound is refused before reserving", func(t *testing.T) {
		f, api, hc, _ := setup(t, "search")
		hc.Transport.(*client.Transport).MaxBody = 10
		_, err := hc.Post(api.url+"/search", "application/json", strings.NewReader(`{"count": 3, "pad": "................"}`))
		if err == nil || !strings.Contains(err.Error(), "over 10 bytes") {
			t.Errorf("error %v", err)
		}
		if reserves, _, _ := f.calls(); len(reserves) != 0 || api.calls.Load() != 0 {
			t.Errorf("reserved %d, called %d", len(reserves), api.calls.Load())
		}
	})

	t.Run("a request the rule cannot read is an error", func(t *testing.T) {
		_, api, hc, _ := setup(t, "search")
		_, err := hc.Post(api.url+"/search", "application/json", strings.NewReader(`{not json`))
		var bad *costmodel.BadRequestError
		if !errors.As(err, &bad) {
			t.Errorf("error %v, want a *costmodel.BadRequestError", err)
		}
	})

	t.Run("no client", func(t *testing.T) {
		api := newSearchAPI(t)
		hc := &http.Client{Transport: &client.Transport{Rule: searchRule}}
		if _, err := hc.Get(api.url + "/search"); err == nil || api.calls.Load() != 0 {
			t.Errorf("error %v, calls %d", err, api.calls.Load())
		}
	})
}

// closeCounter is a request body that counts its Close calls.
type closeCounter struct {
	io.Reader
	closed atomic.Int64
}

func (c *closeCounter) Close() error { c.closed.Add(1); return nil }

// BenchmarkTransport is a gated call on loopback: reserve, the call, and
// settle, against the fake costgate, in parallel.
func BenchmarkTransport(b *testing.B) {
	f := &fakeCostgate{state: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/costgate/reserve", f.reserve)
	mux.HandleFunc("POST /v1/costgate/settle", f.settle)
	cg := httptest.NewServer(mux)
	defer cg.Close()
	api := &searchAPI{started: make(chan struct{}, 1)}
	srv := httptest.NewServer(http.HandlerFunc(api.serve))
	defer srv.Close()
	hc := &http.Client{Transport: &client.Transport{Client: client.New(cg.URL, "cg-key"), Rule: searchRule, Upstream: "search"}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := hc.Get(srv.URL + "/search?q=go&count=5")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
