package gate

import (
	"context"
	"fmt"
	"testing"
)

// TestIsolationAtkIPv6AddressesOfOneHost: a per-IP limit (dimensions
// [ip], across tenants) keyed by the whole 128-bit address is no limit on
// an IPv6 client: a host is given a /64 and picks any address in it, a
// fresh key per request (RFC 4941 privacy addresses do it on their own).
// Held: the addresses of one /64 share one key, an IPv4 address and its
// IPv4-mapped IPv6 form share one, and other /64s and addresses keep
// keys of their own.
func TestIsolationAtkIPv6AddressesOfOneHost(t *testing.T) {
	g := openTwoTenants(t, `  - {name: per-ip, dimensions: [ip], unit: requests, algorithm: fixed_window, rate: 3, period: 1h}`)
	ctx := context.Background()
	acme := g.Identify("cg-acme")
	admit := func(ip string) bool {
		t.Helper()
		res, _ := g.Reserve(ctx, &Request{Caller: acme, Route: "/v1/chat/completions", IP: ip})
		if res == nil {
			return false
		}
		res.Settle(ctx, Charge{HTTPStatus: 200})
		return true
	}
	admitted := 0
	for i := range 10 {
		if admit(fmt.Sprintf("2001:db8:1:2:%x::%x", i, i+1)) {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("%d requests from ten addresses of one /64 admitted under per-ip's 3 an hour", admitted)
	}
	admitted = 0
	for _, ip := range []string{"192.0.2.7", "::ffff:192.0.2.7", "::ffff:c000:207", "192.0.2.7", "::FFFF:192.0.2.7"} {
		if admit(ip) {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("%d requests from 192.0.2.7 in its spellings admitted under per-ip's 3 an hour", admitted)
	}
	for _, ip := range []string{"2001:db8:1:3::1", "192.0.2.8", "::ffff:192.0.2.9"} {
		if !admit(ip) {
			t.Errorf("a request from %s, another host, was refused", ip)
		}
	}
}
