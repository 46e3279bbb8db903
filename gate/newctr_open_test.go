//go:build open_issues

// Reproductions of known open bugs, kept out of CI (go test -tags
// open_issues ./gate/ runs them): see the README, "Known limitations".

package gate_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
)

// TestNewCtrAtkLeasedReload: the same change on a leased budget
// (lease:), whose decisions come from this replica's local leases: 0.006
// of the $0.01 spent, a reload renames it or makes it monthly while 8
// callers reserve $0.001 each; at most the $0.004 left may be admitted.
func TestNewCtrAtkLeasedReload(t *testing.T) {
	const lease = ", lease: {max_share: 0.5, ttl: 1m}"
	for _, tc := range []struct{ name, after string }{
		{"renamed", "name: daily-usd" + lease},
		{"monthly", "name: daily, period: month" + lease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, dir := redistest.New(t), t.TempDir()
			store := fmt.Sprintf("redis: %q", srv.URL)
			g := openYAML(t, newCtrAtkYAML(dir, store, "", "name: daily"+lease))
			acme := g.Identify("cg-acme")
			if n, _ := admitN(t, g, acme, costmodel.Estimate{Cost: usd("0.001")}, 6); n != 6 {
				t.Fatalf("spending $0.006: %d admitted", n)
			}
			var wg sync.WaitGroup
			var n int64
			wg.Go(func() { n = newCtrAtkHammer(t, g, "cg-acme", 8, 10) })
			if err := g.Apply(mustParse(t, newCtrAtkYAML(dir, store, "", tc.after))); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			n += newCtrAtkHammer(t, g, "cg-acme", 4, 5)
			if n > 4 {
				t.Errorf("a leased $0.01 budget with $0.006 spent, %s under load: %d of $0.001 admitted, at most 4 fit", tc.name, n)
			}
		})
	}
}
