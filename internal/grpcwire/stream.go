package grpcwire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Stream is one call: the handler sends its answers on it.
type Stream struct {
	c        *conn
	id       uint32
	h        Handler
	unary    bool // its answer is written when h returns (HandleUnary)
	ctx      context.Context
	cancel   context.CancelFunc
	encoding string // grpc-encoding

	// Read by the connection's reader until the call starts.
	buf        []byte // the request, in gRPC's framing
	recvWindow int64

	// Guarded by c.mu.
	running     bool  // the request is whole (or refused) and answered
	ended       bool  // the client ended its side
	reset       bool  // the answer is dropped
	held        int64 // connection window the request holds
	sendWindow  int64
	headersSent bool
	pending     []byte // DATA waiting for window
	trailers    []byte // the trailer block, behind pending
}

// ErrStreamReset is what Send returns once the client has reset the
// stream or the connection has closed.
var ErrStreamReset = errors.New("grpcwire: the stream was reset")

// Send sends msg, a message in the protobuf wire format, on the stream.
// It copies msg before it returns, and waits while 1 MiB of the stream's
// answers waits for the client's flow-control window. On a unary call the
// message is written with the trailers, when the handler returns.
func (st *Stream) Send(msg []byte) error {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waitRoomLocked()
	if len(st.pending) >= maxBuffered {
		// The client's window holds back as much already: wait for it,
		// or for the call's end (its deadline, a reset).
		stop := context.AfterFunc(st.ctx, func() {
			c.mu.Lock()
			c.room.Broadcast()
			c.mu.Unlock()
		})
		for len(st.pending) >= maxBuffered && !st.reset && c.werr == nil && st.ctx.Err() == nil {
			c.room.Wait()
		}
		stop()
	}
	if st.reset || c.werr != nil {
		return ErrStreamReset
	}
	if err := st.ctx.Err(); err != nil {
		return err
	}
	if !st.headersSent {
		st.headersSent = true
		c.wbuf = appendFrame(c.wbuf, 0, frameHeaders, flagEndHeaders, st.id)
		start := len(c.wbuf)
		c.wbuf = appendResponseHeaders(c.wbuf, 200)
		patchLength(c.wbuf, start)
	}
	var prefix [5]byte
	binary.BigEndian.PutUint32(prefix[1:], uint32(len(msg)))
	n := int64(5 + len(msg))
	if st.pending == nil && n <= c.sendWindow && n <= st.sendWindow && n <= int64(c.peerFrame) {
		// One frame, within every window: the usual answer.
		c.sendWindow -= n
		st.sendWindow -= n
		c.wbuf = appendFrame(c.wbuf, int(n), frameData, 0, st.id)
		c.wbuf = append(append(c.wbuf, prefix[:]...), msg...)
	} else {
		wasBlocked := st.pending != nil
		st.pending = append(append(st.pending, prefix[:]...), msg...)
		if !wasBlocked {
			c.blocked = append(c.blocked, st)
		}
		c.drainLocked()
	}
	if !st.unary {
		c.flushLocked()
	}
	return nil
}

// patchLength sets the length of the frame whose payload starts at
// b[start:] to the bytes after it.
func patchLength(b []byte, start int) {
	n := len(b) - start
	b[start-9], b[start-8], b[start-7] = byte(n>>16), byte(n>>8), byte(n)
}

// drainLocked sends the blocked streams' data their windows allow, and
// the trailers of each stream whose data is all sent.
func (c *conn) drainLocked() {
	kept := c.blocked[:0]
	for _, st := range c.blocked {
		if st.reset {
			continue
		}
		for len(st.pending) > 0 && c.sendWindow > 0 && st.sendWindow > 0 {
			n := min(int64(len(st.pending)), c.sendWindow, st.sendWindow, int64(c.peerFrame))
			c.wbuf = appendFrame(c.wbuf, int(n), frameData, 0, st.id)
			c.wbuf = append(c.wbuf, st.pending[:n]...)
			st.pending = st.pending[n:]
			c.sendWindow -= n
			st.sendWindow -= n
		}
		if len(st.pending) > 0 {
			kept = append(kept, st)
			continue
		}
		st.pending = nil
		if st.trailers != nil {
			c.wbuf = append(c.wbuf, st.trailers...)
			st.trailers = nil
			c.endLocked(st)
		}
	}
	clear(c.blocked[len(kept):])
	c.blocked = kept
}

// run calls st's handler on msg and answers with what it returns.
func (c *conn) run(st *Stream, msg []byte) {
	err := c.call(st, msg)
	s, _ := status.FromError(err)
	if err != nil && s.Code() == codes.Unknown {
		if ctxErr := st.ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
			s = status.FromContextError(err)
		}
	}
	c.answer(st, s.Code(), s.Message())
}

// call runs st's handler; a panic is the call's INTERNAL error, and the
// connection and the process go on.
func (c *conn) call(st *Stream, msg []byte) (err error) {
	defer func() {
		if p := recover(); p != nil {
			c.s.log.Error("grpcwire: a handler panicked", "stream", st.id, "panic", fmt.Sprint(p))
			err = status.Error(codes.Internal, "grpcwire: the handler failed")
		}
	}()
	return st.h(st.ctx, msg, st)
}

// answer ends st with status code and msg, and counts the call done.
func (c *conn) answer(st *Stream, code codes.Code, msg string) {
	defer c.s.calls.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.reset || c.werr != nil {
		c.releaseLocked(st)
		if c.werr == nil && len(c.wbuf) > 0 {
			// What a unary call appended before its reset, or others'
			// frames: written, so that a connection going away closes
			// once its buffer is empty.
			c.flushLocked()
		}
		return
	}
	c.waitRoomLocked()
	if code == codes.OK && st.headersSent && st.pending == nil {
		// The usual end: the trailers of an answer sent.
		c.wbuf = appendFrame(c.wbuf, len(okTrailers), frameHeaders, flagEndHeaders|flagEndStream, st.id)
		c.wbuf = append(c.wbuf, okTrailers...)
		c.endLocked(st)
		c.flushLocked()
		return
	}
	var block []byte
	if !st.headersSent {
		block = c.appendTrailersOnlyLocked(nil, st.id, 200, code, msg)
	} else {
		block = appendFrame(nil, 0, frameHeaders, flagEndHeaders|flagEndStream, st.id)
		block = appendStatus(block, uint32(code), msg)
		patchLength(block, 9)
	}
	if st.pending != nil {
		st.trailers = block // after the data the windows hold back
	} else {
		c.wbuf = append(c.wbuf, block...)
		c.endLocked(st)
	}
	c.flushLocked()
}

// okTrailers is the trailer block of a call that ends OK.
var okTrailers = appendStatus(nil, uint32(codes.OK), "")

// endLocked finishes st once its trailers are in the write buffer.
func (c *conn) endLocked(st *Stream) {
	if !st.ended {
		c.wbuf = appendRST(c.wbuf, st.id, codeNo)
	}
	st.reset = true
	c.releaseLocked(st)
}

// appendTrailersOnlyLocked appends a HEADERS frame that answers stream sid
// with status code and msg and ends it.
func (c *conn) appendTrailersOnlyLocked(b []byte, sid uint32, httpStatus int, code codes.Code, msg string) []byte {
	b = appendFrame(b, 0, frameHeaders, flagEndHeaders|flagEndStream, sid)
	start := len(b)
	b = appendResponseHeaders(b, httpStatus)
	b = appendStatus(b, uint32(code), msg)
	patchLength(b, start)
	return b
}

// waitRoomLocked waits while the write buffer is full and a write is
// under way.
func (c *conn) waitRoomLocked() {
	for len(c.wbuf) >= maxBuffered && c.flushing && c.werr == nil {
		c.room.Wait()
	}
}

// flushLocked writes the write buffer, and what is appended to it while
// it writes, unless another goroutine is writing already (it writes what
// this one appended). c.mu is held, and released during each write.
func (c *conn) flushLocked() {
	if c.flushing {
		return
	}
	c.flushing = true
	// Let the goroutines that are ready to run (the calls answering now)
	// append their answers first, so that one write carries them all: a
	// write costs a system call, and each goroutine that finds this one
	// writing leaves its answer for it.
	c.mu.Unlock()
	runtime.Gosched()
	c.mu.Lock()
	for len(c.wbuf) > 0 && c.werr == nil {
		b := c.wbuf
		c.wbuf, c.spare = c.spare[:0], nil
		c.mu.Unlock()
		c.nc.SetWriteDeadline(time.Now().Add(c.s.opts.WriteTimeout))
		_, err := c.nc.Write(b)
		c.mu.Lock()
		if err != nil && c.werr == nil {
			c.werr = err
			c.nc.Close() // the reader ends, and with it the connection
		}
		if cap(b) <= 64<<10 {
			c.spare = b[:0]
		}
		c.room.Broadcast()
	}
	if c.werr != nil {
		c.wbuf = c.wbuf[:0]
	}
	c.flushing = false
	if c.goneAway && c.open == 0 && c.werr == nil {
		c.closeWriteLocked()
	}
}
