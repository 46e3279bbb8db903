package rls_test

import (
	"context"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/costgate/costgate/rls"
)

// TestRLSAtkChargesOutliveTheLedger: usage already served counts on its
// limits whatever the ledger says, and a request's descriptors may report
// the usage of several parties (two models, two tenants), each charged on
// a call of its own. With the ledger down, the first call that could not
// record made the server answer UNAVAILABLE at once, and the parties after
// it were never charged: of 1,000 tokens served, 500 counted on acme's
// free-tokens (1,000 a minute), and behind a priced debit of globex's that
// could not be recorded, none of acme's. Every party's usage is charged
// before the answer, which stays UNAVAILABLE.
func TestRLSAtkChargesOutliveTheLedger(t *testing.T) {
	tok := func(model string, n uint64) *commonv3.RateLimitDescriptor {
		return hits(n, d("tenant", "acme", "model", model, "tokens", "output"))
	}
	for _, tc := range []struct {
		name  string
		descs func() []*commonv3.RateLimitDescriptor
	}{
		{"two models", func() []*commonv3.RateLimitDescriptor {
			return []*commonv3.RateLimitDescriptor{tok("test-model", 500), tok("gpt-4o-mini", 500)}
		}},
		{"after another tenant's priced debit", func() []*commonv3.RateLimitDescriptor {
			return []*commonv3.RateLimitDescriptor{d("tenant", "globex", "generic_key", "search"), tok("test-model", 1000)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stores(t, func(t *testing.T, redis bool) {
				e := newEnv(t, testConfig, redis, rls.Options{})
				if err := e.g.Ledger().Close(); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: tc.descs()})
				if status.Code(err) != codes.Unavailable {
					t.Errorf("with the ledger down: %v, want Unavailable", err)
				}
				// free-tokens refills 1,000 a minute: a few tokens while
				// the test runs.
				resp := e.ask(t, "edge", 0, hits(0, d("tenant", "acme", "model", "test-model", "tokens", "input")))
				if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "free-tokens" || st.GetLimitRemaining() > 50 {
					t.Errorf("acme's free-tokens after 1,000 tokens served: %v, want spent", st)
				}
			})
		})
	}
}
