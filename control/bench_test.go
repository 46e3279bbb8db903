package control

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/gate"
)

// loadKeys fills a directory with n keys, each with a daily budget, in
// n/1000 tenants of 10 teams each, and returns the keys' secrets.
func loadKeys(d *Directory, n int) []string {
	secrets := make([]string, n)
	var ents []*Entity
	for t := range max(n/1000, 1) {
		tenant := fmt.Sprintf("tenant-%d", t)
		ents = append(ents, &Entity{ID: tenant, Kind: KindTenant, Tenant: tenant, Name: tenant, Plan: "pro", Active: true,
			Budgets: []Budget{{ID: "month", AmountUSD: "1000", Period: "month"}}})
		for m := range 10 {
			ents = append(ents, &Entity{ID: fmt.Sprintf("team_%d_%d", t, m), Kind: KindTeam, Tenant: tenant, Name: fmt.Sprintf("team-%d", m), Active: true,
				Budgets: []Budget{{ID: "day", AmountUSD: "100", Period: "day"}}})
		}
	}
	for i := range n {
		secrets[i] = newSecret()
		tenant := fmt.Sprintf("tenant-%d", i%max(n/1000, 1))
		ents = append(ents, &Entity{ID: fmt.Sprintf("key_%012x", i), Kind: KindKey, Tenant: tenant, Team: fmt.Sprintf("team-%d", i%10),
			Active: true, hash: hashHex(secrets[i]), Budgets: []Budget{{ID: "day", AmountUSD: "1.00", Period: "day"}}})
	}
	d.Apply(ents, 1)
	return secrets
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkIdentify100k identifies callers among 100,000 control-plane
// keys (each with a daily budget, under a team and a tenant with budgets
// of their own) through the gate, as the request path does: one SHA-256,
// the configuration's key map, the directory. It reports the key table's
// heap (MB-keytable) and the median of batches of 64 lookups (p50-ns).
func BenchmarkIdentify100k(b *testing.B) {
	const n = 100_000
	before := heapInUse()
	d := NewDirectory()
	secrets := loadKeys(d, n)
	after := heapInUse()
	cfg, err := config.Parse(fmt.Appendf(nil, "admin_token: bench\ndata_dir: %q\n", b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	g, err := gate.Open(context.Background(), cfg, gate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	g.SetDirectory(d)
	// The secrets themselves are the test's, not the table's: 100,000
	// strings of 68 bytes.
	table := float64(after-before-uint64(n)*(68+16)) / (1 << 20)
	if g.Identify(secrets[7]) == nil {
		b.Fatal("a loaded key is not identified")
	}
	const batch = 64
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		start := time.Now()
		for j := range batch {
			if g.Identify(secrets[(i+j)%n]) == nil {
				b.Fatal("unknown")
			}
		}
		samples = append(samples, time.Since(start)/batch)
	}
	b.StopTimer()
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(table, "MB-keytable")
	runtime.KeepAlive(d)
}

// BenchmarkIdentifyParallel100k is the same lookup from every core.
func BenchmarkIdentifyParallel100k(b *testing.B) {
	const n = 100_000
	d := NewDirectory()
	secrets := loadKeys(d, n)
	cfg, err := config.Parse(fmt.Appendf(nil, "admin_token: bench\ndata_dir: %q\n", b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	g, err := gate.Open(context.Background(), cfg, gate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	g.SetDirectory(d)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if g.Identify(secrets[i%n]) == nil {
				b.Fatal("unknown")
			}
			i += 7919
		}
	})
}
