package rls_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// edgesConfig has two domains whose names differ only where a limit's
// name cannot hold the character (':' and '_'), and a fail-closed limit
// of tokens.
const edgesConfig = testConfig + `
    - domain: "o:p"
      descriptors: [{key: tenant, as: tenant}]
    - domain: o_p
      descriptors: [{key: tenant, as: tenant}]
    - domain: closed
      descriptors:
        - key: tok
          hits: tokens
          on_store_failure: fail_closed
          rate_limit: {name: closed-tok, unit: minute, requests_per_unit: 100}
        - key: ip
          rate_limit: {name: closed-ip, unit: minute, requests_per_unit: 100}
`

// TestOverrideCountersApart: a limit override is named by its rate and
// unit alone, so that descriptors of other keys, or of another domain,
// send the same one; each descriptor still counts on its own counter, as
// it does in envoyproxy/ratelimit, whose keys hold the domain and every
// entry's key and value.
func TestOverrideCountersApart(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, edgesConfig, redis, rls.Options{})
		once := func(domain string, desc *commonv3.RateLimitDescriptor) {
			t.Helper()
			ov := func() *commonv3.RateLimitDescriptor {
				c := &commonv3.RateLimitDescriptor{Entries: desc.GetEntries()}
				return overridden(c, 1, typev3.RateLimitUnit_HOUR)
			}
			if got := codes_(e.ask(t, domain, 0, ov())); got != "OK OK" {
				t.Errorf("%s %v, the first under an override of 1: %s", domain, desc.GetEntries(), got)
			}
			if got := codes_(e.ask(t, domain, 0, ov())); got != "OVER_LIMIT OVER_LIMIT" {
				t.Errorf("%s %v, the second: %s", domain, desc.GetEntries(), got)
			}
		}
		for _, tc := range []struct {
			name   string
			domain string
			desc   *commonv3.RateLimitDescriptor
		}{
			{"unmatched key", "edge", d("nothing", "x")},
			{"another unmatched key, same value", "edge", d("other", "x")},
			{"a configured key, same value", "edge", d("remote_address", "x")},
			{"two entries", "edge", d("nothing", "x", "other", "y")},
			{"the entries' values in one", "edge", d("nothing", "x:other=y")},
			{"a key holding '='", "edge", d("a=b", "c")},
			{"the value holding it", "edge", d("a", "b=c")},
			{"a tenant", "edge", d("tenant", "acme")},
			{"the tenant in another domain", "o:p", d("tenant", "acme")},
			{"and in a third of the same limit names", "o_p", d("tenant", "acme")},
		} {
			t.Run(tc.name, func(t *testing.T) { once(tc.domain, tc.desc) })
		}
	})
}

// TestChargeBesideABlock: usage already served is charged even when
// another descriptor of the request refuses it outright (a limit of 0,
// configured or sent as an override): the request is OVER_LIMIT and
// debits nothing, but the tokens it reports count, on the descriptor's
// limit, on the tenant's plan and in the ledger.
func TestChargeBesideABlock(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		for i, block := range []*commonv3.RateLimitDescriptor{
			d("remote_address", "192.0.2.66"),
			overridden(d("remote_address", "198.51.100.80"), 0, typev3.RateLimitUnit_SECOND),
		} {
			resp := e.ask(t, "edge", 0, hits(30, d("tok", "charged")), block,
				hits(200, d("tenant", "acme", "model", "test-model", "tokens", "input")))
			if got, want := codes_(resp), "OVER_LIMIT OK OVER_LIMIT OK"; got != want {
				t.Fatalf("block %d: %s, want %s", i, got, want)
			}
			resp = e.ask(t, "edge", 0, hits(0, d("tok", "charged")))
			// tok refills 100 a minute: a few while the test runs.
			if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "tok" || st.GetLimitRemaining() > uint32(100-30*(i+1)+10) {
				t.Errorf("block %d: tok after charges of 30 beside it: %v, want about %d left", i, st, 100-30*(i+1))
			}
		}
		resp := e.ask(t, "edge", 0, hits(0, d("tenant", "acme", "model", "test-model", "tokens", "input")))
		// free-tokens refills 1000 a minute: a few while the test runs.
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "free-tokens" || st.GetLimitRemaining() > 700 {
			t.Errorf("acme's free-tokens after two charges of 200: %v, want about 600 left", st)
		}
		ctx := context.Background()
		if err := e.g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		page, err := e.g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme"})
		if err != nil || len(page.Entries) != 2 {
			t.Fatalf("acme's ledger: %+v, %v; want the two charges", page.Entries, err)
		}
		for _, en := range page.Entries {
			if en.Actual.InputTokens != 200 || en.ActualCost != 200_000 {
				t.Errorf("ledger entry %+v, want 200 input tokens at $1/M", en)
			}
		}
	})
}

// TestChargeIsNeverRefused: a charge is usage already served; whatever
// its limits answer (here a fail-closed limit whose store is down), its
// status is OK, as the answer is, and the RateLimit fields are those of
// the request's own check or debit.
func TestChargeIsNeverRefused(t *testing.T) {
	e := newEnv(t, edgesConfig, true, rls.Options{})
	e.redis.Stop(t)
	defer e.redis.Restart(t)
	resp := e.ask(t, "closed", 0, hits(5, d("tok", "a")))
	if got := codes_(resp); got != "OK OK" {
		t.Errorf("a charge on a fail-closed limit with Redis down: %s, want OK OK", got)
	}
	resp = e.ask(t, "closed", 0, d("ip", "b"), hits(5, d("tok", "a")))
	if got := codes_(resp); got != "OK OK OK" {
		t.Errorf("a debit beside the charge: %s, want OK OK OK", got)
	}
	if got := headerOf(resp, "Costgate-Degraded"); got != "fail-open" {
		t.Errorf("Costgate-Degraded %q: the debit was admitted failing open", got)
	}
	if got := headerOf(resp, "RateLimit-Policy"); got != "" && !strings.Contains(got, "closed-ip") {
		t.Errorf("RateLimit-Policy %q speaks for the charge, not the admitted debit", got)
	}
}

// TestChargeInDebt: a token bucket charged beyond empty owes the excess;
// a charge while it owes is still OK in every status, and the RateLimit
// fields speak for the request's admitted debit, not for the charge.
func TestChargeInDebt(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		for i := range 3 {
			resp := e.ask(t, "edge", 0, d("remote_address", "198.51.100.90"), hits(150, d("tok", "debt")))
			if got := codes_(resp); got != "OK OK OK" {
				t.Errorf("charge %d of 150 on tok (100 a minute): %s, want OK OK OK", i, got)
			}
			if got := headerOf(resp, "RateLimit"); !strings.HasPrefix(got, `"per-ip";r=`+strconv.Itoa(3-i)+";") {
				t.Errorf("charge %d: RateLimit %q, want per-ip's, %d left", i, got, 3-i)
			}
		}
	})
}

// TestChargeInDebtIsCounted: usage already served is charged whatever
// the limits say, so that the ledger and the tenant's budgets hold every
// token a stream reported. A token bucket charged beyond empty owes the
// excess, and refuses any debit, a debit of 0 too, until it is paid back;
// a charge debits nothing (gate.Request.Served) and is still settled and
// billed.
func TestChargeInDebtIsCounted(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		in := func(n uint64) *commonv3.RateLimitDescriptor {
			return hits(n, d("tenant", "acme", "model", "test-model", "tokens", "input"))
		}
		for _, n := range []uint64{1100, 50, 50, 50} {
			if got := codes_(e.ask(t, "edge", 0, in(n))); got != "OK OK" {
				t.Errorf("a charge of %d: %s", n, got)
			}
		}
		ctx := context.Background()
		if err := e.g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		spent, err := e.g.Ledger().Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil || spent != 1_250_000 {
			t.Errorf("acme's ledger: %d nano-dollars (%v), want 1250000: 1,250 input tokens at $1/M", spent, err)
		}
	})
}

// TestCallerValuesCannotShareACounter: a limit keyed by two values a
// descriptor names (user and model) keeps each pair on its own counter,
// whatever the values hold: written unescaped into the key
// (":user=U:model=M"), user "a:model=b" with model "c" and user "a" with
// model "b:model=c" shared one. compiledLimit.key escapes each value.
func TestCallerValuesCannotShareACounter(t *testing.T) {
	const cfg = `
admin_token: t
tenants: [{name: acme, plan: free, keys: [{key: k-acme}]}]
limits: [{name: per-user-model, plans: [free], dimensions: [user, model], unit: requests, rate: 1, period: 1m}]
rls:
  domains:
    - domain: x
      descriptors:
        - key: tenant
          as: tenant
          descriptors: [{key: user, as: user, descriptors: [{key: model, as: model}]}]
`
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, cfg, redis, rls.Options{})
		if got := codes_(e.ask(t, "x", 0, d("tenant", "acme", "user", "a:model=b", "model", "c"))); got != "OK OK" {
			t.Fatalf("the first pair: %s", got)
		}
		if got := codes_(e.ask(t, "x", 0, d("tenant", "acme", "user", "a", "model", "b:model=c"))); got != "OK OK" {
			t.Errorf("another user and model: %s, want OK OK on a counter of its own", got)
		}
	})
}
