package grpcwire

import (
	"context"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// servingAnswer is a HealthCheckResponse of SERVING.
var servingAnswer = func() []byte {
	b, err := proto.Marshal(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
	if err != nil {
		panic(err)
	}
	return b
}()

// checkHandler answers the health service's Check with SERVING.
func checkHandler(_ context.Context, in []byte, st *Stream) error {
	var req healthpb.HealthCheckRequest
	if err := proto.Unmarshal(in, &req); err != nil {
		return err
	}
	return st.Send(servingAnswer)
}

// grpcHealth is a health server for grpc-go that answers SERVING.
type grpcHealth struct {
	healthpb.UnimplementedHealthServer
}

func (grpcHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// serveWire starts a Server with the Check handler on loopback.
func serveWire(tb testing.TB, opts Options) (*Server, string) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := NewServer(opts)
	s.HandleUnary("/grpc.health.v1.Health/Check", checkHandler)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	tb.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			tb.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

// serveGRPC starts grpc-go's server with the same Check on loopback.
func serveGRPC(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := grpc.NewServer(grpc.NumStreamWorkers(64))
	healthpb.RegisterHealthServer(s, grpcHealth{})
	go s.Serve(ln)
	tb.Cleanup(s.Stop)
	return ln.Addr().String()
}

func dial(tb testing.TB, addr string) *grpc.ClientConn {
	tb.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkUnary compares one unary call's cost, client and server in
// one process, on grpcwire and on grpc-go's server, with 64 calls in
// flight over one connection: cpu-us/op is the process's CPU per call,
// the client's the same on both.
func BenchmarkUnary(b *testing.B) {
	for _, tc := range []struct {
		name  string
		serve func(testing.TB) string
	}{
		{"grpcwire", func(tb testing.TB) string { _, a := serveWire(tb, Options{}); return a }},
		{"grpc-go", serveGRPC},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := healthpb.NewHealthClient(dial(b, tc.serve(b)))
			ctx := context.Background()
			if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
			const inFlight = 64
			var next sync.Mutex
			n := 0
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			var wg sync.WaitGroup
			for range inFlight {
				wg.Go(func() {
					for {
						next.Lock()
						if n >= b.N {
							next.Unlock()
							return
						}
						n++
						next.Unlock()
						if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
		})
	}
}
