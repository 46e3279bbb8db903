package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
)

// Lease and region errors name their field; a valid lease becomes the
// weighted policy it states.
func TestLeaseAndRegionsConfig(t *testing.T) {
	base := "admin_token: x\nupstreams: [{name: openai, kind: openai, base_url: 'http://127.0.0.1:1'}]\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"share zero", base + "limits: [{name: a, rate: 10, period: 1s, lease: {max_share: 0}}]\n", "limits[0].lease.max_share"},
		{"share above one", base + "limits: [{name: a, rate: 10, period: 1s, lease: {max_share: 1.5}}]\n", "limits[0].lease.max_share"},
		{"share not a number", base + "limits: [{name: a, rate: 10, period: 1s, lease: {max_share: .nan}}]\n", "limits[0].lease.max_share"},
		{"negative ttl", base + "limits: [{name: a, rate: 10, period: 1s, lease: {max_share: 0.1, ttl: -1s}}]\n", "limits[0].lease.ttl"},
		{"ttl too long", base + "limits: [{name: a, rate: 10, period: 1s, lease: {max_share: 0.1, ttl: 2h}}]\n", "limits[0].lease.ttl"},
		{"concurrency", base + "limits: [{name: a, algorithm: concurrency, rate: 10, period: 1s, lease: {max_share: 0.1}}]\n", "limits[0].lease: a concurrency limit cannot be leased"},
		{"unknown lease field", base + "limits: [{name: a, rate: 10, period: 1s, lease: {share: 0.1}}]\n", "field share not found"},
		{"budget share", base + "budgets: [{name: b, amount: '1', lease: {max_share: 2}}]\n", "budgets[0].lease.max_share"},
		{"regions without region", base + "ledger: {dsn: 'postgres://x@127.0.0.1/db'}\nregions: {names: [eu, us]}\n", "region: required with regions"},
		{"region not listed", base + "region: ap\nledger: {dsn: 'postgres://x@127.0.0.1/db'}\nregions: {names: [eu, us]}\n", `region: "ap" is not one of`},
		{"regions without postgres", base + "region: eu\nregions: {names: [eu, us]}\n", "ledger.dsn: regions share their budgets through PostgreSQL"},
		{"regions share", base + "region: eu\nledger: {dsn: 'postgres://x@127.0.0.1/db'}\nregions: {names: [eu], min_share: -1}\n", "regions.min_share"},
		{"no names", base + "region: eu\nledger: {dsn: 'postgres://x@127.0.0.1/db'}\nregions: {interval: 1s}\n", "regions.names: required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	cfg, err := config.Parse([]byte(base + "limits: [{name: a, rate: 1000, period: 1s, burst: 2000, lease: {max_share: 0.1, ttl: 3s}}, {name: b, rate: 5, period: 1s, lease: {max_share: 0.01}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		max int64
		ttl time.Duration
	}{{200, 3 * time.Second}, {1, 0}} {
		wl, err := cfg.Limits[i].Weighted()
		if err != nil || wl.Lease.Max != want.max || wl.Lease.TTL != want.ttl {
			t.Fatalf("limit %d: %+v %v, want max %d ttl %s", i, wl.Lease, err, want.max, want.ttl)
		}
	}
	if m := cfg.Limits[0].Lease.Mode(); m != "leased" {
		t.Fatalf("mode %q", m)
	}
	cfg, err = config.Parse([]byte(base + "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {name: ra, unit: minute, requests_per_unit: 500, lease: {max_share: 0.1, ttl: 4s}}}, {key: b, rate_limit: {name: rb, unit: minute, requests_per_unit: 5}}]}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rl := cfg.RLS.Limits()
	if len(rl) != 2 || rl[0].Name != "ra" || rl[1].Name != "rb" {
		t.Fatalf("RLS limits %v", rl)
	}
	if wl, err := rl[0].Weighted(); err != nil || wl.Lease.Max != 50 || wl.Lease.TTL != 4*time.Second {
		t.Fatalf("RLS limit ra: %+v %v, want max 50 ttl 4s", wl.Lease, err)
	}
	if wl, err := rl[1].Weighted(); err != nil || wl.Lease.On() {
		t.Fatalf("RLS limit rb without lease: %+v %v, want strict", wl.Lease, err)
	}
	var strict *config.LeaseConfig
	if strict.Mode() != "strict" || strict.Weighted(10).On() {
		t.Fatal("a nil lease is not strict")
	}
}
