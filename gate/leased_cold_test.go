package gate_test

import (
	"context"
	"testing"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// TestLeasedColdCancel: a request limit of 5 a day, leased (at most
// one unit per replica: every request is a cold key's, debited strictly).
// Ten requests are reserved and cancelled (never reached the upstream):
// strictly each cancel gives its unit back, so all ten are admitted; the
// leased limit must not refuse earlier than the strict one (README "Hot
// keys: leases": a cold key's "requests go to Redis as before").
func TestLeasedColdCancel(t *testing.T) {
	ctx := context.Background()
	url := redistest.New(t).URL
	for _, lease := range []string{"", ", lease: {max_share: 0.2, ttl: 2s}"} {
		limits := `  - {name: rpd, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 5, period: 24h` + lease + `}`
		a := openRedisGate(t, url, limits)
		c := a.Identify("cg-acme")
		admitted := 0
		for range 10 {
			res, d := a.Reserve(ctx, &gate.Request{Caller: c, Route: "/x"})
			if !d.Allowed() {
				continue
			}
			admitted++
			res.Cancel(ctx)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("lease %q: %d of 10 reserved-and-cancelled requests admitted", lease, admitted)
		if admitted != 10 {
			t.Errorf("lease %q: %d of 10 cancelled requests admitted on a limit of 5: the cancels gave nothing back", lease, admitted)
		}
		url = redistest.New(t).URL // the next run on an empty Redis
	}
}
