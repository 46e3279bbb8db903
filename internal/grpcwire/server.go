// Package grpcwire is a gRPC server for unary and server-streaming calls
// over HTTP/2 without TLS (h2c, "prior knowledge"), the way Envoy and
// grpc-go clients reach a rate limit service. It speaks the same protocol
// as grpc-go's server (RFC 9113 framing, HPACK, flow control, the gRPC
// message prefix, grpc-status and grpc-message trailers) but does less
// per call: one goroutine per connection reads every frame, a call runs
// on a goroutine of its own with its request read whole, and its answer
// is appended to the connection's write buffer, which the first writer
// that finds no write under way flushes, taking with it every answer
// appended meanwhile. A decision that takes microseconds then costs few
// more in the transport: grpc-go hands each call between three goroutines
// (reader, handler, writer) and allocates several objects per frame.
//
// What it does not do: TLS, compression (a compressed message is
// answered UNIMPLEMENTED), client-streaming calls, server push, and
// anything grpc-go's server options configure (interceptors, keepalive
// enforcement, reflection). A caller that needs those serves grpc-go.
//
// Bounds: a request message of at most MaxRecvMsgSize bytes (default
// 4 MiB, grpc-go's); at most MaxConcurrentStreams calls open per
// connection, advertised in SETTINGS, and a stream past them refused
// (REFUSED_STREAM) while the calls that finished keep theirs until their
// handlers return, so that a client resetting streams cannot pile up
// handlers (the "rapid reset" attack); a header block of at most 64 KiB
// however many CONTINUATION frames carry it; the request bytes a
// connection holds bounded by its receive window (8 MiB); and answers
// waiting to be written bounded (1 MiB) before handlers wait, with a write
// that makes no progress for WriteTimeout closing the connection, so that
// a client that stops reading holds a connection, never the process's
// memory.
package grpcwire

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Handler answers one call. req is the request message, valid until the
// handler returns. It sends its answers with st.Send (a unary call's one
// message) and returns the call's status: nil is OK, an error carrying a
// gRPC status (status.Error) that status, any other error UNKNOWN with its
// text. ctx is cancelled when the client resets the stream or the
// connection ends, and carries the client's grpc-timeout as its deadline.
type Handler func(ctx context.Context, req []byte, st *Stream) error

// Options are a Server's settings. The zero value of each field is its
// default.
type Options struct {
	// MaxRecvMsgSize is the largest request message accepted, in bytes;
	// a larger one is answered RESOURCE_EXHAUSTED. Default 4 MiB.
	MaxRecvMsgSize int
	// MaxConcurrentStreams is the number of calls a connection may have
	// open at once, advertised to the client. Default 1,024.
	MaxConcurrentStreams int
	// WriteTimeout closes a connection whose write makes no progress for
	// this long (a client that stops reading). Default 20 s.
	WriteTimeout time.Duration
	// HandshakeTimeout closes a connection that has not sent the HTTP/2
	// preface within this long. Default 10 s.
	HandshakeTimeout time.Duration
	// Logger receives the server's logs; nil logs nowhere.
	Logger *slog.Logger
}

const (
	defaultMaxRecv    = 4 << 20
	defaultMaxStreams = 1024
	defaultWriteWait  = 20 * time.Second
	defaultHandshake  = 10 * time.Second
)

// ErrServerStopped is what Serve returns when it is called after Stop or
// GracefulStop.
var ErrServerStopped = errors.New("grpcwire: the server has stopped")

// Server serves registered methods on the listeners given to Serve. Its
// methods are safe for concurrent use; Handle and HandleUnary must be
// called before Serve.
type Server struct {
	opts    Options
	log     *slog.Logger
	methods map[string]method // by path, "/package.Service/Method"

	ctx    context.Context // cancelled by Stop
	cancel context.CancelFunc

	mu       sync.Mutex
	lis      map[net.Listener]struct{}
	conns    map[*conn]struct{}
	draining bool          // GracefulStop or Stop called
	stopping chan struct{} // closed when draining becomes true
	conwg    sync.WaitGroup
	calls    sync.WaitGroup // handlers running

	work    chan call    // to an idle worker
	workers atomic.Int32 // workers running
}

// maxWorkers is the number of goroutines kept to run calls. A worker
// keeps the stack a call grew (a decision's is deep) for the next call; a
// goroutine started for each call would grow one again each time, which
// costs a tenth of a decision. Calls past the workers idle get a
// goroutine of their own.
const maxWorkers = 256

// call is a call ready to run: its request is whole.
type call struct {
	c   *conn
	st  *Stream
	msg []byte
}

// dispatch runs cl on an idle worker, else on a new goroutine, which
// stays a worker while there are fewer than maxWorkers.
func (s *Server) dispatch(cl call) {
	select {
	case s.work <- cl:
		return
	default:
	}
	if s.workers.Add(1) <= maxWorkers {
		go s.worker(cl)
		return
	}
	s.workers.Add(-1)
	go cl.c.run(cl.st, cl.msg)
}

// worker runs cl, then the calls handed to it, until the server stops.
func (s *Server) worker(cl call) {
	defer s.workers.Add(-1)
	for {
		cl.c.run(cl.st, cl.msg)
		select {
		case cl = <-s.work:
		case <-s.ctx.Done():
			return
		}
	}
}

// NewServer returns a Server with opts; register methods with Handle or
// HandleUnary, then Serve.
func NewServer(opts Options) *Server {
	if opts.MaxRecvMsgSize <= 0 {
		opts.MaxRecvMsgSize = defaultMaxRecv
	}
	if opts.MaxConcurrentStreams <= 0 {
		opts.MaxConcurrentStreams = defaultMaxStreams
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = defaultWriteWait
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = defaultHandshake
	}
	s := &Server{
		opts:     opts,
		log:      opts.Logger,
		methods:  map[string]method{},
		lis:      map[net.Listener]struct{}{},
		conns:    map[*conn]struct{}{},
		stopping: make(chan struct{}),
		work:     make(chan call),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// A method is a registered handler, and whether its calls are unary.
type method struct {
	h     Handler
	unary bool
}

// Handle registers h for path, the call's full method name
// ("/grpc.health.v1.Health/Watch"), as a server-streaming method: each
// message h sends is written as soon as the connection's writer can.
func (s *Server) Handle(path string, h Handler) {
	s.methods[path] = method{h: h}
}

// HandleUnary registers h for path
// ("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit") as a
// unary method: h sends at most one message, which is written with the
// call's trailers when h returns, in one write (a write is a system call,
// and the client's reader wakes once for the answer, not twice).
func (s *Server) HandleUnary(path string, h Handler) {
	s.methods[path] = method{h: h, unary: true}
}

// Serve accepts connections on ln and serves them until Stop or
// GracefulStop, then returns nil. It closes ln when it returns.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		ln.Close()
		return ErrServerStopped
	}
	s.lis[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lis, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var wait time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.draining
			s.mu.Unlock()
			if stopping {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors or a transient failure: back off as
				// net/http does, up to a second.
				wait = min(max(2*wait, 5*time.Millisecond), time.Second)
				s.log.Warn("grpcwire: accept failed; retrying", "err", err, "wait", wait)
				select {
				case <-time.After(wait):
				case <-s.ctx.Done():
				}
				continue
			}
			return err
		}
		wait = 0
		c := newConn(s, nc)
		s.mu.Lock()
		if s.draining {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.conwg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// GracefulStop stops accepting connections, tells each client to open no
// more streams (GOAWAY), and waits for the calls under way to end and
// their answers to be written.
func (s *Server) GracefulStop() {
	s.mu.Lock()
	s.drainLocked()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.goAway()
	}
	s.conwg.Wait()
	s.calls.Wait()
	s.cancel()
}

// Stop closes the listeners and the connections at once and cancels the
// calls under way, then waits for their handlers to return. It works
// before Serve and after GracefulStop.
func (s *Server) Stop() {
	s.mu.Lock()
	s.drainLocked()
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.conwg.Wait()
	s.calls.Wait()
}

// drainLocked marks the server stopping and closes its listeners; s.mu
// is held.
func (s *Server) drainLocked() {
	if !s.draining {
		s.draining = true
		close(s.stopping)
	}
	for ln := range s.lis {
		ln.Close()
	}
}

// Stopping is closed when GracefulStop or Stop begins: a handler that
// waits (a watch) ends its call then.
func (s *Server) Stopping() <-chan struct{} { return s.stopping }

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.conwg.Done()
}
