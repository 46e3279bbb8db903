package grpcwire

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

func TestRawHandshake(t *testing.T) {
	ts := newTestServer(t, Options{HandshakeTimeout: 100 * time.Millisecond})
	t.Run("bad preface", func(t *testing.T) {
		nc, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := io.Copy(io.Discard, nc); err != nil || n != 0 {
			t.Fatalf("read %d bytes, %v; want the connection closed", n, err)
		}
	})
	t.Run("no preface", func(t *testing.T) {
		nc, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		io.WriteString(nc, preface[:10])
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := io.Copy(io.Discard, nc); err != nil || n != 0 {
			t.Fatalf("read %d bytes, %v; want the connection closed", n, err)
		}
	})
	t.Run("ping", func(t *testing.T) {
		c := rawDial(t, ts.addr, nil)
		data := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
		c.fr.WritePing(false, data)
		for {
			if p, ok := c.next().(*http2.PingFrame); ok {
				if !p.IsAck() || p.Data != data {
					t.Fatalf("PING %v", p)
				}
				return
			}
		}
	})
}

func TestRawConnectionErrors(t *testing.T) {
	ts := newTestServer(t, Options{})
	for _, tc := range []struct {
		name  string
		write func(c *rawConn)
		code  http2.ErrCode
	}{
		{"DATA on stream 0", func(c *rawConn) { c.fr.WriteData(0, false, []byte("x")) }, http2.ErrCodeProtocol},
		{"HEADERS on an even stream", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: c.block(pathEcho), EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"PUSH_PROMISE", func(c *rawConn) {
			c.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: c.block(pathEcho), EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"WINDOW_UPDATE past 2^31-1", func(c *rawConn) { c.fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl},
		{"SETTINGS of 7 bytes", func(c *rawConn) { c.fr.WriteRawFrame(http2.FrameSettings, 0, 0, make([]byte, 7)) }, http2.ErrCodeFrameSize},
		{"frame past 16384", func(c *rawConn) { c.fr.WriteRawFrame(http2.FrameData, 0, 1, make([]byte, 16385)) }, http2.ErrCodeFrameSize},
		{"DATA on an idle stream", func(c *rawConn) { c.fr.WriteData(9, false, []byte("x")) }, http2.ErrCodeProtocol},
		{"CONTINUATION alone", func(c *rawConn) { c.fr.WriteContinuation(1, true, []byte{0x83}) }, http2.ErrCodeProtocol},
		{"PING of 7 bytes", func(c *rawConn) { c.fr.WriteRawFrame(http2.FramePing, 0, 0, make([]byte, 7)) }, http2.ErrCodeFrameSize},
		{"bad HPACK", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
		}, http2.ErrCodeCompression},
		{"padding past the frame", func(c *rawConn) { c.fr.WriteRawFrame(http2.FrameHeaders, 0x8|0x4, 1, []byte{5, 0x83}) }, http2.ErrCodeProtocol},
		{"CONTINUATION flood", func(c *rawConn) {
			// A header block past 64 KiB, of one header repeated: the
			// server keeps neither it nor its decoded fields.
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathEcho)})
			frag := bytes.Repeat([]byte{0x83}, 16000)
			for range 5 {
				if err := c.fr.WriteContinuation(1, false, frag); err != nil {
					return
				}
			}
		}, http2.ErrCodeEnhanceYourCalm},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawDial(t, ts.addr, nil)
			tc.write(c)
			c.expectGoAway(tc.code)
		})
	}
}

// TestRawDataPastConnectionWindow sends more request bytes than the
// connection's window, on streams that hold them.
func TestRawDataPastConnectionWindow(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{MaxRecvMsgSize: 16 << 20})
	c := rawDial(t, ts.addr, nil)
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathEcho), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 16384)
	binary.BigEndian.PutUint32(chunk[1:], 16<<20)
	go func() {
		for range connWindow/len(chunk) + 1 {
			if c.fr.WriteData(1, false, chunk) != nil {
				return
			}
		}
	}()
	c.expectGoAway(http2.ErrCodeFlowControl)
}

// reset stands for an answer of RST_STREAM, not a status.
const reset codes.Code = 1 << 30

// TestRawRequests sends requests grpc-go would not, and reads their
// answers.
func TestRawRequests(t *testing.T) {
	ts := newTestServer(t, Options{})
	echo := grpcMessage([]byte("\x0a\x02hi"))
	for _, tc := range []struct {
		name  string
		write func(c *rawConn)
		code  codes.Code // grpc-status; reset for a reset
		data  []byte     // the answer's DATA, if OK
	}{
		{"ok", func(c *rawConn) { c.request(1, pathEcho, []byte("\x0a\x02hi"), true) }, codes.OK, echo},
		{"no message", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathEcho), EndHeaders: true, EndStream: true})
		}, codes.Internal, nil},
		{"half a message", func(c *rawConn) {
			c.request(1, pathEcho, nil, false)
			c.fr.WriteData(1, true, echo[:6])
		}, codes.Internal, nil},
		{"two messages", func(c *rawConn) {
			c.request(1, pathEcho, nil, false)
			c.fr.WriteData(1, true, append(bytes.Clone(echo), echo...))
		}, codes.Internal, nil},
		{"compressed flag, gzip", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathEcho, "grpc-encoding", "gzip"), EndHeaders: true})
			m := bytes.Clone(echo)
			m[0] = 1
			c.fr.WriteData(1, true, m)
		}, codes.Unimplemented, nil},
		{"compressed flag, identity", func(c *rawConn) {
			c.request(1, pathEcho, nil, false)
			m := bytes.Clone(echo)
			m[0] = 1
			c.fr.WriteData(1, true, m)
		}, codes.Internal, nil},
		{"client trailers", func(c *rawConn) {
			c.request(1, pathEcho, []byte("\x0a\x02hi"), false)
			c.hbuf.Reset()
			c.enc.WriteField(hpack.HeaderField{Name: "x-trailer", Value: "1"})
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: true})
		}, codes.OK, echo},
		{"padded HEADERS and DATA, with priority", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathEcho), EndHeaders: true, PadLength: 7,
				Priority: http2.PriorityParam{StreamDep: 0, Weight: 15}})
			c.fr.WriteDataPadded(1, false, echo[:3], make([]byte, 200))
			c.fr.WriteDataPadded(1, true, echo[3:], make([]byte, 1))
		}, codes.OK, echo},
		{"header block in CONTINUATIONs", func(c *rawConn) {
			b := c.block(pathEcho)
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:3]})
			c.fr.WriteContinuation(1, false, b[3:7])
			c.fr.WriteContinuation(1, true, b[7:])
			c.fr.WriteData(1, true, echo)
		}, codes.OK, echo},
		{"malformed grpc-timeout", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathEcho, "grpc-timeout", "1x"), EndHeaders: true})
			c.fr.WriteData(1, true, echo)
		}, codes.Internal, nil},
		{"server's own deadline", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(pathBlock, "grpc-timeout", "20m"), EndHeaders: true})
			c.fr.WriteData(1, true, grpcMessage(nil))
		}, codes.DeadlineExceeded, nil},
		{"GET", func(c *rawConn) {
			c.hbuf.Reset()
			for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", pathEcho}, {"content-type", "application/grpc"}} {
				c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: true})
		}, reset, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawDial(t, ts.addr, nil)
			tc.write(c)
			a := c.readAnswer(1)
			if tc.code == reset {
				if !a.reset {
					t.Fatalf("answered %v; want a reset", a.field("grpc-status"))
				}
				return
			}
			if a.reset && a.headers == nil {
				t.Fatalf("reset %v; want grpc-status %d", a.rst, tc.code)
			}
			if got := a.field("grpc-status"); got != strconv.Itoa(int(tc.code)) {
				t.Fatalf("grpc-status %q (%q); want %d", got, a.field("grpc-message"), tc.code)
			}
			if tc.code == codes.OK && !bytes.Equal(a.data, tc.data) {
				t.Fatalf("answer %q; want %q", a.data, tc.data)
			}
			// The connection serves on.
			c.request(101, pathEcho, []byte("\x0a\x02hi"), true)
			if a := c.readAnswer(101); a.field("grpc-status") != "0" || !bytes.Equal(a.data, echo) {
				t.Fatalf("the next call: %q, %q", a.field("grpc-status"), a.data)
			}
		})
	}
}

// TestRawSmallWindow: a client whose streams' window is a few bytes gets
// its answer in frames of that size as it grants more, then the
// trailers, and never more than its windows.
func TestRawSmallWindow(t *testing.T) {
	ts := newTestServer(t, Options{})
	const window = 7
	c := rawDial(t, ts.addr, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: window}})
	const n = 100
	c.request(1, pathBig, []byte{0x08, n}, true) // UInt32Value{Value: 100}
	var data []byte
	var headers, trailers bool
	for !trailers {
		f := c.next()
		if f.Header().StreamID != 1 {
			continue
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if !headers {
				headers = true
				continue
			}
			if !f.StreamEnded() {
				t.Fatal("trailers that do not end the stream")
			}
			if len(data) != 5+2+n {
				t.Fatalf("trailers after %d bytes of %d", len(data), 5+2+n)
			}
			if got := fieldOf(f.Fields, "grpc-status"); got != "0" {
				t.Fatalf("grpc-status %q", got)
			}
			trailers = true
		case *http2.DataFrame:
			if len(f.Data()) != window && len(data)+len(f.Data()) != 5+2+n {
				t.Fatalf("a DATA frame of %d bytes in a window of %d", len(f.Data()), window)
			}
			data = append(data, f.Data()...)
			if len(data) == 5+2+n {
				continue // the trailers follow
			}
			// Only now is there room for more: nothing else may come
			// first (the next read would see it).
			c.nc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if f, err := c.fr.ReadFrame(); err == nil {
				t.Fatalf("a frame past the stream's window: %v", f)
			}
			c.nc.SetReadDeadline(time.Time{})
			if c.fr.WriteWindowUpdate(1, uint32(len(f.Data()))) != nil {
				t.Fatal("write")
			}
		}
	}
	if !bytes.Equal(data[7:], pattern(n)) {
		t.Fatal("the answer differs")
	}
}

func fieldOf(fs []hpack.HeaderField, name string) string {
	for _, f := range fs {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// TestRawRapidReset opens streams whose handlers block, resets them, and
// opens more, at twice MaxConcurrentStreams: the streams past it are
// refused, and no more handlers than it run at once.
func TestRawRapidReset(t *testing.T) {
	const limit = 8
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	running, most := 0, 0
	s := NewServer(Options{MaxConcurrentStreams: limit})
	s.Handle(pathBlock, func(ctx context.Context, _ []byte, st *Stream) error {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		<-ctx.Done()
		time.Sleep(time.Millisecond) // a handler slow to notice
		mu.Lock()
		running--
		mu.Unlock()
		return ctx.Err()
	})
	go s.Serve(ln)
	defer s.Stop()
	c := rawDial(t, ln.Addr().String(), nil)
	const rounds = 40
	refused := 0
	for i := range rounds * limit {
		sid := uint32(2*i + 1)
		c.request(sid, pathBlock, []byte{}, true)
		c.fr.WriteRSTStream(sid, http2.ErrCodeCancel)
	}
	c.fr.WritePing(false, [8]byte{9})
	for {
		f := c.next()
		if r, ok := f.(*http2.RSTStreamFrame); ok && r.ErrCode == http2.ErrCodeRefusedStream {
			refused++
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most > limit {
		t.Fatalf("%d handlers ran at once; the limit is %d", most, limit)
	}
	if refused == 0 {
		t.Fatal("no stream refused")
	}
}
