package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// nullRLS is an Envoy RLS v3 server that decides nothing: every request is
// answered OK, with one OK status per descriptor and no limit. Its CPU
// and latency per call are what any Go RLS server (grpc-go and the
// generated protobuf code) pays before it decides anything: the floor of
// costgate's and gubernator's figures.
type nullRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (nullRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return resp, nil
}

// serveNull is the child process's role (-serve-null): serve nullRLS on
// addr, print "null: listening on ADDR" on stdout, and serve until stdin
// reaches its end or a SIGINT or SIGTERM arrives.
func serveNull(addr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("null: %w", err)
	}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, nullRLS{})
	go s.Serve(l)
	defer s.Stop()
	fmt.Printf("null: listening on %s\n", l.Addr())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	<-ctx.Done()
	return nil
}
