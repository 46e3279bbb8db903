package grpcwire

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// countingListener counts the writes of the connections it accepts.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: nc, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// A unary call's answer (its headers, its message and its trailers) is
// one write: one system call, and one wake-up of the client's reader. It
// was two (the message when the handler sent it, the trailers when it
// returned); a streaming call's messages are still written as they are
// sent (the Watch tests).
func TestUnaryAnswerIsOneWrite(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	s := NewServer(Options{})
	s.HandleUnary("/grpc.health.v1.Health/Check", checkHandler)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	defer func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	// A fixed window: no BDP pings, whose acknowledgements are writes too.
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx := context.Background()
	for range 3 { // the handshake's writes (SETTINGS and their acknowledgements)
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	const calls = 50
	before := ln.writes.Load()
	for range calls {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("status %v", resp.Status)
		}
	}
	if got := ln.writes.Load() - before; got != calls {
		t.Errorf("%d calls one after the other took %d writes, want one each", calls, got)
	}
}

// A unary call reset by its client after its handler sent its message,
// and before the handler returned, while the server stops gracefully:
// the message waits in the write buffer for the answer, which the reset
// drops. The connection must still close once its last call ends. Had
// that message stayed unwritten, the buffer would never be empty, and
// GracefulStop would wait for the client to hang up.
func TestUnaryResetAfterSendDuringGracefulStop(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(Options{})
	started, proceed, sent := make(chan struct{}), make(chan struct{}), make(chan struct{})
	s.HandleUnary(pathEcho, func(ctx context.Context, in []byte, st *Stream) error {
		close(started)
		<-proceed
		if err := st.Send(in); err != nil {
			return err
		}
		close(sent)
		<-ctx.Done()
		return ctx.Err()
	})
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	defer func() {
		s.Stop()
		<-served
	}()
	c := rawDial(t, ln.Addr().String(), nil)
	c.request(1, pathEcho, []byte{0x0a, 0x01, 'x'}, true)
	within(t, started, 5*time.Second, "the handler's start")

	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	<-s.Stopping()
	for { // the GOAWAY: GracefulStop's own write is done
		f := c.next()
		if _, ok := f.(*http2.GoAwayFrame); ok {
			break
		}
	}
	close(proceed)
	within(t, sent, 5*time.Second, "the handler's Send")
	if err := c.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
	within(t, stopped, 5*time.Second, "GracefulStop")
}
