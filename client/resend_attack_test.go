package client_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/cuttest"
)

// TestResendAtkTransportReplayable: the API bills each call it serves
// ($0.0011 for 1 credit). A call net/http's Transport (the Base, here a
// clone of http.DefaultTransport) takes for replayable (a GET, or a POST
// with an Idempotency-Key whose body it can rewind: http.NewRequest's
// bytes.Reader, or the body the Transport read for its rule) reaches the
// API on a kept-alive connection, which serves it and loses its answer.
// The Base sent it again on a new connection within the one RoundTrip:
// one reservation, settled once, for two calls served (3 served, 2
// billed, $0.0022 for $0.0033). What must hold: the Transport has Base
// send a call that may have reached the API once; the caller gets the
// error and the reservation is settled as a call with no answer, and the
// API serves no more calls than are billed. The call goes out as it did:
// no Content-Length or Transfer-Encoding on a GET, its length on a POST,
// and the key under its name (in another case: a server reads field
// names in any).
func TestResendAtkTransportReplayable(t *testing.T) {
	queryRule := creditsRule
	queryRule.Units = &costmodel.Source{Query: "count", Default: 10, Max: 50}
	for _, c := range []struct {
		name   string
		method string
		body   string
		rule   costmodel.Rule
	}{
		{"GET", http.MethodGet, "", creditsRule},
		{"POST body read by the rule", http.MethodPost, `{"count":1}`, creditsRule},
		{"POST body unread", http.MethodPost, `{"count":1}`, queryRule},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, "memory", "", nil)
			api := cuttest.New(t, `{"units_used":1}`)
			var ends attackEnds
			base := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(base.CloseIdleConnections)
			hc := &http.Client{Transport: &client.Transport{Base: base, Client: s.client("cg-test-acme"), Rule: c.rule, Settled: ends.hook}}
			send := func() error {
				var body io.Reader
				if c.body != "" {
					body = bytes.NewReader([]byte(c.body))
				}
				req, err := http.NewRequest(c.method, api.URL()+"/search?count=1", body)
				if err != nil {
					t.Fatal(err)
				}
				if c.body != "" {
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", "k-1")
				}
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return nil
			}
			if err := send(); err != nil {
				t.Fatalf("first call: %v", err)
			}
			api.Armed.Store(true)
			sent := 1
			for ; sent < 6 && api.Cuts.Load() == 0; sent++ {
				send()
			}
			if api.Cuts.Load() != 1 {
				t.Fatalf("no call was cut in %d", sent)
			}
			es := waitFinal(t, s)
			var billed costmodel.NanoUSD
			for _, e := range es {
				billed += e.ActualCost
			}
			served := api.Served.Load()
			if want := costmodel.NanoUSD(served) * creditsCost(1); len(es) != sent || billed < want {
				t.Errorf("the API served %d calls (%v), costgate billed %v in %d entries for %d calls", served, want, billed, len(es), sent)
			}
			for i, r := range api.Requests() {
				h := r.Header
				cl, te := h.Get("Content-Length"), r.TransferEncoding
				if c.body == "" && cl != "" || c.body != "" && cl != fmt.Sprint(len(c.body)) || len(te) != 0 {
					t.Errorf("call %d went out with Content-Length %q, Transfer-Encoding %q", i, cl, te)
				}
				if c.body != "" && h.Get("Idempotency-Key") != "k-1" {
					t.Errorf("call %d went out without its Idempotency-Key: %v", i, h)
				}
			}
		})
	}
}
