package rls_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/rls"
)

// BenchmarkShouldRateLimit is one decision over loopback gRPC, with the
// descriptors of bench/rls.sh (1: [tenant]; 3: [tenant], [tenant,
// generic_key], [remote_address]) on examples/envoy/costgate.yaml's
// limits, spread over 1000 tenants; every decision is allowed. The
// client's CPU is in the figure too.
//
// The direct/ runs call the Server's method in process, without gRPC: the
// decision alone. The grpc-go/ runs serve with grpc-go's server instead
// of grpcwire. The leased runs are on Redis with the benchmark's
// descriptor limits leased as bench/rls.sh leases them (its default
// RLS_BENCH_LEASE).
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, mode := range []string{"memory", "redis", "leased", "grpc-go/memory", "grpc-go/redis", "direct/memory", "direct/redis", "direct/leased"} {
		store, direct := strings.CutPrefix(mode, "direct/")
		store, grpcGo := strings.CutPrefix(store, "grpc-go/")
		leased := store == "leased"
		if leased {
			store = "redis"
		}
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("%s/%d", mode, n), func(b *testing.B) {
				path := filepath.Join(exampleDir, "costgate.yaml")
				if leased {
					path = benchLeasedConfig(b, path)
				}
				cfg, err := config.Load(path)
				if err != nil {
					b.Fatal(err)
				}
				cfg.DataDir = b.TempDir()
				if store == "redis" {
					cfg.Store.Redis = redistest.New(b).URL
				}
				e := &env{}
				e.open(b, cfg, rls.Options{GRPCGo: grpcGo})
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
				cpu0 := processCPU()
				defer func() {
					// The ledger's writes of the calls' entries are
					// their cost too: the store's, in the background,
					// mostly after the last call.
					if err := e.g.Ledger().Flush(context.Background()); err != nil {
						b.Error(err)
					}
					b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
				}()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					for pb.Next() {
						call := e.client.ShouldRateLimit
						if direct {
							call = func(ctx context.Context, req *rlsv3.RateLimitRequest, _ ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
								return e.srv.ShouldRateLimit(ctx, req)
							}
						}
						resp, err := call(ctx, reqs[next.Add(1)%keys])
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

// benchLeasedConfig writes a copy of the config at path whose limits of a
// billion requests a minute (the benchmark's descriptors') are leased as
// bench/rls.sh leases them, and returns the copy's path.
func benchLeasedConfig(b *testing.B, path string) string {
	text, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	const strict = "requests_per_unit: 1000000000}"
	if !bytes.Contains(text, []byte(strict)) {
		b.Fatalf("%s has no limit of %q to lease", path, strict)
	}
	text = bytes.ReplaceAll(text, []byte(strict), []byte("requests_per_unit: 1000000000, lease: {max_share: 0.01, ttl: 10s}}"))
	out := filepath.Join(b.TempDir(), "costgate.yaml")
	if err := os.WriteFile(out, text, 0o600); err != nil {
		b.Fatal(err)
	}
	return out
}

// processCPU is the CPU time this process has used, user and system, all
// threads: the client's and the server's in the gRPC runs.
func processCPU() int64 {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0
	}
	return r.Utime.Nano() + r.Stime.Nano()
}

// BenchmarkLongValues is one decision in process on the memory store
// whose tenant and address are each a value of 60 KiB of '%' (a client
// header Envoy copies, within its default 60 KiB header limit; '%' reads
// as three bytes): what a client pays the server for values far beyond
// what a reading keeps.
func BenchmarkLongValues(b *testing.B) {
	cfg, err := config.Load(filepath.Join(exampleDir, "costgate.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	cfg.DataDir = b.TempDir()
	e := &env{}
	e.open(b, cfg, rls.Options{})
	v := strings.Repeat("%", 60<<10)
	req := &rlsv3.RateLimitRequest{Domain: "costgate", HitsAddend: 1,
		Descriptors: []*commonv3.RateLimitDescriptor{d("tenant", v), d("remote_address", v)}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.srv.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
