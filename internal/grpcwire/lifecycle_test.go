package grpcwire

import (
	"context"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// pollUntil fails the test unless ok holds within d.
func pollUntil(tb testing.TB, d time.Duration, what string, ok func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGracefulStop(t *testing.T) {
	ts := newTestServer(t, Options{})
	cc := dial(t, ts.addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A call in flight, answered once GracefulStop has begun.
	done := make(chan error, 1)
	go func() {
		var out wrapperspb.BytesValue
		err := cc.Invoke(ctx, pathSlow, wrapperspb.Bytes([]byte("in flight")), &out)
		if err == nil && string(out.Value) != "in flight" {
			err = errors.New("a wrong answer: " + string(out.Value))
		}
		done <- err
	}()
	within(t, ts.started, 5*time.Second, "the handler's start")

	stopped := make(chan struct{})
	go func() { ts.GracefulStop(); close(stopped) }()
	<-ts.Stopping()
	// The server's listener is closed: a new connection is refused.
	pollUntil(t, 5*time.Second, "the listener's close", func() bool {
		nc, err := net.Dial("tcp", ts.addr)
		if err == nil {
			nc.Close()
		}
		return err != nil
	})
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call under way")
	default:
	}
	close(ts.release)
	if err := within(t, done, 5*time.Second, "the call in flight"); err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	within(t, stopped, 5*time.Second, "GracefulStop")
}

func TestStop(t *testing.T) {
	ts := newTestServer(t, Options{})
	cc := dial(t, ts.addr)
	done := make(chan error, 1)
	go func() {
		done <- cc.Invoke(context.Background(), pathBlock, wrapperspb.Bytes(nil), &wrapperspb.BytesValue{})
	}()
	within(t, ts.started, 5*time.Second, "the handler's start")
	stopped := make(chan struct{})
	go func() { ts.Stop(); close(stopped) }()
	if err := within(t, ts.cancelled, 5*time.Second, "the handler's ctx"); !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's ctx ended with %v", err)
	}
	within(t, stopped, 5*time.Second, "Stop")
	if err := within(t, done, 5*time.Second, "the call"); status.Code(err) != codes.Unavailable {
		t.Fatalf("the call: %v; want UNAVAILABLE", err)
	}
	if err := within(t, ts.served, 5*time.Second, "Serve"); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	ts.served <- nil // for the cleanup
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.Serve(ln); !errors.Is(err, ErrServerStopped) {
		t.Fatalf("Serve after Stop: %v", err)
	}
}

func TestStopLeavesNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(Options{})
	started := make(chan struct{}, 16)
	registerTestHandlers(s, started, make(chan error, 16), make(chan struct{}))
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	// Connections in every state: calls blocked, one idle, one that never
	// sent its preface, one that stopped mid-frame.
	for range 3 {
		c := rawDial(t, ln.Addr().String(), nil)
		c.request(1, pathBlock, []byte{}, true)
		c.request(3, pathBlock, []byte{}, true)
	}
	for range 6 {
		within(t, started, 5*time.Second, "a handler's start")
	}
	rawDial(t, ln.Addr().String(), nil)
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	half := rawDial(t, ln.Addr().String(), nil)
	half.nc.Write([]byte{0, 0, 10, frameData, 0, 0, 0, 0, 1})

	s.Stop()
	if err := within(t, served, 5*time.Second, "Serve"); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 5*time.Second, "the goroutines' end", func() bool {
		return runtime.NumGoroutine() <= before
	})
}

// TestGracefulStopRaw: the client sees GOAWAY naming the last stream
// served, a stream opened after it is refused, and the call in flight is
// answered before the connection closes.
func TestGracefulStopRaw(t *testing.T) {
	ts := newTestServer(t, Options{})
	c := rawDial(t, ts.addr, nil)
	c.request(1, pathSlow, []byte("\x0a\x01a"), true)
	within(t, ts.started, 5*time.Second, "the handler's start")
	stopped := make(chan struct{})
	go func() { ts.GracefulStop(); close(stopped) }()
	for {
		if ga, ok := c.next().(*http2.GoAwayFrame); ok {
			if ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1 {
				t.Fatalf("GOAWAY %v, last stream %d; want NO_ERROR, 1", ga.ErrCode, ga.LastStreamID)
			}
			break
		}
	}
	c.request(3, pathEcho, []byte("\x0a\x01b"), true)
	if a := c.readAnswer(3); !a.reset || a.rst != http2.ErrCodeRefusedStream {
		t.Fatalf("a stream after GOAWAY: reset %v %v; want REFUSED_STREAM", a.reset, a.rst)
	}
	close(ts.release)
	if a := c.readAnswer(1); a.field("grpc-status") != "0" || string(a.data) != string(grpcMessage([]byte("\x0a\x01a"))) {
		t.Fatalf("the call in flight: status %q, %q", a.field("grpc-status"), a.data)
	}
	c.expectClosed()
	c.nc.Close()
	within(t, stopped, 5*time.Second, "GracefulStop")
}
