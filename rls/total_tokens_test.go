package rls_test

import (
	"context"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// totalConfig is Envoy AI Gateway's stream-done report as costgate maps
// it: input, output and total tokens (llm_total_token) under the tenant
// and the model, and the total under the tenant alone too, on two keys,
// so that a total can be sent once, twice, or without the model. The tenant's plan counts tokens, input
// tokens and output tokens in windows of an hour (exact, unlike a
// refilling bucket) and has a daily budget. test-model's output is the
// dearer side, embed-model's input.
const totalConfig = `
admin_token: t
tenants:
  - {name: acme, plan: metered}
limits:
  - {name: all-tokens, plans: [metered], dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 100000000, period: 1h}
  - {name: in-tokens, plans: [metered], dimensions: [tenant], unit: input_tokens, algorithm: fixed_window, rate: 100000000, period: 1h}
  - {name: out-tokens, plans: [metered], dimensions: [tenant], unit: output_tokens, algorithm: fixed_window, rate: 100000000, period: 1h}
budgets:
  - {name: daily, plans: [metered], amount: "100.00"}
costs:
  prices:
    test-model: {input: "1.00", output: "10.00"}
    embed-model: {input: "2.00", output: "0"}
rls:
  domains:
    - domain: ai
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - key: model
              as: model
              descriptors:
                - {key: tokens, value: input, hits: input_tokens}
                - {key: tokens, value: output, hits: output_tokens}
                - {key: tokens, value: total, hits: tokens}
            - {key: tokens, value: total, hits: tokens}
            - {key: total_tokens, hits: tokens}
`

// TestTotalTokensCountedOnce: a stream-done report that carries the
// total beside input and output tokens bills input × the input price plus
// output × the output price, exactly: in the ledger entry, on the budget
// and on the token limits, whatever the order of the descriptors and
// however often the total comes. Each kind of usage counts once, at the
// largest report of it; a total beyond input plus output (or alone) is
// usage of unknown split, billed at the model's dearer price; a total
// short of them takes nothing off.
func TestTotalTokensCountedOnce(t *testing.T) {
	const model = "test-model"
	in := func(n uint64) *commonv3.RateLimitDescriptor {
		return hits(n, d("tenant", "acme", "model", model, "tokens", "input"))
	}
	out := func(n uint64) *commonv3.RateLimitDescriptor {
		return hits(n, d("tenant", "acme", "model", model, "tokens", "output"))
	}
	total := func(n uint64) *commonv3.RateLimitDescriptor {
		return hits(n, d("tenant", "acme", "tokens", "total"))
	}
	total2 := func(n uint64) *commonv3.RateLimitDescriptor {
		return hits(n, d("tenant", "acme", "total_tokens", "llm_total_token"))
	}
	modelTotal := func(n uint64) *commonv3.RateLimitDescriptor {
		return hits(n, d("tenant", "acme", "model", model, "tokens", "total"))
	}
	embedIn := func(n uint64) *commonv3.RateLimitDescriptor {
		return hits(n, d("tenant", "acme", "model", "embed-model", "tokens", "input"))
	}
	for _, tc := range []struct {
		name string
		ds   []*commonv3.RateLimitDescriptor
		// in and out are the tokens billed, cost their price in
		// nano-dollars: test-model's $1/M and $10/M unless told.
		in, out int64
		cost    int64
	}{
		{name: "input and output", ds: []*commonv3.RateLimitDescriptor{in(200), out(900)},
			in: 200, out: 900, cost: 9_200_000},
		{name: "total last", ds: []*commonv3.RateLimitDescriptor{in(200), out(900), total(1100)},
			in: 200, out: 900, cost: 9_200_000},
		{name: "total first", ds: []*commonv3.RateLimitDescriptor{total(1100), out(900), in(200)},
			in: 200, out: 900, cost: 9_200_000},
		{name: "total between", ds: []*commonv3.RateLimitDescriptor{out(900), total(1100), in(200)},
			in: 200, out: 900, cost: 9_200_000},
		{name: "total on two descriptors", ds: []*commonv3.RateLimitDescriptor{total2(1100), in(200), total(1100), out(900)},
			in: 200, out: 900, cost: 9_200_000},
		{name: "total under the model", ds: []*commonv3.RateLimitDescriptor{modelTotal(1100), in(200), out(900)},
			in: 200, out: 900, cost: 9_200_000},
		{name: "total under the model and under the tenant", ds: []*commonv3.RateLimitDescriptor{in(200), total(1100), out(900), modelTotal(1100)},
			in: 200, out: 900, cost: 9_200_000},
		{name: "input and output twice", ds: []*commonv3.RateLimitDescriptor{in(200), total(1100), out(900), in(200), out(900)},
			in: 200, out: 900, cost: 9_200_000},
		// The opposite attack: the caller's reports disagree. None of
		// them takes anything off another: the largest of a kind wins.
		{name: "total short of input and output", ds: []*commonv3.RateLimitDescriptor{in(200), out(900), total(500)},
			in: 200, out: 900, cost: 9_200_000},
		{name: "input twice, the smaller last", ds: []*commonv3.RateLimitDescriptor{in(700), out(900), in(200), total(1100)},
			in: 700, out: 900, cost: 9_700_000},
		// 400 tokens of the total are neither input nor output: billed
		// at test-model's dearer side, output.
		{name: "total beyond input and output", ds: []*commonv3.RateLimitDescriptor{in(200), total(1500), out(900)},
			in: 200, out: 1300, cost: 13_200_000},
		{name: "total beyond, on two descriptors", ds: []*commonv3.RateLimitDescriptor{total(1200), in(200), total2(1500), out(900)},
			in: 200, out: 1300, cost: 13_200_000},
		// A total alone (the model named by the first phase's check,
		// sent beside it) is billed at the dearer side: output for
		// test-model, input for embed-model, whose output is free.
		{name: "total alone", ds: []*commonv3.RateLimitDescriptor{in(0), total(1100)},
			in: 0, out: 1100, cost: 11_000_000},
		{name: "total alone under the model", ds: []*commonv3.RateLimitDescriptor{modelTotal(1100)},
			in: 0, out: 1100, cost: 11_000_000},
		{name: "total alone, input the dearer", ds: []*commonv3.RateLimitDescriptor{total(1100), embedIn(0)},
			in: 1100, out: 0, cost: 2_200_000},
		{name: "total beyond input, input the dearer", ds: []*commonv3.RateLimitDescriptor{embedIn(300), total(1100)},
			in: 1100, out: 0, cost: 2_200_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stores(t, func(t *testing.T, redis bool) {
				e := newEnv(t, totalConfig, redis, rls.Options{})
				ctx := context.Background()
				if got := e.ask(t, "ai", 0, tc.ds...).GetOverallCode(); got != OK {
					t.Fatalf("stream-done report: %s, want OK", got)
				}
				if err := e.g.Ledger().Flush(ctx); err != nil {
					t.Fatal(err)
				}
				page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
				if err != nil || len(page.Entries) != 1 {
					t.Fatalf("ledger entries: %+v, %v; want one", page.Entries, err)
				}
				en := page.Entries[0]
				if int64(en.ActualCost) != tc.cost || en.Actual.InputTokens != tc.in || en.Actual.OutputTokens != tc.out {
					t.Errorf("ledger entry: %d nano-dollars for %d input and %d output tokens; want %d for %d and %d",
						en.ActualCost, en.Actual.InputTokens, en.Actual.OutputTokens, tc.cost, tc.in, tc.out)
				}
				spent := spentOn(t, e.g, "acme")
				for name, want := range map[string]int64{"daily": tc.cost, "all-tokens": tc.in + tc.out, "in-tokens": tc.in, "out-tokens": tc.out} {
					if got := spent[name]; got != want {
						t.Errorf("%s: %d spent, want %d", name, got, want)
					}
				}
			})
		})
	}
}

// TestTotalAloneWithoutAModel: a total alone, in a request that names no
// model, has no price: it counts its tokens once on the tenant's token
// limits (as output, the side a total is billed at when the price does
// not say otherwise), and writes no ledger entry.
func TestTotalAloneWithoutAModel(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, totalConfig, redis, rls.Options{})
		ds := []*commonv3.RateLimitDescriptor{
			hits(1100, d("tenant", "acme", "tokens", "total")),
			hits(1100, d("tenant", "acme", "total_tokens", "llm_total_token")),
		}
		if got := e.ask(t, "ai", 0, ds...).GetOverallCode(); got != OK {
			t.Fatalf("total alone: %s, want OK", got)
		}
		spent := spentOn(t, e.g, "acme")
		for name, want := range map[string]int64{"daily": 0, "all-tokens": 1100, "in-tokens": 0, "out-tokens": 1100} {
			if got := spent[name]; got != want {
				t.Errorf("%s: %d spent, want %d", name, got, want)
			}
		}
	})
}

// spentOn is what each limit and budget of tenant's plan has spent:
// its capacity less what remains (the windows of totalConfig refill
// nothing within a test).
func spentOn(t *testing.T, g *gate.Gate, tenant string) map[string]int64 {
	t.Helper()
	states, err := g.CallerLimits(context.Background(), g.Trusted(tenant, "", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, s := range states {
		out[s.Name] = s.Capacity - s.Remaining
	}
	return out
}
