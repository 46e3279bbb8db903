package rls_test

import (
	"context"
	"math"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// unbilledConfig is one tenant on a plan with a token limit, a budget and a
// per-user limit, and a domain whose descriptors name the tenant, the user
// (a value the client sends, as a header Envoy copies) and the model, for
// the two phases of token limiting.
const unbilledConfig = `
admin_token: t
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
limits:
  - {name: free-tokens, plans: [free], dimensions: [tenant], unit: tokens, rate: 1000, period: 1m}
  - {name: per-user, plans: [free], dimensions: [user], unit: requests, rate: 100, period: 1m}
budgets:
  - {name: free-daily, plans: [free], amount: "1.00"}
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
            - key: user
              as: user
              descriptors:
                - key: model
                  as: model
                  descriptors:
                    - {key: tokens, value: input, hits: input_tokens}
                    - {key: tokens, value: output, hits: output_tokens}
`

// TestUnbilledAtkChargeWithLongUserIsBilled: the second phase charges
// usage already served. A user value is one the client chooses (a header
// Envoy copies into the descriptor); the server accepts entry values up to
// 1024 bytes, and reads a '%', NUL or non-UTF-8 byte as three bytes. The
// ledger refuses a user (or tenant) longer than 512 bytes: the charge's
// ledger record is refused, the answer is OK all the same, and the usage,
// counted on the limits, is billed to nobody. A user of 600 bytes, or of
// 200 '%' (600 bytes once read), has its tokens served for free.
func TestUnbilledAtkChargeWithLongUserIsBilled(t *testing.T) {
	for _, tc := range []struct {
		name         string
		tenant, user string
	}{
		{"user of 600 bytes", "acme", strings.Repeat("u", 600)},
		{"user of 200 percent signs read as 600 bytes", "acme", strings.Repeat("%", 200)},
		{"user of 1024 bytes", "acme", strings.Repeat("v", 1024)},
		{"user of 512 bytes (held: fits)", "acme", strings.Repeat("w", 512)},
		// A tenant the configuration does not list is billed too: its
		// name is Envoy's to send, and may be as long as a user's.
		{"tenant of 600 bytes", strings.Repeat("t", 600), "u"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, unbilledConfig, false, rls.Options{})
			// Phase one: a check, which records nothing.
			if got := codes_(e.ask(t, "edge", 0, hits(0, d("tenant", tc.tenant, "user", tc.user, "model", "test-model", "tokens", "input")))); got != "OK OK" {
				t.Fatalf("check: %s", got)
			}
			// Phase two: 500 input tokens served, $0.0005.
			resp := e.ask(t, "edge", 0, hits(500, d("tenant", tc.tenant, "user", tc.user, "model", "test-model", "tokens", "input")))
			if got := codes_(resp); got != "OK OK" {
				t.Fatalf("charge: %s", got)
			}
			ctx := context.Background()
			if err := e.g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			page, err := e.g.Ledger().Entries(ctx, ledger.Query{})
			if err != nil {
				t.Fatal(err)
			}
			var billed costmodel.NanoUSD
			for _, en := range page.Entries {
				billed += en.ActualCost
			}
			if want := costmodel.NanoUSD(500_000); len(page.Entries) != 1 || billed != want {
				t.Errorf("ledger after 500 served tokens of a tenant of %d bytes and a user of %d: %d entries billing %v, want one entry of %v",
					len(tc.tenant), len(tc.user), len(page.Entries), billed, want)
			}
		})
	}
}

// shadowBlockConfig is a tenant whose plan admits 3 requests a minute,
// and a priced search descriptor under the tenant whose own limit is in
// shadow mode: "watch" would block every search (0 a minute), "soft" all
// but one.
const shadowBlockConfig = `
admin_token: t
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
limits:
  - {name: free-requests, plans: [free], dimensions: [tenant], unit: requests, rate: 3, period: 1m, algorithm: fixed_window}
budgets:
  - {name: free-daily, plans: [free], amount: "1.00"}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - key: watch
              price_per_hit: "0.01"
              shadow_mode: true
              rate_limit: {name: watch, unit: minute, requests_per_unit: 0}
            - key: soft
              price_per_hit: "0.01"
              shadow_mode: true
              rate_limit: {name: soft, unit: minute, requests_per_unit: 1}
`

// TestUnbilledAtkShadowBlockKeepsThePlan: a limit in shadow mode is
// "counted and logged, never enforced", as on the proxy: it must not change
// what the request's other limits, its tenant's plan and its price do. A
// descriptor whose shadow limit is 1 a minute names its tenant (the plan's
// 3 requests a minute refuse the fourth, each search is billed $0.01); the
// same descriptor with a shadow limit of 0 is let through without the
// tenant's plan and without its price: an operator who tries a block in
// shadow mode makes the requests it matches free and unlimited.
func TestUnbilledAtkShadowBlockKeepsThePlan(t *testing.T) {
	for _, key := range []string{"soft", "watch"} {
		t.Run(key, func(t *testing.T) {
			e := newEnv(t, shadowBlockConfig, false, rls.Options{})
			var got []string
			for range 4 {
				got = append(got, codes_(e.ask(t, "edge", 1, d("tenant", "acme", key, "x"))))
			}
			if want := "OK OK,OK OK,OK OK,OVER_LIMIT OVER_LIMIT"; strings.Join(got, ",") != want {
				t.Errorf("four searches of a 3-a-minute plan under a shadow limit %q: %s, want %s", key, strings.Join(got, ","), want)
			}
			ctx := context.Background()
			if err := e.g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
			if err != nil {
				t.Fatal(err)
			}
			var billed costmodel.NanoUSD
			for _, en := range page.Entries {
				billed += en.ActualCost
			}
			if want := 3 * costmodel.NanoUSD(10_000_000); billed != want {
				t.Errorf("ledger after three admitted searches at $0.01 under a shadow limit %q: %d entries, %v, want %v", key, len(page.Entries), billed, want)
			}
		})
	}
}

// TestUnbilledAtkHugeChargeIsBilledAtTheBound: a second-phase charge of
// the largest hits_addend Envoy can send (2^64-1 tokens) is neither a
// refusal nor an overflow: the answer is OK, the tokens are clamped to the
// server's bound, the one ledger entry is charged the ledger's largest cost
// of an entry, and the tenant's next check is refused. A hits_addend of
// 2^64-1 on a debit in requests is a refusal that debits nothing.
func TestUnbilledAtkHugeChargeIsBilledAtTheBound(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, unbilledConfig, redis, rls.Options{})
		desc := func(h uint64) *commonv3.RateLimitDescriptor {
			return hits(h, d("tenant", "acme", "user", "u", "model", "test-model", "tokens", "input"))
		}
		if got := codes_(e.ask(t, "edge", 0, desc(math.MaxUint64))); got != "OK OK" {
			t.Fatalf("a charge of 2^64-1 tokens: %s, want OK OK", got)
		}
		if got := codes_(e.ask(t, "edge", 0, desc(0))); got != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("a check after the charge: %s, want OVER_LIMIT", got)
		}
		ctx := context.Background()
		if err := e.g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Entries) != 1 || page.Entries[0].ActualCost != ledger.MaxCost {
			for _, en := range page.Entries {
				t.Logf("entry %s %s actual %v %+v", en.RequestID, en.Status, en.ActualCost, en.Actual)
			}
			t.Errorf("ledger: %d entries, want one charged %v", len(page.Entries), ledger.MaxCost)
		}
	})
}
