package proxy_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestStallAtkUnreadPlainAnswerIsLetGo: a plain (not streamed) answer of
// up to 8 MiB is read whole and settled before it is written to the
// client. A client that never reads it (its TCP window closed) must not
// hold the request for ever: its goroutine, the answer's bytes and its
// place among the requests in flight. Its writes are bound by the same
// stall as a stream's (half the upstream's timeout here, 1 s), after
// which the request ends; before, the write waited without a deadline and
// the request never ended.
func TestStallAtkUnreadPlainAnswerIsLetGo(t *testing.T) {
	answer := `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("a", 7<<20) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":5,"total_tokens":13}}`
	hit := make(chan struct{}, 1)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit <- struct{}{}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
	})
	s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up, upstreamTimeout: 2 * time.Second})

	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4096)
	body := `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: costgate\r\nAuthorization: Bearer cg-test-acme\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// The client reads nothing.
	select {
	case <-hit:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach the upstream")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	if err := s.srv.WaitIdle(ctx); err != nil {
		t.Fatalf("a request whose client reads none of its 7 MiB plain answer is still in flight 8 s later (stall 1 s): %v", err)
	}
}
