package client_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
)

// cutAPI is a raw HTTP/1.1 metered API on loopback that serves, and
// bills, every request it reads whole, answering {"units_used":1}. Once
// armed, it reads the next request that comes on a kept-alive connection
// (one that carried a request before), counts it as served, and closes
// the connection without answering: the answer of a call the API ran is
// lost, as a load balancer's cut or the API's restart loses it.
type cutAPI struct {
	ln     net.Listener
	armed  atomic.Bool
	served atomic.Int64 // requests read whole, the cut one included
	cuts   atomic.Int64 // requests read whole and left unanswered
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
	heads []http.Header // each request's header, as read, in order
	tes   [][]string    // each request's transfer codings
}

func newCutAPI(t *testing.T) *cutAPI {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &cutAPI{ln: ln, conns: map[net.Conn]bool{}}
	a.wg.Add(1)
	go a.accept()
	t.Cleanup(func() {
		ln.Close()
		a.mu.Lock()
		for c := range a.conns {
			c.Close()
		}
		a.mu.Unlock()
		a.wg.Wait()
	})
	return a
}

func (a *cutAPI) url() string { return "http://" + a.ln.Addr().String() }

func (a *cutAPI) accept() {
	defer a.wg.Done()
	for {
		c, err := a.ln.Accept()
		if err != nil {
			return
		}
		a.mu.Lock()
		a.conns[c] = true
		a.mu.Unlock()
		a.wg.Add(1)
		go a.serve(c)
	}
}

func (a *cutAPI) serve(c net.Conn) {
	defer a.wg.Done()
	defer func() {
		a.mu.Lock()
		delete(a.conns, c)
		a.mu.Unlock()
		c.Close()
	}()
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		a.served.Add(1)
		a.mu.Lock()
		a.heads = append(a.heads, req.Header)
		a.tes = append(a.tes, req.TransferEncoding)
		a.mu.Unlock()
		if n > 0 && a.armed.CompareAndSwap(true, false) {
			a.cuts.Add(1)
			return
		}
		const answer = `{"units_used":1}`
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(answer))
		if req.Method != http.MethodHead {
			io.WriteString(c, answer)
		}
	}
}

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
			api := newCutAPI(t)
			var ends attackEnds
			base := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(base.CloseIdleConnections)
			hc := &http.Client{Transport: &client.Transport{Base: base, Client: s.client("cg-test-acme"), Rule: c.rule, Settled: ends.hook}}
			send := func() error {
				var body io.Reader
				if c.body != "" {
					body = bytes.NewReader([]byte(c.body))
				}
				req, err := http.NewRequest(c.method, api.url()+"/search?count=1", body)
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
			api.armed.Store(true)
			sent := 1
			for ; sent < 6 && api.cuts.Load() == 0; sent++ {
				send()
			}
			if api.cuts.Load() != 1 {
				t.Fatalf("no call was cut in %d", sent)
			}
			es := waitFinal(t, s)
			var billed costmodel.NanoUSD
			for _, e := range es {
				billed += e.ActualCost
			}
			served := api.served.Load()
			if want := costmodel.NanoUSD(served) * creditsCost(1); len(es) != sent || billed < want {
				t.Errorf("the API served %d calls (%v), costgate billed %v in %d entries for %d calls", served, want, billed, len(es), sent)
			}
			api.mu.Lock()
			defer api.mu.Unlock()
			for i, h := range api.heads {
				cl, te := h.Get("Content-Length"), api.tes[i]
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
