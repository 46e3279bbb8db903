package rls_test

import (
	"context"
	"testing"
	"time"

	"github.com/costgate/costgate/rls"
)

// hitsConfig gives acme 100 requests a day, and a domain whose priced
// search descriptor debits its hits in requests and whose tokens
// descriptor charges a stream's output tokens: both are recorded in the
// ledger (they cost money).
const hitsConfig = `
admin_token: t
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
limits:
  - {name: daily, dimensions: [tenant], unit: requests, rate: 100, period: 24h, algorithm: fixed_window}
costs:
  prices:
    test-model: {input: "1.00", output: "10.00"}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - {key: generic_key, value: search, price_per_hit: "0.0001"}
            - key: model
              as: model
              descriptors:
                - {key: tokens, value: output, hits: output_tokens}
`

// TestHitsAtkRestoredAsDebited: acme spends 60 of its 100 requests a day
// in one call of hits_addend 60, and Envoy reports a stream's output
// tokens after it (a usage charge, no request); Redis then loses its data
// (FLUSHALL). The restore from the ledger must find 60 requests spent,
// and acme get 40 more. Before, the ledger counted one request per entry:
// 2, and acme got 98.
func TestHitsAtkRestoredAsDebited(t *testing.T) {
	if d := time.Until(time.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)); d < time.Minute {
		time.Sleep(d + 100*time.Millisecond) // spend and check in one day's window
	}
	e := newEnv(t, hitsConfig, true, rls.Options{})
	if r := e.ask(t, "edge", 0, hits(60, d("tenant", "acme", "generic_key", "search"))); r.GetOverallCode() != OK {
		t.Fatalf("a debit of 60 of 100: %s", codes_(r))
	}
	if r := e.ask(t, "edge", 0, hits(500, d("tenant", "acme", "model", "test-model", "tokens", "output"))); r.GetOverallCode() != OK {
		t.Fatalf("a charge of 500 output tokens: %s", codes_(r))
	}
	ctx := context.Background()
	if err := e.g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 200 {
		if e.ask(t, "edge", 1, d("tenant", "acme")).GetOverallCode() != OK {
			break
		}
		admitted++
	}
	if admitted != 40 {
		t.Fatalf("after Redis lost its data: %d requests admitted of the 40 acme had left", admitted)
	}
}
