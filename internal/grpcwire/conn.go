package grpcwire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// connWindow is the connection's receive window: the request bytes a
// connection may hold, in requests still arriving and in calls running.
const connWindow = 8 << 20

// maxBuffered is how much the write buffer holds, while a write is under
// way, before the goroutines that append to it wait.
const maxBuffered = 1 << 20

// conn is one client connection. Its reader goroutine (serve) owns the
// fields above mu; mu guards the rest, the write side and the streams.
type conn struct {
	s   *Server
	nc  net.Conn
	br  *bufio.Reader
	ctx context.Context // the calls' parent; cancelled when the connection ends
	end context.CancelFunc

	dec     *hpack.Decoder
	hdr     requestHeaders // the header block being decoded
	hbLen   int            // its encoded bytes so far
	contID  uint32         // the stream whose header block continues, or 0
	contEnd bool           // whether that stream's HEADERS ended it

	mu          sync.Mutex
	room        sync.Cond // signalled when a write ends
	wbuf, spare []byte
	flushing    bool
	werr        error // the write side failed or the connection closed
	streams     map[uint32]*Stream
	open        int    // streams counted against MaxConcurrentStreams
	lastID      uint32 // the highest stream the client opened
	started     bool   // the client's preface read and SETTINGS sent
	goneAway    bool   // GOAWAY sent: no new stream is served
	recvWindow  int64  // connection receive window the client has
	refund      int64  // bytes of it consumed and not yet given back
	sendWindow  int64  // connection send window
	peerWindow  int64  // the client's SETTINGS_INITIAL_WINDOW_SIZE
	peerFrame   int    // the client's SETTINGS_MAX_FRAME_SIZE
	blocked     []*Stream
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		s:          s,
		nc:         nc,
		br:         bufio.NewReaderSize(nc, 64<<10),
		streams:    map[uint32]*Stream{},
		recvWindow: defaultWindow,
		sendWindow: defaultWindow,
		peerWindow: defaultWindow,
		peerFrame:  maxFrame,
	}
	c.room.L = &c.mu
	c.ctx, c.end = context.WithCancel(s.ctx)
	c.dec = hpack.NewDecoder(4096, c.emit)
	c.dec.SetMaxStringLength(maxHeaderBlock)
	return c
}

// requestHeaders are the fields of a request's header block the server
// reads.
type requestHeaders struct {
	path, method, contentType, timeout, encoding string
	size                                         int  // decoded size, as SETTINGS_MAX_HEADER_LIST_SIZE counts it
	tooLarge                                     bool // size passed maxHeaderBlock
}

func (c *conn) emit(f hpack.HeaderField) {
	h := &c.hdr
	h.size += len(f.Name) + len(f.Value) + 32
	if h.size > maxHeaderBlock {
		h.tooLarge = true
		return
	}
	switch f.Name {
	case ":path":
		h.path = f.Value
	case ":method":
		h.method = f.Value
	case "content-type":
		h.contentType = f.Value
	case "grpc-timeout":
		h.timeout = f.Value
	case "grpc-encoding":
		h.encoding = f.Value
	}
}

// serve reads the connection's frames until it ends.
func (c *conn) serve() {
	defer c.close()
	c.nc.SetReadDeadline(time.Now().Add(c.s.opts.HandshakeTimeout))
	var p [len(preface)]byte
	if _, err := io.ReadFull(c.br, p[:]); err != nil || string(p[:]) != preface {
		return
	}
	c.nc.SetReadDeadline(time.Time{})
	c.mu.Lock()
	b := appendFrame(c.wbuf, 12, frameSettings, 0, 0)
	b = appendSetting(b, settingMaxConcurrentStreams, uint32(c.s.opts.MaxConcurrentStreams))
	b = appendSetting(b, settingMaxHeaderListSize, maxHeaderBlock)
	c.wbuf = appendWindowUpdate(b, 0, connWindow-defaultWindow)
	c.recvWindow = connWindow
	c.started = true
	if c.goneAway {
		// GracefulStop came during the handshake.
		c.mu.Unlock()
		return
	}
	c.flushLocked()
	c.mu.Unlock()
	for {
		err := c.readFrame()
		if err == nil {
			continue
		}
		var ce connError
		if errors.As(err, &ce) {
			c.s.log.Debug("grpcwire: closing a connection on a protocol error", "remote", c.nc.RemoteAddr().String(), "err", err)
			c.mu.Lock()
			c.wbuf = appendGoAway(c.wbuf, c.lastID, ce.code, ce.msg)
			c.flushLocked()
			c.mu.Unlock()
		}
		return
	}
}

// close ends the connection: the calls under way are cancelled, and their
// answers dropped.
func (c *conn) close() {
	c.nc.Close()
	c.end()
	c.mu.Lock()
	if c.werr == nil {
		c.werr = net.ErrClosed
	}
	for _, st := range c.streams {
		st.reset = true
		if !st.running {
			c.releaseLocked(st)
		}
	}
	c.blocked = nil
	c.room.Broadcast()
	c.mu.Unlock()
	c.s.forget(c)
}

// readFrame reads one frame and acts on it.
func (c *conn) readFrame() error {
	h, err := c.br.Peek(9)
	if err != nil {
		return err
	}
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	typ, flags := h[3], h[4]
	sid := binary.BigEndian.Uint32(h[5:]) & 0x7fffffff
	c.br.Discard(9)
	if n > maxFrame {
		return connError{codeFrameSize, fmt.Sprintf("a frame of %d bytes, past %d", n, maxFrame)}
	}
	p, err := c.br.Peek(n)
	if err != nil {
		return err
	}
	defer c.br.Discard(n)
	if c.contID != 0 && (typ != frameContinuation || sid != c.contID) {
		return connError{codeProtocol, "a header block interrupted"}
	}
	switch typ {
	case frameData:
		return c.onData(sid, flags, p)
	case frameHeaders:
		return c.onHeaders(sid, flags, p)
	case frameContinuation:
		if c.contID == 0 {
			return connError{codeProtocol, "CONTINUATION without HEADERS"}
		}
		return c.onBlock(p, flags&flagEndHeaders != 0)
	case framePriority:
		if sid == 0 {
			return connError{codeProtocol, "PRIORITY on stream 0"}
		}
		if n != 5 {
			c.resetStream(sid, codeFrameSize)
		}
		return nil
	case frameRSTStream:
		return c.onRST(sid, p)
	case frameSettings:
		return c.onSettings(sid, flags, p)
	case framePushPromise:
		return connError{codeProtocol, "PUSH_PROMISE from a client"}
	case framePing:
		if sid != 0 {
			return connError{codeProtocol, "PING on a stream"}
		}
		if n != 8 {
			return connError{codeFrameSize, "PING of other than 8 bytes"}
		}
		if flags&flagAck == 0 {
			c.mu.Lock()
			c.waitRoomLocked()
			c.wbuf = append(appendFrame(c.wbuf, 8, framePing, flagAck, 0), p...)
			c.flushLocked()
			c.mu.Unlock()
		}
		return nil
	case frameGoAway:
		if sid != 0 {
			return connError{codeProtocol, "GOAWAY on a stream"}
		}
		return nil
	case frameWindowUpdate:
		return c.onWindowUpdate(sid, p)
	}
	return nil // an unknown frame type is ignored
}

// unpad strips a padded frame's padding.
func unpad(flags byte, p []byte) ([]byte, error) {
	if flags&flagPadded == 0 {
		return p, nil
	}
	if len(p) < 1 || int(p[0]) > len(p)-1 {
		return nil, connError{codeProtocol, "padding past the frame"}
	}
	return p[1 : len(p)-int(p[0])], nil
}

func (c *conn) onHeaders(sid uint32, flags byte, p []byte) error {
	if sid == 0 || sid%2 == 0 {
		return connError{codeProtocol, "HEADERS on a stream the client cannot open"}
	}
	p, err := unpad(flags, p)
	if err != nil {
		return err
	}
	if flags&flagPriority != 0 {
		if len(p) < 5 {
			return connError{codeFrameSize, "HEADERS too short for its priority"}
		}
		p = p[5:]
	}
	c.hdr = requestHeaders{}
	c.hbLen = 0
	c.contID = sid
	c.contEnd = flags&flagEndStream != 0
	return c.onBlock(p, flags&flagEndHeaders != 0)
}

// onBlock decodes a part of a header block; end says it is the last.
func (c *conn) onBlock(p []byte, end bool) error {
	c.hbLen += len(p)
	if c.hbLen > maxHeaderBlock {
		return connError{codeCalm, "a header block past 64 KiB"}
	}
	if _, err := c.dec.Write(p); err != nil {
		return connError{codeCompression, err.Error()}
	}
	if !end {
		return nil
	}
	if err := c.dec.Close(); err != nil {
		return connError{codeCompression, err.Error()}
	}
	sid := c.contID
	c.contID = 0
	return c.onRequest(sid, c.contEnd)
}

// onRequest starts stream sid, whose header block c.hdr holds.
func (c *conn) onRequest(sid uint32, endStream bool) error {
	c.mu.Lock()
	if sid <= c.lastID {
		st := c.streams[sid]
		c.mu.Unlock()
		if st == nil {
			if endStream {
				return nil // the trailers of a stream answered or reset
			}
			return connError{codeStreamClosed, "HEADERS on a closed stream"}
		}
		if !endStream {
			return connError{codeProtocol, "trailers that do not end the stream"}
		}
		return c.endRequest(st)
	}
	c.lastID = sid
	if c.goneAway || c.open >= c.s.opts.MaxConcurrentStreams {
		c.waitRoomLocked()
		c.wbuf = appendRST(c.wbuf, sid, codeRefused)
		c.flushLocked()
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	h := &c.hdr
	if h.tooLarge {
		return c.answerEarly(sid, endStream, 200, codes.ResourceExhausted, "header list past 64 KiB")
	}
	if h.method != "POST" || h.path == "" {
		c.resetStream(sid, codeProtocol)
		return nil
	}
	if !grpcContentType(h.contentType) {
		return c.answerEarly(sid, endStream, 415, codes.Internal, fmt.Sprintf("invalid gRPC request content-type %q", h.contentType))
	}
	m := c.s.methods[h.path]
	if m.h == nil {
		return c.answerEarly(sid, endStream, 200, codes.Unimplemented, unknownMethod(h.path))
	}
	ctx, cancel := c.ctx, context.CancelFunc(nil)
	if h.timeout != "" {
		d, ok := parseTimeout(h.timeout)
		if !ok {
			return c.answerEarly(sid, endStream, 200, codes.Internal, fmt.Sprintf("malformed grpc-timeout %q", h.timeout))
		}
		ctx, cancel = context.WithTimeout(ctx, d)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	st := &Stream{c: c, id: sid, h: m.h, unary: m.unary, ctx: ctx, cancel: cancel, recvWindow: defaultWindow, encoding: h.encoding}
	c.mu.Lock()
	st.sendWindow = c.peerWindow
	c.streams[sid] = st
	c.open++
	c.mu.Unlock()
	if endStream {
		return c.endRequest(st)
	}
	return nil
}

// grpcContentType tells whether ct is gRPC's: application/grpc, alone or
// with a subtype (+proto) or parameters.
func grpcContentType(ct string) bool {
	rest, ok := strings.CutPrefix(ct, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// unknownMethod is grpc-go's text for a path no handler serves.
func unknownMethod(path string) string {
	svc, method, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if !ok {
		return fmt.Sprintf("malformed method name: %q", path)
	}
	return fmt.Sprintf("unknown method %s for service %s", method, svc)
}

// parseTimeout reads a grpc-timeout: at most 8 digits and a unit.
func parseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	const maxDur = time.Duration(1<<63 - 1)
	if n > uint64(maxDur/unit) {
		return maxDur, true
	}
	return time.Duration(n) * unit, true
}

// answerEarly answers stream sid with status code and msg, before its
// request is read (or without reading it); a request not ended is then
// reset with NO_ERROR, as RFC 9113 (8.1) lets a server say it needs no
// more of it.
func (c *conn) answerEarly(sid uint32, endStream bool, httpStatus int, code codes.Code, msg string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waitRoomLocked()
	c.wbuf = c.appendTrailersOnlyLocked(c.wbuf, sid, httpStatus, code, msg)
	if !endStream {
		c.wbuf = appendRST(c.wbuf, sid, codeNo)
	}
	c.flushLocked()
	return nil
}

func (c *conn) onData(sid uint32, flags byte, p []byte) error {
	if sid == 0 {
		return connError{codeProtocol, "DATA on stream 0"}
	}
	n := int64(len(p))
	data, err := unpad(flags, p)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.recvWindow -= n
	if c.recvWindow < 0 {
		c.mu.Unlock()
		return connError{codeFlowControl, "DATA past the connection's window"}
	}
	st := c.streams[sid]
	if st == nil || st.running || st.reset {
		// A stream answered, reset or ended: what it carries counts
		// against the window all the same, and is given back at once.
		c.refundLocked(n)
		idle := sid > c.lastID
		c.flushLocked()
		c.mu.Unlock()
		if idle {
			return connError{codeProtocol, "DATA on a stream not opened"}
		}
		return nil
	}
	st.held += n
	c.mu.Unlock()
	st.recvWindow -= n
	if st.recvWindow < 0 {
		c.abort(st, codeFlowControl)
		return nil
	}
	if st.buf == nil {
		st.buf = getBuf(len(data))
	}
	st.buf = append(st.buf, data...)
	if len(st.buf) >= 5 {
		if size := binary.BigEndian.Uint32(st.buf[1:5]); int64(size) > int64(c.s.opts.MaxRecvMsgSize) {
			c.refuse(st, flags&flagEndStream != 0, codes.ResourceExhausted,
				fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", size, c.s.opts.MaxRecvMsgSize))
			return nil
		}
		if len(st.buf) > 5+c.s.opts.MaxRecvMsgSize {
			c.refuse(st, flags&flagEndStream != 0, codes.Internal, "grpc: a unary request of more than one message")
			return nil
		}
	}
	if flags&flagEndStream != 0 {
		return c.endRequest(st)
	}
	if n > 0 {
		st.recvWindow += n
		c.mu.Lock()
		c.waitRoomLocked()
		c.wbuf = appendWindowUpdate(c.wbuf, sid, uint32(n))
		c.flushLocked()
		c.mu.Unlock()
	}
	return nil
}

// endRequest starts st's call: its request is whole.
func (c *conn) endRequest(st *Stream) error {
	c.mu.Lock()
	if st.running || st.reset {
		c.mu.Unlock()
		return nil
	}
	st.running = true
	st.ended = true
	c.mu.Unlock()
	msg, code, text := message(st.buf, st.encoding)
	c.s.calls.Add(1)
	if code != codes.OK {
		go c.answer(st, code, text)
		return nil
	}
	c.s.dispatch(call{c: c, st: st, msg: msg})
	return nil
}

// message is the one message of a unary request, b in gRPC's framing.
func message(b []byte, encoding string) ([]byte, codes.Code, string) {
	if len(b) < 5 {
		return nil, codes.Internal, "grpc: the request carries no message"
	}
	if b[0] != 0 {
		if encoding == "" || encoding == "identity" {
			return nil, codes.Internal, "grpc: compressed flag set with identity or empty encoding"
		}
		return nil, codes.Unimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", encoding)
	}
	size := binary.BigEndian.Uint32(b[1:5])
	if uint64(len(b)-5) != uint64(size) {
		return nil, codes.Internal, "grpc: a unary request of other than one whole message"
	}
	return b[5:], codes.OK, ""
}

// refuse answers st, whose request cannot be served, before its handler
// would run.
func (c *conn) refuse(st *Stream, endStream bool, code codes.Code, msg string) {
	c.mu.Lock()
	st.running = true
	st.ended = endStream
	c.mu.Unlock()
	c.s.calls.Add(1)
	c.answer(st, code, msg)
}

func (c *conn) onRST(sid uint32, p []byte) error {
	if len(p) != 4 {
		return connError{codeFrameSize, "RST_STREAM of other than 4 bytes"}
	}
	if sid == 0 {
		return connError{codeProtocol, "RST_STREAM on stream 0"}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if sid > c.lastID {
		return connError{codeProtocol, "RST_STREAM on a stream not opened"}
	}
	if st := c.streams[sid]; st != nil {
		c.dropLocked(st)
	}
	return nil
}

// dropLocked forgets st's answer: the client reset it, or the server
// must. Its handler, if it runs, is cancelled and keeps st counted until
// it returns.
func (c *conn) dropLocked(st *Stream) {
	returned := st.trailers != nil // the handler has returned; its answer waits for window
	st.reset = true
	st.cancel()
	st.pending = nil
	st.trailers = nil
	c.room.Broadcast() // a Send waiting for window returns
	if !st.running || returned {
		c.releaseLocked(st)
	}
}

// abort resets st with code.
func (c *conn) abort(st *Stream, code uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waitRoomLocked()
	if st.reset {
		return
	}
	c.dropLocked(st)
	c.wbuf = appendRST(c.wbuf, st.id, code)
	c.flushLocked()
}

// resetStream resets stream sid, which holds no state.
func (c *conn) resetStream(sid uint32, code uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waitRoomLocked()
	if st := c.streams[sid]; st != nil {
		c.dropLocked(st)
	}
	c.wbuf = appendRST(c.wbuf, sid, code)
	c.flushLocked()
}

func (c *conn) onSettings(sid uint32, flags byte, p []byte) error {
	if sid != 0 {
		return connError{codeProtocol, "SETTINGS on a stream"}
	}
	if flags&flagAck != 0 {
		if len(p) != 0 {
			return connError{codeFrameSize, "a SETTINGS acknowledgement with a payload"}
		}
		return nil
	}
	if len(p)%6 != 0 {
		return connError{codeFrameSize, "SETTINGS of a length not a multiple of 6"}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	grew := false
	for ; len(p) > 0; p = p[6:] {
		id, v := binary.BigEndian.Uint16(p), binary.BigEndian.Uint32(p[2:])
		switch id {
		case settingEnablePush:
			if v > 1 {
				return connError{codeProtocol, "SETTINGS_ENABLE_PUSH past 1"}
			}
		case settingInitialWindowSize:
			if v > maxWindow {
				return connError{codeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1"}
			}
			delta := int64(v) - c.peerWindow
			c.peerWindow = int64(v)
			for _, st := range c.streams {
				st.sendWindow += delta
			}
			grew = grew || delta > 0
		case settingMaxFrameSize:
			if v < maxFrame || v > 1<<24-1 {
				return connError{codeProtocol, "SETTINGS_MAX_FRAME_SIZE out of range"}
			}
			c.peerFrame = int(v)
		}
	}
	c.waitRoomLocked()
	c.wbuf = appendFrame(c.wbuf, 0, frameSettings, flagAck, 0)
	if grew {
		c.drainLocked()
	}
	c.flushLocked()
	return nil
}

func (c *conn) onWindowUpdate(sid uint32, p []byte) error {
	if len(p) != 4 {
		return connError{codeFrameSize, "WINDOW_UPDATE of other than 4 bytes"}
	}
	inc := int64(binary.BigEndian.Uint32(p) & 0x7fffffff)
	c.mu.Lock()
	defer c.mu.Unlock()
	if sid == 0 {
		if inc == 0 {
			return connError{codeProtocol, "WINDOW_UPDATE of 0"}
		}
		c.sendWindow += inc
		if c.sendWindow > maxWindow {
			return connError{codeFlowControl, "the connection's window past 2^31-1"}
		}
	} else {
		st := c.streams[sid]
		if st == nil || st.reset {
			return nil
		}
		if inc == 0 || st.sendWindow+inc > maxWindow {
			code := uint32(codeProtocol)
			if inc != 0 {
				code = codeFlowControl
			}
			c.dropLocked(st)
			c.wbuf = appendRST(c.wbuf, sid, code)
			c.flushLocked()
			return nil
		}
		st.sendWindow += inc
	}
	c.drainLocked()
	c.flushLocked()
	return nil
}

// goAway tells the client to open no more streams, and closes the
// connection once its calls are answered.
func (c *conn) goAway() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goneAway || c.werr != nil {
		return
	}
	c.goneAway = true
	if !c.started {
		c.nc.Close()
		return
	}
	c.wbuf = appendGoAway(c.wbuf, c.lastID, codeNo, "")
	c.flushLocked()
}

// refundLocked gives n bytes of the connection's receive window back,
// in WINDOW_UPDATEs of at least a quarter of it.
func (c *conn) refundLocked(n int64) {
	c.refund += n
	if c.refund >= connWindow/4 {
		c.wbuf = appendWindowUpdate(c.wbuf, 0, uint32(c.refund))
		c.recvWindow += c.refund
		c.refund = 0
	}
}

// releaseLocked forgets st: its answer is written or dropped, and its
// handler, if it ran, has returned.
func (c *conn) releaseLocked(st *Stream) {
	if c.streams[st.id] != st {
		return
	}
	delete(c.streams, st.id)
	c.open--
	st.cancel()
	c.refundLocked(st.held)
	st.held = 0
	putBuf(st.buf)
	st.buf = nil
	if c.goneAway && c.open == 0 && !c.flushing && len(c.wbuf) == 0 && c.werr == nil {
		c.closeWriteLocked() // else flushLocked does, once the answers are written
	}
}

// bufs holds request buffers of at most maxPooled bytes for reuse.
var bufs sync.Pool

const maxPooled = 16 << 10

// getBuf returns an empty buffer for a request whose first frame holds n
// bytes.
func getBuf(n int) []byte {
	if n <= maxPooled {
		if b, ok := bufs.Get().(*[]byte); ok {
			return (*b)[:0]
		}
		return make([]byte, 0, max(n, 1024))
	}
	return make([]byte, 0, n)
}

// putBuf keeps b, a request's buffer its call no longer reads, for reuse.
func putBuf(b []byte) {
	if b != nil && cap(b) <= maxPooled {
		bufs.Put(&b)
	}
}

// closeWriteLocked ends a connection that went away once its last call is
// answered: the client has the answers, and the reader ends at its EOF
// or a second later.
func (c *conn) closeWriteLocked() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		c.nc.SetReadDeadline(time.Now().Add(time.Second))
	} else {
		c.nc.Close()
	}
	c.werr = net.ErrClosed
}
