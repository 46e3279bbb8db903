package grpcwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawConn is an HTTP/2 client built from x/net's Framer and HPACK
// encoder, that writes what a test tells it, valid or not.
type rawConn struct {
	tb   testing.TB
	nc   net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
}

// rawDial connects to addr, writes the preface and SETTINGS of settings,
// and reads the server's SETTINGS.
func rawDial(tb testing.TB, addr string, settings []http2.Setting) *rawConn {
	tb.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nc.Close() })
	return rawStart(tb, nc, settings)
}

func rawStart(tb testing.TB, nc net.Conn, settings []http2.Setting) *rawConn {
	tb.Helper()
	c := &rawConn{tb: tb, nc: nc}
	c.fr = http2.NewFramer(nc, nc)
	c.fr.AllowIllegalWrites = true
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	if _, err := io.WriteString(nc, preface); err != nil {
		tb.Fatal(err)
	}
	if err := c.fr.WriteSettings(settings...); err != nil {
		tb.Fatal(err)
	}
	f := c.next()
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		tb.Fatalf("the server's first frame: %v", f)
	}
	return c
}

// next reads a frame, failing the test past 5 s or on an error.
func (c *rawConn) next() http2.Frame {
	c.tb.Helper()
	f, err := c.read(5 * time.Second)
	if err != nil {
		c.tb.Fatalf("reading a frame: %v", err)
	}
	return f
}

func (c *rawConn) read(d time.Duration) (http2.Frame, error) {
	c.nc.SetReadDeadline(time.Now().Add(d))
	return c.fr.ReadFrame()
}

// block encodes a request's header block for path.
func (c *rawConn) block(path string, extra ...string) []byte {
	c.hbuf.Reset()
	fields := append([]string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "wire", "content-type", "application/grpc", "te", "trailers"}, extra...)
	for i := 0; i < len(fields); i += 2 {
		c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(c.hbuf.Bytes())
}

// request opens stream sid for path and sends msg as its one message
// (none if msg is nil), ending the stream if end.
func (c *rawConn) request(sid uint32, path string, msg []byte, end bool) {
	c.tb.Helper()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: c.block(path), EndHeaders: true}); err != nil {
		c.tb.Fatal(err)
	}
	if msg == nil {
		return
	}
	if err := c.fr.WriteData(sid, end, grpcMessage(msg)); err != nil {
		c.tb.Fatal(err)
	}
}

// grpcMessage is msg with gRPC's 5-byte prefix.
func grpcMessage(msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// answer is what the server sent on one stream.
type answer struct {
	headers  []hpack.HeaderField
	data     []byte
	frames   []int // DATA frame sizes
	trailers []hpack.HeaderField
	rst      http2.ErrCode
	reset    bool
}

func (a *answer) field(name string) string {
	for _, f := range append(append([]hpack.HeaderField(nil), a.headers...), a.trailers...) {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// readAnswer reads frames until stream sid ends (END_STREAM or
// RST_STREAM), answering PINGs' frames on the way by ignoring them.
func (c *rawConn) readAnswer(sid uint32) *answer {
	c.tb.Helper()
	a := &answer{}
	for {
		f := c.next()
		if f.Header().StreamID != sid {
			if ga, ok := f.(*http2.GoAwayFrame); ok {
				c.tb.Fatalf("GOAWAY %v while stream %d is answered", ga.ErrCode, sid)
			}
			continue
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if a.headers == nil {
				a.headers = f.Fields
			} else {
				a.trailers = f.Fields
			}
			if f.StreamEnded() {
				return a
			}
		case *http2.DataFrame:
			a.data = append(a.data, f.Data()...)
			a.frames = append(a.frames, len(f.Data()))
			if f.StreamEnded() {
				return a
			}
		case *http2.RSTStreamFrame:
			a.rst, a.reset = f.ErrCode, true
			return a
		}
	}
}

// expectGoAway reads until a GOAWAY, which must carry code, then expects
// the connection to close.
func (c *rawConn) expectGoAway(code http2.ErrCode) {
	c.tb.Helper()
	for {
		f, err := c.read(5 * time.Second)
		if err != nil {
			c.tb.Fatalf("no GOAWAY: %v", err)
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			if ga.ErrCode != code {
				c.tb.Fatalf("GOAWAY %v (%q); want %v", ga.ErrCode, ga.DebugData(), code)
			}
			break
		}
	}
	c.expectClosed()
}

// expectClosed reads until the connection ends, which must be within 5 s.
func (c *rawConn) expectClosed() {
	c.tb.Helper()
	for {
		_, err := c.read(5 * time.Second)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.tb.Fatal("the connection is still open")
		}
		if err != nil {
			return
		}
	}
}
