package rls_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/costgate/costgate/rls"
)

// TestRLSAtkRefusedSpendNoSharedCounter: a descriptor shared by every
// tenant (the client address, a route) is debited with the tenant's in
// one request, all or nothing. A tenant whose requests are refused
// anyway, by its own limit, a policy or a blocked descriptor, spends none
// of the shared counter: another tenant behind the same address is
// admitted after them.
func TestRLSAtkRefusedSpendNoSharedCounter(t *testing.T) {
	for _, tc := range []struct {
		name string
		evil []string // the refused tenant's descriptor
	}{
		{"own limit spent", []string{"tenant", "acme", "generic_key", "search"}},
		{"policy refuses", []string{"tenant", "globex"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stores(t, func(t *testing.T, redis bool) {
				dir := t.TempDir()
				if err := os.WriteFile(filepath.Join(dir, "rlstest.rego"), []byte(rlsPolicy), 0o600); err != nil {
					t.Fatal(err)
				}
				e := newEnv(t, testConfig+"policies: {dir: '"+dir+"'}\n", redis, rls.Options{})
				ip := d("remote_address", "10.9.9.9")
				refused := 0
				for range 8 {
					if resp := e.ask(t, "edge", 1, d(tc.evil...), ip); resp.GetOverallCode() == OVER {
						refused++
					}
				}
				if refused < 6 {
					t.Fatalf("%d of 8 refused", refused)
				}
				// per-ip: 4 a minute; at most 2 of evil's were admitted.
				if got := codes_(e.ask(t, "edge", 1, d("tenant", "other"), ip)); got != "OK OK OK" {
					t.Errorf("another tenant behind the address after %d refused requests: %s", refused, got)
				}
			})
		})
	}
}
