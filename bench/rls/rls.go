package main

import (
	"context"
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// rlsCaller sends Envoy RLS v3 ShouldRateLimit requests, one per decision,
// built once per key index and reused (gRPC only reads them). It is safe
// for concurrent use.
type rlsCaller struct {
	clients []rlsv3.RateLimitServiceClient
	reqs    []*rlsv3.RateLimitRequest // by key index
}

var _ caller = (*rlsCaller)(nil)

func newRLSCaller(conns []*grpc.ClientConn, domain string, p pattern, keys int, hits uint32) *rlsCaller {
	c := &rlsCaller{reqs: make([]*rlsv3.RateLimitRequest, keys)}
	for _, conn := range conns {
		c.clients = append(c.clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	for i := range keys {
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
		for d := range p {
			desc := &ratelimitv3.RateLimitDescriptor{}
			for _, e := range p.expand(d, i) {
				desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.key, Value: e.value})
			}
			req.Descriptors = append(req.Descriptors, desc)
		}
		c.reqs[i] = req
	}
	return c
}

func (c *rlsCaller) call(ctx context.Context, worker, key int) (bool, error) {
	resp, err := c.clients[worker%len(c.clients)].ShouldRateLimit(ctx, c.reqs[key])
	if err != nil {
		return false, err
	}
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
		return false, nil
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return true, nil
	}
	return false, fmt.Errorf("rls: overall code %v", resp.GetOverallCode())
}
