package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestTransportSettlesWhatItPriced: a Transport that prices the calls
// itself (no Upstream) settles what its rule prices the answer's units at,
// $0 included: a call that used no unit is not charged its estimate.
func TestTransportSettlesWhatItPriced(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		s := newStack(t, store, "", nil)
		// The API reports the units it served in X-Units: ?served=N.
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Units", r.URL.Query().Get("served"))
			io.WriteString(w, "ok")
		}))
		t.Cleanup(api.Close)
		var got []*client.Settlement
		hc := &http.Client{Transport: &client.Transport{
			Client: s.client("cg-test-acme"),
			Rule: costmodel.Rule{Unit: "results", PerUnit: costmodel.Dollar / 1000,
				Units: &costmodel.Source{Query: "count"}, Actual: &costmodel.Source{Header: "X-Units"}},
			Settled: func(_ *http.Request, st *client.Settlement, err error) {
				if err != nil {
					t.Errorf("settle: %v", err)
				}
				got = append(got, st)
			},
		}}
		for i, served := range []int64{0, 3} {
			resp, err := hc.Get(api.URL + "/search?count=5&served=" + strconv.FormatInt(served, 10))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := costmodel.NanoUSD(served) * milli
			e := s.entry(t, "acme", got[i].RequestID, final)
			if e.Status != ledger.StatusSettled || e.ActualCost != want || got[i].Cost != want || e.EstimatedCost != 5*milli {
				t.Errorf("%d units served of 5 reserved: ledger %s %v (estimate %v), settlement %s; want %v",
					served, e.Status, e.ActualCost, e.EstimatedCost, show(got[i]), want)
			}
		}
	})
}

// cancelAfterAnswer is a RoundTripper that cancels the caller's context as
// soon as costgate's answer to a reserve call arrives, and then, as
// http.Transport does when a cancellation races an answer, drops the
// answer of a request whose context has ended: the caller gives up while
// the answer is on its way.
type cancelAfterAnswer struct {
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (c *cancelAfterAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.URL.Path, "/reserve") {
		return resp, err
	}
	c.mu.Lock()
	c.cancel()
	c.mu.Unlock()
	if err := req.Context().Err(); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// TestReserveCancelledWhileAnswered: a caller whose context ends while
// costgate answers its reserve never sees the reservation's id. The
// reservation is released, not left to expire and be charged its
// estimate: the whole budget is free again.
func TestReserveCancelledWhileAnswered(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		s := newStack(t, store, `
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.01"
`, nil)
		rt := &cancelAfterAnswer{}
		c := client.New(s.url, "cg-test-acme", client.WithHTTPClient(&http.Client{Transport: rt}))
		for range 5 {
			ctx, cancel := context.WithCancel(context.Background())
			rt.mu.Lock()
			rt.cancel = cancel
			rt.mu.Unlock()
			r, err := c.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{USD: 2 * milli}})
			switch {
			case err == nil:
				r.Release(context.Background()) // the caller has it: its own to end
			case !errors.Is(err, context.Canceled):
				t.Fatalf("reserve: %v, want context.Canceled", err)
			}
			cancel()
		}
		// Every reservation ends (released, failed at $0) within moments.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			open := 0
			for _, e := range s.entries(t, "acme") {
				if !e.Status.Final() || e.ActualCost != 0 {
					open++
				}
			}
			if open == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d reservations of a cancelled caller are still held or charged", open)
			}
		}
		r, err := s.client("cg-test-acme").Reserve(context.Background(), client.ReserveRequest{Cost: client.Cost{USD: 10 * milli}})
		if err != nil {
			t.Fatalf("reserving the whole budget: %v", err)
		}
		r.Release(context.Background())
	})
}

// flaky is a RoundTripper to costgate that fails the first call to a path
// ending in path: before sending it (the connection was refused) or, with
// after, once costgate has answered (the answer was lost).
type flaky struct {
	path  string
	after bool

	mu     sync.Mutex
	failed bool
}

func (f *flaky) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	fail := !f.failed && strings.HasSuffix(req.URL.Path, f.path)
	f.failed = f.failed || fail
	f.mu.Unlock()
	if !fail {
		return http.DefaultTransport.RoundTrip(req)
	}
	if f.after {
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	} else if req.Body != nil {
		req.Body.Close()
	}
	return nil, errors.New("connection reset by peer")
}

// TestTransportEndsDespiteAFault: a settle or a release that a network
// fault loses, before or after costgate saw it, is made again: the
// reservation ends as the call did (settled at the units served, or
// released), instead of being held until it expires and is charged its
// estimate.
func TestTransportEndsDespiteAFault(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		s := newStack(t, store, "", nil)
		for _, tc := range []struct {
			name, path string
			after      bool
		}{
			{"settle refused", "/settle", false},
			{"settle answer lost", "/settle", true},
			{"release refused", "/release", false},
			{"release answer lost", "/release", true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cg := client.New(s.url, "cg-test-acme", client.WithHTTPClient(&http.Client{Transport: &flaky{path: tc.path, after: tc.after}}))
				var settled *client.Settlement
				var endErr error
				var ended int
				hc := &http.Client{Transport: &client.Transport{
					Client: cg, Rule: searchRule, Upstream: "search",
					Settled: func(_ *http.Request, st *client.Settlement, err error) { settled, endErr, ended = st, err, ended+1 },
				}}
				url := s.api.url + "/search?q=go&count=20"
				if tc.path == "/release" {
					url = "http://127.0.0.1:1/search?count=20" // nobody listens: no answer, released
				}
				seen := map[string]bool{}
				for _, e := range s.entries(t, "acme") {
					seen[e.RequestID] = true
				}
				resp, err := hc.Get(url)
				if err == nil {
					resp.Body.Close()
				}
				if ended != 1 || endErr != nil {
					t.Fatalf("Settled hook called %d times, last with %v; want once, no error", ended, endErr)
				}
				var id string
				for _, e := range s.entries(t, "acme") {
					if !seen[e.RequestID] {
						id = e.RequestID
					}
				}
				want, status := 17*milli/10, ledger.StatusSettled // 7 results served: $0.001 + 7 × $0.0001
				if tc.path == "/release" {
					want, status = 0, ledger.StatusFailed
				}
				e := s.entry(t, "acme", id, final)
				if e.Status != status || e.ActualCost != want || (settled != nil && settled.Cost != want) {
					t.Errorf("ledger %s %v, settlement %s; want %s %v", e.Status, e.ActualCost, show(settled), status, want)
				}
			})
		}
	})
}
