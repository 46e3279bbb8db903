package rls_test

import (
	"context"
	"strconv"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// chargesConfig gives each way a charge could be lost a tenant of its
// own: a token bucket and a GCRA limit that go into debt, a limit whose
// capacity is below one charge, a concurrency limit held full, a budget
// spent, a fail-closed and a fail-open limit. Token limits refill over an
// hour, so that the few seconds a test runs change nothing it measures.
const chargesConfig = `
admin_token: t
tenants:
  - {name: debt, plan: debt}
  - {name: gcra, plan: gcra}
  - {name: small, plan: small}
  - {name: busy, plan: busy}
  - {name: spent, plan: spent}
  - {name: closed, plan: closed}
  - {name: open, plan: open}
limits:
  - {name: debt-tokens, plans: [debt], dimensions: [tenant], unit: input_tokens, rate: 1000, period: 1h}
  - {name: gcra-tokens, plans: [gcra], dimensions: [tenant], unit: input_tokens, algorithm: gcra, rate: 1000, period: 1h}
  - {name: small-tokens, plans: [small], dimensions: [tenant], unit: input_tokens, rate: 100, period: 1h}
  - {name: busy-slots, plans: [busy], dimensions: [tenant], algorithm: concurrency, rate: 1, period: 1m}
  - {name: busy-tokens, plans: [busy], dimensions: [tenant], unit: input_tokens, rate: 1000, period: 1h}
  - {name: closed-tokens, plans: [closed], dimensions: [tenant], unit: input_tokens, rate: 1000, period: 1h, on_store_failure: fail_closed}
  - {name: open-tokens, plans: [open], dimensions: [tenant], unit: input_tokens, rate: 1000, period: 1h}
budgets:
  - {name: spent-daily, plans: [spent], amount: "0.001"}
costs:
  prices:
    test-model: {input: "1.00", output: "10.00"}
rls:
  domains:
    - domain: charges
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - key: model
              as: model
              descriptors:
                - {key: tokens, value: input, hits: input_tokens}
`

// input is a descriptor of tenant's input tokens of test-model, n hits:
// a charge above 0, a check at 0.
func input(tenant string, n uint64) *commonv3.RateLimitDescriptor {
	return hits(n, d("tenant", tenant, "model", "test-model", "tokens", "input"))
}

// spentOf is tenant's spend today in the ledger, in nano-dollars.
func (e *env) spentOf(t *testing.T, tenant string) int64 {
	t.Helper()
	ctx := context.Background()
	if err := e.g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	spent, err := e.g.Ledger().Spend(ctx, ledger.SpendQuery{Tenant: tenant, Period: "day"})
	if err != nil {
		t.Fatal(err)
	}
	return int64(spent)
}

// TestChargeIsAlwaysCounted: usage already served is counted on the
// limits and billed in the ledger whatever the limits say. Each case
// charges its tenant past what its limit holds, then checks: the check
// is OVER_LIMIT (the limits counted the charges: a token bucket or GCRA
// owes up to one capacity, a window or budget is full), its Retry-After
// is at least the time the debt takes to repay, and the ledger holds
// every token charged at $1/M.
func TestChargeIsAlwaysCounted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tenant  string
		charges []uint64
		// retry is the least Retry-After of the check (s); 0 for any.
		retry int
		// hold holds the tenant's concurrency slot while it is charged.
		hold bool
	}{
		// A settlement charges at most one capacity beyond its reservation
		// (of 0): 1,100 fills the limit, and the three charges of 50
		// after it owe 150 tokens, 540 s at 1,000 an hour.
		{name: "token bucket in debt", tenant: "debt", charges: []uint64{1100, 50, 50, 50}, retry: 500},
		{name: "gcra in debt", tenant: "gcra", charges: []uint64{1100, 50, 50, 50}, retry: 500},
		// 1,000 fills a limit of 100; 50 more owe 50: 1,800 s.
		{name: "capacity below the charge", tenant: "small", charges: []uint64{1000, 50}, retry: 1700},
		// The charges hold no slot: they owe 300 tokens, 1,080 s.
		{name: "concurrency limit full", tenant: "busy", charges: []uint64{1000, 300}, retry: 1000, hold: true},
		// $0.001 a day: spent by the first, full for the rest of the day.
		{name: "budget spent", tenant: "spent", charges: []uint64{1000, 50, 50}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stores(t, func(t *testing.T, redis bool) {
				e := newEnv(t, chargesConfig, redis, rls.Options{})
				ctx := context.Background()
				var held *gate.Reservation
				if tc.hold {
					res, d := e.g.Reserve(ctx, &gate.Request{Caller: e.g.Trusted(tc.tenant, "", "", ""), Route: "rls:charges"})
					if res == nil {
						t.Fatalf("holding the slot: %+v", d)
					}
					held = res
					if got := codes_(e.ask(t, "charges", 0, input(tc.tenant, 0))); got != "OVER_LIMIT OVER_LIMIT" {
						t.Fatalf("a check with the slot held: %s, want OVER_LIMIT", got)
					}
				}
				var total int64
				for _, n := range tc.charges {
					if got := codes_(e.ask(t, "charges", 0, input(tc.tenant, n))); got != "OK OK" {
						t.Errorf("a charge of %d: %s, want OK OK", n, got)
					}
					total += int64(n)
				}
				if held != nil {
					held.Cancel(ctx)
				}
				resp := e.ask(t, "charges", 0, input(tc.tenant, 0))
				if got := codes_(resp); got != "OVER_LIMIT OVER_LIMIT" {
					t.Errorf("a check after the charges: %s, want OVER_LIMIT", got)
				}
				if retry, _ := strconv.Atoi(headerOf(resp, "Retry-After")); retry < tc.retry {
					t.Errorf("Retry-After %d s after the charges, want at least %d: the limit did not count them all", retry, tc.retry)
				}
				if got, want := e.spentOf(t, tc.tenant), total*1000; got != want {
					t.Errorf("ledger: %d nano-dollars, want %d: %d input tokens at $1/M", got, want, total)
				}
			})
		})
	}
}

// TestChargeWithTheStoreDown: while Redis is out, a charge is still OK
// and billed in the ledger, on a fail-closed limit as on a fail-open one
// (the ledger's spend brings the budgets up when Redis returns), and the
// local fallback counts it: a debit after charges past a fail-open
// limit's fallback share is refused. A fail-closed limit's check stays
// OVER_LIMIT.
func TestChargeWithTheStoreDown(t *testing.T) {
	e := newEnv(t, chargesConfig, true, rls.Options{})
	e.redis.Stop(t)
	defer e.redis.Restart(t)
	for _, tenant := range []string{"closed", "open"} {
		for _, n := range []uint64{1100, 50, 50} {
			resp := e.ask(t, "charges", 0, input(tenant, n))
			if got := codes_(resp); got != "OK OK" {
				t.Errorf("%s: a charge of %d with Redis down: %s, want OK OK", tenant, n, got)
			}
			if got := headerOf(resp, "Costgate-Degraded"); got != "fail-open" {
				t.Errorf("%s: Costgate-Degraded %q: the charge went to the local fallback", tenant, got)
			}
		}
		if got, want := e.spentOf(t, tenant), int64(1_200_000); got != want {
			t.Errorf("%s: ledger %d nano-dollars, want %d: 1,200 input tokens at $1/M", tenant, got, want)
		}
	}
	// A debit of one token meets the charges on the fallback (a check
	// does too: TestRLSAtkCheckWithTheStoreDownMeetsTheFallback).
	one := &gate.Request{Caller: e.g.Trusted("open", "", "", ""), Route: "rls:charges", NoRequests: true,
		Estimate: costmodel.Estimate{Model: "test-model", Usage: costmodel.Usage{InputTokens: 1}}}
	if res, d := e.g.Reserve(context.Background(), one); res != nil || d.Status != 429 || !d.Degraded {
		t.Errorf("a debit of one token on the fail-open limit after its charges: %+v, want 429 on the fallback", d)
	}
	resp := e.ask(t, "charges", 0, input("closed", 0))
	if got := codes_(resp); got != "OVER_LIMIT OVER_LIMIT" || headerOf(resp, "Costgate-Degraded") != "fail-closed" {
		t.Errorf("a check of the fail-closed limit: %s, %q; want it closed", got, headerOf(resp, "Costgate-Degraded"))
	}
}
