// Package cuttest is a raw HTTP/1.1 server on loopback for tests of what
// a client does when an upstream's answer is lost: it serves, and bills,
// every request it reads whole and, once armed, reads the next request
// that comes on a kept-alive connection (one that carried a request
// before), counts it served, and closes the connection without
// answering, as a load balancer's cut or an upstream's restart loses an
// answer.
package cuttest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// Request is what the server read of one request.
type Request struct {
	Header           http.Header
	TransferEncoding []string
}

// Server is a server made by New. Set Warm before its first request.
type Server struct {
	Armed  atomic.Bool  // cut the next kept-alive request
	CutAll atomic.Bool  // cut every kept-alive request
	Served atomic.Int64 // requests read whole, the cut ones included
	Cuts   atomic.Int64 // requests read whole and left unanswered
	// Warm, when set, holds the answers to the first Warm requests until
	// all have come, each on a connection of its own: the client then
	// keeps Warm connections idle.
	Warm int64

	answer  string
	ln      net.Listener
	release chan struct{}
	wg      sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
	reqs  []Request
}

// New starts a server that answers each request it does not cut 200
// with the JSON body answer (none to a HEAD), and stops it when t ends.
func New(t testing.TB, answer string) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{answer: answer, ln: ln, conns: map[net.Conn]bool{}, release: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Requests returns what the server read of each request, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
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
		k := s.Served.Add(1)
		s.mu.Lock()
		s.reqs = append(s.reqs, Request{req.Header, req.TransferEncoding})
		s.mu.Unlock()
		if n > 0 && (s.CutAll.Load() || s.Armed.CompareAndSwap(true, false)) {
			s.Cuts.Add(1)
			return
		}
		if s.Warm > 0 && k <= s.Warm {
			if k == s.Warm {
				close(s.release)
			}
			<-s.release
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(s.answer))
		if req.Method != http.MethodHead {
			io.WriteString(c, s.answer)
		}
	}
}
