package grpcwire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Methods the tests serve besides the health service's Check.
const (
	pathEcho     = "/test.Wire/Echo"     // BytesValue in, the same out
	pathFail     = "/test.Wire/Fail"     // StringValue in, status.Error(Aborted, its value) out
	pathBig      = "/test.Wire/Big"      // UInt32Value n in, BytesValue of n bytes out
	pathPanic    = "/test.Wire/Panic"    // panics
	pathDeadline = "/test.Wire/Deadline" // answers the ctx's time left in ns (Int64Value; -1 without deadline)
	pathBlock    = "/test.Wire/Block"    // waits for ctx, then returns its error
	pathSlow     = "/test.Wire/Slow"     // waits for release, then echoes
	pathWatch    = "/grpc.health.v1.Health/Watch"
)

// watchStatuses are what the Watch handler sends, in order.
var watchStatuses = []healthpb.HealthCheckResponse_ServingStatus{
	healthpb.HealthCheckResponse_SERVING,
	healthpb.HealthCheckResponse_NOT_SERVING,
	healthpb.HealthCheckResponse_SERVICE_UNKNOWN,
	healthpb.HealthCheckResponse_SERVING,
}

// testServer is a Server on loopback with the tests' handlers. started
// receives a value when a Block call starts, cancelled its ctx error when
// it ends.
type testServer struct {
	*Server
	addr      string
	started   chan struct{}
	cancelled chan error
	served    chan error    // Serve's result
	release   chan struct{} // closed to let Slow calls answer
}

func sendProto(st *Stream, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return st.Send(b)
}

func newTestServer(tb testing.TB, opts Options) *testServer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return serveTest(tb, ln, opts)
}

func serveTest(tb testing.TB, ln net.Listener, opts Options) *testServer {
	tb.Helper()
	ts := &testServer{
		Server:    NewServer(opts),
		addr:      ln.Addr().String(),
		started:   make(chan struct{}, 1024),
		cancelled: make(chan error, 1024),
		served:    make(chan error, 1),
		release:   make(chan struct{}),
	}
	registerTestHandlers(ts.Server, ts.started, ts.cancelled, ts.release)
	go func() { ts.served <- ts.Serve(ln) }()
	tb.Cleanup(func() {
		ts.Stop()
		if err := <-ts.served; err != nil {
			tb.Errorf("Serve: %v", err)
		}
	})
	return ts
}

func registerTestHandlers(s *Server, started chan struct{}, cancelled chan error, release chan struct{}) {
	s.HandleUnary("/grpc.health.v1.Health/Check", checkHandler)
	s.HandleUnary(pathEcho, func(_ context.Context, in []byte, st *Stream) error {
		return st.Send(in)
	})
	s.HandleUnary(pathFail, func(_ context.Context, in []byte, st *Stream) error {
		var v wrapperspb.StringValue
		if err := proto.Unmarshal(in, &v); err != nil {
			return err
		}
		return status.Error(codes.Aborted, v.Value)
	})
	s.HandleUnary(pathBig, func(_ context.Context, in []byte, st *Stream) error {
		var v wrapperspb.UInt32Value
		if err := proto.Unmarshal(in, &v); err != nil {
			return err
		}
		return sendProto(st, wrapperspb.Bytes(pattern(int(v.Value))))
	})
	s.HandleUnary(pathPanic, func(context.Context, []byte, *Stream) error {
		panic("a handler's bug")
	})
	s.HandleUnary(pathDeadline, func(ctx context.Context, _ []byte, st *Stream) error {
		left := int64(-1)
		if d, ok := ctx.Deadline(); ok {
			left = int64(time.Until(d))
		}
		return sendProto(st, wrapperspb.Int64(left))
	})
	s.HandleUnary(pathBlock, func(ctx context.Context, _ []byte, st *Stream) error {
		started <- struct{}{}
		<-ctx.Done()
		cancelled <- ctx.Err()
		return ctx.Err()
	})
	s.HandleUnary(pathSlow, func(_ context.Context, in []byte, st *Stream) error {
		started <- struct{}{}
		<-release
		return st.Send(in)
	})
	s.Handle(pathWatch, func(_ context.Context, _ []byte, st *Stream) error {
		for _, s := range watchStatuses {
			if err := sendProto(st, &healthpb.HealthCheckResponse{Status: s}); err != nil {
				return err
			}
		}
		return nil
	})
}

// pattern is n bytes that differ from one offset to the next.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// within fails the test unless ch yields within d.
func within[T any](tb testing.TB, ch <-chan T, d time.Duration, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		tb.Fatalf("%s: nothing within %v", what, d)
		panic("unreachable")
	}
}

func TestInteropUnary(t *testing.T) {
	ts := newTestServer(t, Options{MaxRecvMsgSize: 8 << 10})
	cc := dial(t, ts.addr)
	ctx := context.Background()
	long := strings.Repeat("x", 5000)
	for _, tc := range []struct {
		name    string
		method  string
		in, out proto.Message
		code    codes.Code
		msg     string
	}{
		{"check", "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}, codes.OK, ""},
		{"echo", pathEcho, wrapperspb.Bytes([]byte("hello")), &wrapperspb.BytesValue{}, codes.OK, ""},
		{"empty message", pathEcho, wrapperspb.Bytes(nil), &wrapperspb.BytesValue{}, codes.OK, ""},
		{"status", pathFail, wrapperspb.String("no quota"), &wrapperspb.StringValue{}, codes.Aborted, "no quota"},
		{"status non-ASCII and percent", pathFail, wrapperspb.String("100% épuisé 限度\r\n\x01"), &wrapperspb.StringValue{}, codes.Aborted, "100% épuisé 限度\r\n\x01"},
		{"status long", pathFail, wrapperspb.String(long), &wrapperspb.StringValue{}, codes.Aborted, long[:maxMessageText]},
		// Cut at a rune's start, not inside it: the message stays UTF-8.
		{"status long, cut in a rune", pathFail, wrapperspb.String(long[:maxMessageText-1] + "é" + long), &wrapperspb.StringValue{}, codes.Aborted, long[:maxMessageText-1]},
		{"unknown method", "/test.Wire/Nope", wrapperspb.Bytes(nil), &wrapperspb.BytesValue{}, codes.Unimplemented, "unknown method Nope for service test.Wire"},
		{"too large", pathEcho, wrapperspb.Bytes(make([]byte, 9<<10)), &wrapperspb.BytesValue{}, codes.ResourceExhausted, ""},
		{"after too large", pathEcho, wrapperspb.Bytes([]byte("again")), &wrapperspb.BytesValue{}, codes.OK, ""},
		{"panic", pathPanic, wrapperspb.Bytes(nil), &wrapperspb.BytesValue{}, codes.Internal, ""},
		{"after panic", "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}, codes.OK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cc.Invoke(ctx, tc.method, tc.in, tc.out)
			s, _ := status.FromError(err)
			if s.Code() != tc.code {
				t.Fatalf("Invoke: %v; want code %v", err, tc.code)
			}
			if tc.msg != "" && s.Message() != tc.msg {
				t.Fatalf("message %q; want %q", s.Message(), tc.msg)
			}
			if tc.code != codes.OK {
				return
			}
			if bv, ok := tc.in.(*wrapperspb.BytesValue); ok && !bytes.Equal(bv.Value, tc.out.(*wrapperspb.BytesValue).Value) {
				t.Fatalf("echoed %q; want %q", tc.out.(*wrapperspb.BytesValue).Value, bv.Value)
			}
			if hr, ok := tc.out.(*healthpb.HealthCheckResponse); ok && hr.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("status %v", hr.Status)
			}
		})
	}
}

func TestInteropDeadline(t *testing.T) {
	ts := newTestServer(t, Options{})
	cc := dial(t, ts.addr)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var left wrapperspb.Int64Value
	if err := cc.Invoke(ctx, pathDeadline, wrapperspb.Bytes(nil), &left); err != nil {
		t.Fatal(err)
	}
	if d := time.Duration(left.Value); d <= 25*time.Second || d > 30*time.Second {
		t.Fatalf("the handler's deadline is %v away; want the client's 30 s", d)
	}
	if err := cc.Invoke(context.Background(), pathDeadline, wrapperspb.Bytes(nil), &left); err != nil || left.Value != -1 {
		t.Fatalf("without a deadline: %v, %v left; want none", err, left.Value)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := cc.Invoke(ctx, pathBlock, wrapperspb.Bytes(nil), &wrapperspb.BytesValue{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call past its deadline: %v", err)
	}
	within(t, ts.started, 5*time.Second, "the handler's start")
	// The client resets the stream at its deadline too, so the handler's
	// ctx ends with either (TestRawTimeout checks the server's own).
	if err := within(t, ts.cancelled, 5*time.Second, "the handler's ctx"); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's ctx ended with %v", err)
	}
}

func TestInteropCancel(t *testing.T) {
	ts := newTestServer(t, Options{})
	cc := dial(t, ts.addr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cc.Invoke(ctx, pathBlock, wrapperspb.Bytes(nil), &wrapperspb.BytesValue{}) }()
	within(t, ts.started, 5*time.Second, "the handler's start")
	cancel()
	if err := within(t, ts.cancelled, 5*time.Second, "the handler's ctx"); !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's ctx ended with %v", err)
	}
	if err := within(t, done, 5*time.Second, "the call"); status.Code(err) != codes.Canceled {
		t.Fatalf("the call: %v", err)
	}
	// The connection serves on.
	if err := cc.Invoke(context.Background(), pathEcho, wrapperspb.Bytes([]byte("x")), &wrapperspb.BytesValue{}); err != nil {
		t.Fatal(err)
	}
}

func TestInteropLargeAnswer(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	cc := dial(t, ts.addr)
	for _, n := range []uint32{0, 16384 - 8, 16384, 65535, 2<<20 + 3} {
		var out wrapperspb.BytesValue
		err := cc.Invoke(context.Background(), pathBig, wrapperspb.UInt32(n), &out,
			grpc.MaxCallRecvMsgSize(8<<20))
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(out.Value, pattern(int(n))) {
			t.Fatalf("%d bytes: got %d, not the same", n, len(out.Value))
		}
	}
}

func TestInteropConcurrent(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	const conns, perConn, calls = 3, 100, 2
	var wg sync.WaitGroup
	errs := make(chan error, conns*perConn)
	for c := range conns {
		cc := dial(t, ts.addr)
		for g := range perConn {
			wg.Go(func() {
				for i := range calls {
					want := []byte(fmt.Sprintf("conn %d call %d.%d %s", c, g, i, strings.Repeat("y", g*11)))
					var out wrapperspb.BytesValue
					if err := cc.Invoke(context.Background(), pathEcho, wrapperspb.Bytes(want), &out); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(out.Value, want) {
						errs <- fmt.Errorf("answer %q to %q", out.Value, want)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestInteropServerStreaming(t *testing.T) {
	ts := newTestServer(t, Options{})
	client := healthpb.NewHealthClient(dial(t, ts.addr))
	w, err := client.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range watchStatuses {
		m, err := w.Recv()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Status != want {
			t.Fatalf("message %d: %v; want %v", i, m.Status, want)
		}
	}
	if _, err := w.Recv(); err != io.EOF {
		t.Fatalf("after the messages: %v; want EOF", err)
	}
}
