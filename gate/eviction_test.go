package gate_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/logtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestEvictingStoreIsWarnedOf: a Redis that may evict keys (a memory limit
// with an eviction policy, a managed service's default) can drop a
// tenant's counter and keep its generation marker, so that the loss goes
// unseen and the tenant spends its limit again. Opening a gate on such a
// Redis says so; on one that never evicts it says nothing.
func TestEvictingStoreIsWarnedOf(t *testing.T) {
	for _, tc := range []struct {
		maxmemory, policy string
		warned            bool
	}{
		{"0", "volatile-lru", false}, // no memory limit: nothing is evicted
		{"100mb", "noeviction", false},
		{"100mb", "volatile-lru", true},
		{"100mb", "allkeys-lfu", true},
	} {
		t.Run(tc.maxmemory+"/"+tc.policy, func(t *testing.T) {
			srv := redistest.New(t)
			c := srv.Client(t)
			ctx := context.Background()
			if err := c.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
				t.Fatal(err)
			}
			var logs logtest.Buffer
			cfg := mustParse(t, fmt.Sprintf("admin_token: t\ndata_dir: %q\nstore: {redis: %q}\n", t.TempDir(), srv.URL))
			g, err := gate.Open(ctx, cfg, gate.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if got := strings.Contains(logs.String(), "may evict keys"); got != tc.warned {
				t.Fatalf("warned %v, want %v; logs:\n%s", got, tc.warned, logs.String())
			}
		})
	}
}
