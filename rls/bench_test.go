package rls_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/rls"
)

// BenchmarkShouldRateLimit is one decision over loopback gRPC, with the
// descriptors of bench/rls.sh (1: [tenant]; 3: [tenant], [tenant,
// generic_key], [remote_address]) on examples/envoy/costgate.yaml's
// limits, spread over 1000 tenants; every decision is allowed. The
// client's CPU is in the figure too.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, store := range []string{"memory", "redis"} {
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("%s/%d", store, n), func(b *testing.B) {
				cfg, err := config.Load(filepath.Join(exampleDir, "costgate.yaml"))
				if err != nil {
					b.Fatal(err)
				}
				cfg.DataDir = b.TempDir()
				if store == "redis" {
					cfg.Store.Redis = redistest.New(b).URL
				}
				e := &env{}
				e.open(b, cfg, rls.Options{})
				const keys = 1000
				reqs := make([]*rlsv3.RateLimitRequest, keys)
				for i := range reqs {
					tenant := fmt.Sprintf("bench-%d", i)
					ds := []*commonv3.RateLimitDescriptor{d("tenant", tenant)}
					if n == 3 {
						ds = append(ds, d("tenant", tenant, "generic_key", "search"), d("remote_address", fmt.Sprintf("10.0.%d.%d", i/256, i%256)))
					}
					reqs[i] = &rlsv3.RateLimitRequest{Domain: "costgate", Descriptors: ds, HitsAddend: 1}
				}
				var next atomic.Int64
				b.SetParallelism(32) // 64 streams on 2 CPUs, as bench/rls.sh
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					for pb.Next() {
						resp, err := e.client.ShouldRateLimit(ctx, reqs[next.Add(1)%keys])
						if err != nil || resp.GetOverallCode() != OK {
							b.Errorf("%v %v", resp, err)
							return
						}
					}
				})
			})
		}
	}
}
