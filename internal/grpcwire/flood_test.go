package grpcwire

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestRawNoReader: a client that sends and never reads holds no more of
// the server's memory than its write buffer's bound, and its connection
// closes after WriteTimeout.
func TestRawNoReader(t *testing.T) {
	// Small socket buffers, inherited by the accepted connections, so
	// that the server's writes block soon.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		})
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const writeTimeout = 1500 * time.Millisecond
	ts := serveTest(t, ln, Options{MaxConcurrentStreams: 2, WriteTimeout: writeTimeout})
	for _, tc := range []struct {
		name  string
		frame func(c *rawConn, i int) []byte // one frame the flood repeats
	}{
		{"PING", func(c *rawConn, i int) []byte {
			return append(appendFrame(nil, 8, framePing, 0, 0), make([]byte, 8)...)
		}},
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
			// answer of 2 MB, whose handler then writes, and waits for a
			// reader that never comes.
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathBlock), EndHeaders: true})
			c.fr.WriteData(1, false, []byte{0, 0, 0x10, 0, 0})
			c.request(3, pathBig, []byte{0x08, 0x80, 0x89, 0x7a}, true) // UInt32Value{Value: 2000000}
			pollUntil(t, 5*time.Second, "the answer's write", func() bool {
				c0.mu.Lock()
				defer c0.mu.Unlock()
				return c0.flushing && c0.open == 2
			})
			var flood []byte
			for i := range 200_000 {
				flood = append(flood, tc.frame(c, i)...)
			}
			go nc.Write(flood) // ends when the server closes the connection
			// Until the server forgets the connection, its write buffer
			// must stay within its bound.
			most := 0
			deadline := time.Now().Add(writeTimeout + 10*time.Second)
			for {
				ts.mu.Lock()
				_, open := ts.conns[c0]
				ts.mu.Unlock()
				if !open {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the connection is still open")
				}
				c0.mu.Lock()
				most = max(most, len(c0.wbuf))
				c0.mu.Unlock()
				time.Sleep(time.Millisecond)
			}
			if most > maxBuffered+64<<10 {
				t.Fatalf("the server held %d bytes to write; its bound is %d", most, maxBuffered)
			}
		})
	}
}

// TestRawStreamingNoWindow: a server-streaming handler whose client grants
// no window holds no more than the write buffer's bound in answers
// waiting: Send waits, and returns once the client resets the stream.
func TestRawStreamingNoWindow(t *testing.T) {
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
