package grpcwire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestRawNoReader: a client that sends and never reads holds no more of
// the server's memory than its write buffer's bound, and its connection
// closes after WriteTimeout.
func TestRawNoReader(t *testing.T) {
	ln := smallBufListener(t)
	ts := serveTest(t, ln, Options{MaxConcurrentStreams: 2, WriteTimeout: time.Minute})
	for _, tc := range []struct {
		name  string
		frame func(c *rawConn, i int) []byte // one frame the flood repeats
	}{
		{"refused HEADERS", func(c *rawConn, i int) []byte {
			// Streams 1 and 3 hold the two allowed; each of these is
			// refused with an RST_STREAM.
			return append(appendFrame(nil, 1, frameHeaders, flagEndHeaders, uint32(2*i+5)), 0x83)
		}},
		{"DATA", func(c *rawConn, i int) []byte {
			// One byte each on stream 1, whose message never ends: each
			// earns a WINDOW_UPDATE.
			return append(appendFrame(nil, 1, frameData, 0, 1), 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) {
					syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
				})
			}}
			nc, err := d.Dial("tcp", ts.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			// Windows that let the server write all it has at once.
			c := rawStart(t, nc, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 1 << 30}})
			c.fr.WriteWindowUpdate(0, 1<<30)
			var c0 *conn
			ts.mu.Lock()
			for cc := range ts.conns {
				if cc.nc.RemoteAddr().String() == nc.LocalAddr().String() {
					c0 = cc
				}
			}
			ts.mu.Unlock()
			if c0 == nil {
				t.Fatal("the server's connection not found")
			}
			// Stream 1: a request of 1 MiB, under way. Stream 3: an
			// answer of 512 KiB, whose write waits for a reader that
			// never comes (the call is unary: its handler has returned,
			// and the answer's writer is the goroutine that ran it).
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathBlock), EndHeaders: true})
			c.fr.WriteData(1, false, []byte{0, 0, 0x10, 0, 0})
			c.request(3, pathBig, []byte{0x08, 0x80, 0x80, 0x20}, true) // UInt32Value{Value: 524288}
			pollUntil(t, 5*time.Second, "the answer's write", func() bool {
				c0.mu.Lock()
				defer c0.mu.Unlock()
				return c0.flushing && c0.lastID == 3
			})
			var flood []byte
			for i := range 200_000 {
				flood = append(flood, tc.frame(c, i)...)
			}
			go nc.Write(flood) // ends when the connection closes
			// The reader must stop, waiting for room in the write buffer,
			// before the buffer passes its bound.
			deadline := time.Now().Add(30 * time.Second)
			for !readerWaits() {
				c0.mu.Lock()
				n := len(c0.wbuf)
				c0.mu.Unlock()
				if n > maxBuffered+64<<10 {
					t.Fatalf("the server holds %d bytes to write; its bound is %d", n, maxBuffered)
				}
				if time.Now().After(deadline) {
					t.Fatal("the reader neither waits nor fills the write buffer")
				}
				time.Sleep(time.Millisecond)
			}
			nc.Close()
			pollUntil(t, 10*time.Second, "the connection's end", func() bool {
				ts.mu.Lock()
				defer ts.mu.Unlock()
				_, open := ts.conns[c0]
				return !open
			})
		})
	}
}

// readerWaits tells whether a connection's reader waits for room in its
// write buffer; the tests that call it do not run in parallel.
func readerWaits() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("(*conn).waitRoomLocked")) && bytes.Contains(g, []byte("(*conn).readFrame")) {
			return true
		}
	}
	return false
}

// smallBufListener listens on loopback with small socket buffers,
// inherited by the accepted connections, so that the server's writes to a
// client that does not read block soon.
func smallBufListener(t *testing.T) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		})
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestRawWriteTimeout: a client that sends and never reads has its
// connection closed after WriteTimeout.
func TestRawWriteTimeout(t *testing.T) {
	t.Parallel()
	ts := serveTest(t, smallBufListener(t), Options{WriteTimeout: 200 * time.Millisecond})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}}
	nc, err := d.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rawStart(t, nc, nil)
	var flood []byte
	for range 100_000 {
		flood = append(flood, append(appendFrame(nil, 8, framePing, 0, 0), make([]byte, 8)...)...)
	}
	go nc.Write(flood)
	pollUntil(t, 10*time.Second, "the connection's close", func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return len(ts.conns) == 0
	})
}

// TestRawStreamingNoWindow: a server-streaming handler whose client grants
// no window holds no more than the write buffer's bound in answers
// waiting: Send waits, and returns once the client resets the stream.
func TestRawStreamingNoWindow(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(Options{})
	sent := make(chan error, 1)
	streams := make(chan *Stream, 1)
	s.Handle(pathWatch, func(_ context.Context, _ []byte, st *Stream) error {
		streams <- st
		msg := make([]byte, 64<<10)
		for range 200 { // 13 MB
			if err := st.Send(msg); err != nil {
				sent <- err
				return err
			}
			st.c.mu.Lock()
			n := len(st.pending)
			st.c.mu.Unlock()
			if n > maxBuffered+len(msg)+5 {
				sent <- fmt.Errorf("%d bytes wait for window", n)
				return nil
			}
		}
		sent <- nil
		return nil
	})
	go s.Serve(ln)
	defer s.Stop()
	c := rawDial(t, ln.Addr().String(), []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}})
	c.request(1, pathWatch, []byte{}, true)
	st := within(t, streams, 5*time.Second, "the handler's start")
	held := func() int {
		st.c.mu.Lock()
		defer st.c.mu.Unlock()
		return len(st.pending)
	}
	for {
		select {
		case err := <-sent:
			t.Fatalf("the handler sent to a client of no window: %v", err)
		default:
		}
		if held() >= maxBuffered {
			break
		}
		time.Sleep(time.Millisecond)
	}
	c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	if err := within(t, sent, 5*time.Second, "Send's return after the reset"); err != ErrStreamReset {
		t.Fatalf("Send: %v; want ErrStreamReset", err)
	}
}

// TestRawResetWaitingAnswer: a stream reset while its answer, its handler
// returned, waits for the client's window gives back its place among
// MaxConcurrentStreams (and its request's share of the connection's
// window), or a client could fill the connection with streams it reset.
func TestRawResetWaitingAnswer(t *testing.T) {
	const limit = 2
	ts := newTestServer(t, Options{MaxConcurrentStreams: limit})
	c := rawDial(t, ts.addr, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}})
	var c0 *conn
	pollUntil(t, 5*time.Second, "the server's connection", func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		for cc := range ts.conns {
			c0 = cc
		}
		return c0 != nil
	})
	for i := range 2 * limit {
		sid := uint32(2*i + 1)
		c.request(sid, pathBig, []byte{0x08, 100}, true)
		pollUntil(t, 5*time.Second, "the handler's return", func() bool {
			c0.mu.Lock()
			defer c0.mu.Unlock()
			st := c0.streams[sid]
			refused := st == nil && c0.lastID >= sid
			return refused || st != nil && st.trailers != nil // answered, waiting for window
		})
		c.fr.WriteRSTStream(sid, http2.ErrCodeCancel)
	}
	sid := uint32(4*limit + 1)
	c.request(sid, pathEcho, []byte("\x0a\x01a"), true)
	for {
		f := c.next()
		if r, ok := f.(*http2.RSTStreamFrame); ok && r.ErrCode == http2.ErrCodeRefusedStream {
			t.Fatalf("stream %d, opened after %d streams were reset, refused", r.StreamID, limit)
		}
		if f.Header().StreamID == sid {
			return // its answer's HEADERS
		}
	}
}

// TestRawStreamingNoWindowDeadline: a server-streaming handler waiting
// for a window the client never grants returns at its call's deadline
// (the client's grpc-timeout), not only at a reset.
func TestRawStreamingNoWindowDeadline(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(Options{})
	sent := make(chan error, 1)
	s.Handle(pathWatch, func(ctx context.Context, _ []byte, st *Stream) error {
		msg := make([]byte, 64<<10)
		for range 200 { // 13 MB, past what waits for window
			if err := st.Send(msg); err != nil {
				sent <- err
				return err
			}
		}
		sent <- nil
		return nil
	})
	go s.Serve(ln)
	defer s.Stop()
	c := rawDial(t, ln.Addr().String(), []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}})
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathWatch, "grpc-timeout", "300m"), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := within(t, sent, 5*time.Second, "Send's return at the deadline"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send: %v; want the deadline's error", err)
	}
}
