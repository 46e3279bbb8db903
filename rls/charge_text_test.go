package rls_test

import (
	"context"
	"math"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// TestChargeWithNULModelIsCounted: usage already served (a token
// charge) is "counted whether or not Envoy waits for the answer, and
// whatever the limits say" (server.go). A model value that the ledger
// cannot store (a NUL byte) must not make the charge vanish from the
// tenant's limits and from the ledger.
func TestChargeWithNULModelIsCounted(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		// 2000 input tokens served, twice free-tokens' 1000 a minute:
		// the bucket owes 1000 beyond empty (a minute of its refill), so
		// the next check must be refused however long a loaded machine
		// takes to send it.
		resp := e.ask(t, "edge", 0, hits(2000, d("tenant", "acme", "model", "test-model\x00", "tokens", "input")))
		t.Logf("charge: %s %v", codes_(resp), resp.GetStatuses()[0])
		resp = e.ask(t, "edge", 0, hits(0, d("tenant", "acme", "model", "test-model", "tokens", "input")))
		if resp.GetOverallCode() != OVER {
			t.Errorf("check after a charge of 1000 tokens: %s; want OVER_LIMIT (free-tokens spent)", codes_(resp))
		}
		ctx := context.Background()
		if err := e.g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
		if err != nil || len(page.Entries) != 1 {
			t.Errorf("ledger entries %+v (%v); want the charge's one", page.Entries, err)
		}
	})
}

// TestSameDescriptorTwiceAllOrNothing: the same descriptor twice in one request
// is debited twice, all or nothing.
func TestSameDescriptorTwiceAllOrNothing(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		s := func() *commonv3.RateLimitDescriptor { return d("tenant", "globex", "generic_key", "search") }
		// search: 2 a minute. Three at once is refused and debits nothing.
		if resp := e.ask(t, "edge", 1, s(), s(), s()); resp.GetOverallCode() != OVER {
			t.Fatalf("three searches against 2/min: %s", codes_(resp))
		}
		if resp := e.ask(t, "edge", 1, s(), s()); resp.GetOverallCode() != OK {
			t.Fatalf("two searches after a refusal: %s", codes_(resp))
		}
		if resp := e.ask(t, "edge", 1, s()); resp.GetOverallCode() != OVER {
			t.Fatalf("third search: %s", codes_(resp))
		}
		// hits_addend near the uint64 maximum: a clear refusal.
		if resp := e.ask(t, "edge", 0, hits(math.MaxUint64, d("tenant", "globex", "generic_key", "other"))); resp.GetOverallCode() != OK {
			t.Logf("huge hits on an unlimited path: %s", codes_(resp))
		}
		if resp := e.ask(t, "edge", 0, hits(math.MaxUint64, d("tok", "x"))); resp.GetOverallCode() != OK {
			t.Logf("huge token charge: %s", codes_(resp))
		}
		if resp := e.ask(t, "edge", math.MaxUint32, d("tenant", "globex", "generic_key", "search")); resp.GetOverallCode() != OVER {
			t.Errorf("huge request hits: %s", codes_(resp))
		}
	})
}
