package rls

// The server's default transport: grpcwire, a gRPC server of the calls it
// serves (ShouldRateLimit, the health service's Check and Watch) that
// costs a decision a fraction of what grpc-go's server does. grpc-go's
// serves instead when the gRPC reflection service is on, or a caller gives
// grpc-go server options (see Options).

import (
	"context"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/costgate/costgate/internal/grpcwire"
)

const (
	pathShouldRateLimit = "/" + "envoy.service.ratelimit.v3.RateLimitService" + "/ShouldRateLimit"
	pathHealthCheck     = "/grpc.health.v1.Health/Check"
	pathHealthWatch     = "/grpc.health.v1.Health/Watch"
)

func (s *Server) newWire() *grpcwire.Server {
	w := grpcwire.NewServer(grpcwire.Options{Logger: s.log})
	w.HandleUnary(pathShouldRateLimit, s.wireDecide)
	w.HandleUnary(pathHealthCheck, s.wireHealthCheck)
	w.Handle(pathHealthWatch, s.wireHealthWatch)
	return w
}

// wireDecide is ShouldRateLimit on grpcwire.
func (s *Server) wireDecide(ctx context.Context, in []byte, st *grpcwire.Stream) error {
	var req rlsv3.RateLimitRequest
	if err := unmarshalRequest(in, &req); err != nil {
		return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	resp, err := s.ShouldRateLimit(ctx, &req)
	if err != nil {
		return err
	}
	b, err := marshalResponse(resp)
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	return st.Send(b)
}

func (s *Server) wireHealthCheck(ctx context.Context, in []byte, st *grpcwire.Stream) error {
	req, err := healthRequest(in)
	if err != nil {
		return err
	}
	resp, err := s.health.Check(ctx, req)
	if err != nil {
		return err
	}
	return sendProto(st, resp)
}

// wireHealthWatch is the health service's Watch: the status now, then
// each change, until the client ends the call or the server stops (the
// status NOT_SERVING then, and the call ends CANCELLED).
//
// The server's stop shuts the health service down first, which queues
// NOT_SERVING for the watch, and then ends the call; the health server's
// Watch picks at random between a queued status and its call's end, so
// that ending the call at the stop lost the NOT_SERVING now and then
// (CI's TestHealthWatch). The call ends once the watch has sent it, or
// after watchStopGrace when it does not come.
func (s *Server) wireHealthWatch(ctx context.Context, in []byte, st *grpcwire.Stream) error {
	req, err := healthRequest(in)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	down := make(chan struct{})
	go func() {
		select {
		case <-s.wire.Stopping():
			t := time.NewTimer(watchStopGrace)
			defer t.Stop()
			select {
			case <-down:
			case <-ctx.Done():
			case <-t.C:
			}
		case <-ctx.Done():
		}
		cancel()
	}()
	return s.health.Watch(req, watchStream{ctx: ctx, st: st, down: down, once: new(sync.Once)})
}

// watchStopGrace bounds how long a watch's call outlives the server's
// stop when the health service's NOT_SERVING does not come.
const watchStopGrace = time.Second

// healthRequest reads a health service's request, or answers as grpc-go
// does a request it cannot read.
func healthRequest(in []byte) (*healthpb.HealthCheckRequest, error) {
	req := new(healthpb.HealthCheckRequest)
	if err := proto.Unmarshal(in, req); err != nil {
		return nil, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	return req, nil
}

func sendProto(st *grpcwire.Stream, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	return st.Send(b)
}

// watchStream is a Watch call's stream as the health server sends on it;
// down is closed (once) when it has sent NOT_SERVING. The health server
// keys its watches by their stream: every field is comparable.
type watchStream struct {
	ctx  context.Context
	st   *grpcwire.Stream
	down chan struct{}
	once *sync.Once
}

var _ grpc.ServerStreamingServer[healthpb.HealthCheckResponse] = watchStream{}

func (w watchStream) Send(m *healthpb.HealthCheckResponse) error {
	err := sendProto(w.st, m)
	if err == nil && m.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
		w.once.Do(func() { close(w.down) })
	}
	return err
}
func (w watchStream) Context() context.Context     { return w.ctx }
func (w watchStream) SetHeader(metadata.MD) error  { return nil }
func (w watchStream) SendHeader(metadata.MD) error { return nil }
func (w watchStream) SetTrailer(metadata.MD)       {}
func (w watchStream) RecvMsg(any) error {
	return status.Error(codes.Internal, "grpcwire: no more messages on a server-streaming call")
}
func (w watchStream) SendMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "grpcwire: cannot send a %T", m)
	}
	return sendProto(w.st, pm)
}
