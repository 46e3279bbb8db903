package rls_test

import (
	"math"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/costgate/costgate/rls"
)

// TestRLSAtkOverrideCannotFailOpen: a limit override costgate cannot
// apply (no unit, a unit it does not know, a period past the longest a
// limit may have, 400 days, as Envoy sends for "10 per 2 years") made the
// whole request the gRPC error INVALID_ARGUMENT, which Envoy's
// failure_mode_deny: false (its default) lets through: the request passed
// unlimited, the tenant's plan never applied, and the stream-done call
// carrying the same override dropped the tokens served, never counted
// nor billed. The descriptor refuses the request instead, as a limit of 0
// does, with what is wrong in the body; nothing is debited, and the usage
// a request reports is charged.
func TestRLSAtkOverrideCannotFailOpen(t *testing.T) {
	for _, tc := range []struct {
		name string
		lo   *commonv3.RateLimitDescriptor_RateLimitOverride
	}{
		{"no unit", &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}},
		{"an unknown unit", &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit(42)}},
		{"two years", &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(2)}},
		{"past a Duration", &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testConfig, false, rls.Options{})
			withOverride := func(desc *commonv3.RateLimitDescriptor) *commonv3.RateLimitDescriptor {
				desc.Limit = tc.lo
				return desc
			}
			// Phase one: acme's check, beside the address the override is on.
			resp := e.ask(t, "edge", 0, hits(0, d("tenant", "acme", "model", "test-model", "tokens", "output")), withOverride(d("remote_address", "198.51.100.30")))
			if got := codes_(resp); got != "OVER_LIMIT OK OVER_LIMIT" || !strings.Contains(string(resp.GetRawBody()), "invalid_limit_override") {
				t.Errorf("a check beside an override costgate cannot apply: %s %s, want OVER_LIMIT OK OVER_LIMIT, invalid_limit_override", got, resp.GetRawBody())
			}
			// A debit of acme's plan (3 requests a minute) beside it:
			// refused, nothing debited.
			resp = e.ask(t, "edge", 0, d("tenant", "acme"), withOverride(d("remote_address", "198.51.100.30")))
			if got := codes_(resp); got != "OVER_LIMIT OK OVER_LIMIT" {
				t.Errorf("a debit beside it: %s, want OVER_LIMIT OK OVER_LIMIT", got)
			}
			if st := e.ask(t, "edge", 0, hits(0, d("tenant", "acme"))).GetStatuses()[0]; st.GetLimitRemaining() != 3 {
				t.Errorf("acme's plan after the refused debit: %v, want 3 left", st)
			}
			// Phase two: 900 output tokens served, with the override on
			// the charge's own descriptor: charged, $0.009.
			resp = e.ask(t, "edge", 0, withOverride(hits(900, d("tenant", "acme", "model", "test-model", "tokens", "output"))))
			if resp.GetOverallCode() != OK {
				t.Errorf("the charge: %s %s, want OK", codes_(resp), resp.GetRawBody())
			}
			if got := e.spentOf(t, "acme"); got != 9_000_000 {
				t.Errorf("acme is billed %d nano-dollars for 900 output tokens served, want 9000000", got)
			}
		})
	}
}
