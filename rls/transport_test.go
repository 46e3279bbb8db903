package rls_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/costgate/costgate/rls"
)

// TestTransportsAnswerAlike: grpcwire, the default transport, and
// grpc-go's server give the same answers and the same errors, call for
// call, to the same sequence of requests on a fresh gate each: allowed,
// refused, unknown domains, bad requests, a descriptor past the bounds,
// tenants the plan limits. Only the time until the window resets may
// differ, by the time between the two calls, in durations and in the
// body's retry time.
func TestTransportsAnswerAlike(t *testing.T) {
	long := strings.Repeat("v", 70_000)
	many := make([]*commonv3.RateLimitDescriptor, 65)
	for i := range many {
		many[i] = d("tenant", "acme")
	}
	reqs := []*rlsv3.RateLimitRequest{
		{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme")}},
		{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme"), d("remote_address", "10.0.0.1")}, HitsAddend: 2},
		{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme")}},
		{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme")}},
		{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "globex")}, HitsAddend: 5},
		{Domain: "nowhere", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme")}},
		{Domain: "", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme")}},
		{Domain: "edge"},
		{Domain: "edge", Descriptors: many},
		{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", long)}},
		{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", "acme", "bad\xffkey", "v")}},
	}
	var answers [2][]string
	for i, grpcGo := range []bool{false, true} {
		e := newEnv(t, testConfig, false, rls.Options{GRPCGo: grpcGo})
		for _, req := range reqs {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := e.client.ShouldRateLimit(ctx, req)
			cancel()
			if resp != nil {
				for _, s := range resp.GetStatuses() {
					s.DurationUntilReset = nil
				}
				for _, h := range resp.GetResponseHeadersToAdd() {
					h.Value = ""
				}
				resp.RawBody = digits.ReplaceAll(resp.RawBody, []byte("#"))
			}
			st := status.Convert(err)
			b, merr := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
			if merr != nil {
				t.Fatal(merr)
			}
			answers[i] = append(answers[i], fmt.Sprintf("%v %q %x", st.Code(), st.Message(), b))
		}
	}
	for k := range reqs {
		if answers[0][k] != answers[1][k] {
			t.Errorf("request %d: grpcwire answered\n%s\ngrpc-go\n%s", k, answers[0][k], answers[1][k])
		}
	}
	if !strings.HasPrefix(answers[0][6], codes.InvalidArgument.String()) {
		t.Errorf("an empty domain: %s, want InvalidArgument", answers[0][6])
	}
}

var digits = regexp.MustCompile(`[0-9]+`)

// TestHealthWatch: the health service's Watch says SERVING, then
// NOT_SERVING when the server stops gracefully, and the stop does not
// wait on the watch, on both transports.
func TestHealthWatch(t *testing.T) {
	for _, grpcGo := range []bool{false, true} {
		t.Run(fmt.Sprint("grpc-go ", grpcGo), func(t *testing.T) {
			e := newEnv(t, testConfig, false, rls.Options{GRPCGo: grpcGo})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			w, err := healthpb.NewHealthClient(e.conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
			if err != nil {
				t.Fatal(err)
			}
			first, err := w.Recv()
			if err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("first: %v, %v", first, err)
			}
			stopped := make(chan struct{})
			go func() {
				e.srv.GracefulStop()
				close(stopped)
			}()
			next, err := w.Recv()
			if err != nil || next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Errorf("after the stop: %v, %v; want NOT_SERVING", next, err)
			}
			if grpcGo {
				// grpc-go's GracefulStop waits for the watch to end.
				cancel()
			}
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				t.Fatal("GracefulStop waits on the watch")
			}
		})
	}
}
