package gate

import (
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/weighted"
)

// TestLimitKeyValuesChooseNoHashTag: a limit keyed by values the caller
// chooses (a model, a route, an attribute, an RLS descriptor's value) and
// not by the caller, and not of the whole deployment (which has
// globalTag, see TestGlobalLimitKeysKeepTheGlobalTag), has no hash tag:
// its key is hashed whole. A value
// with braces must not give it one: "x{acme}" would put the counter in
// tenant acme's Redis Cluster slot, under acme's generation marker (a
// stale answer there restores acme's counters). And the escaping keeps
// every value on its own key: a value spelled with the escapes is
// another value.
func TestLimitKeyValuesChooseNoHashTag(t *testing.T) {
	l := &compiledLimit{dims: []string{"model", "route"}}
	seen := map[string]string{}
	for _, v := range []string{"{acme}", "x{acme}y", "{", "}", "}{acme}", "{}", "%7Bacme%7D", "a:{b}=c", "gpt-4o", "%", "%25"} {
		key := l.key(&Reservation{model: v, req: Request{Route: "/v1/x{acme}"}})
		if tag := weighted.HashTag(key); tag != key {
			t.Errorf("model %q: key %q has the hash tag %q", v, key, tag)
		}
		if other, dup := seen[key]; dup {
			t.Errorf("models %q and %q share the key %q", other, v, key)
		}
		seen[key] = v
	}
	if key := l.key(&Reservation{model: "gpt-4o", req: Request{Route: "/v1/chat"}}); key != ":model=gpt-4o:route=/v1/chat" {
		t.Errorf("a plain key changed: %q", key)
	}
}

// TestGlobalLimitKeysKeepTheGlobalTag: a configured limit of the whole
// deployment (keyed by model, route, upstream, the region, an address,
// attributes, or nothing) has the hash tag globalTag whatever values a
// caller gives it, so that the generation marker restoreGlobal writes
// covers each of its keys, in every algorithm (a concurrency limit's
// marker tells its holders to hold their slots again); a limit keyed by
// the caller too has not.
func TestGlobalLimitKeysKeepTheGlobalTag(t *testing.T) {
	for _, c := range []struct {
		dims   []string
		global bool
	}{
		{nil, true}, {[]string{"model"}, true}, {[]string{"route", "upstream"}, true}, {[]string{"model", "region"}, true},
		{[]string{"ip"}, true}, {[]string{"model", "attr.team"}, true},
		{[]string{"tenant", "model"}, false}, {[]string{"ip", "user"}, false}, {[]string{"api_key", "attr.team"}, false},
	} {
		l, err := compileLimit(config.LimitConfig{Name: "l", Dimensions: c.dims, Unit: "tokens", Rate: 10, Period: time.Minute, Algorithm: "fixed_window"})
		if err != nil {
			t.Fatal(err)
		}
		if l.global != c.global {
			t.Errorf("%v: global %v, want %v", c.dims, l.global, c.global)
			continue
		}
		if conc, err := compileLimit(config.LimitConfig{Name: "c", Dimensions: c.dims, Rate: 10, Period: time.Minute, Algorithm: "concurrency"}); err != nil || conc.global != c.global {
			t.Errorf("%v: a concurrency limit's global is not %v (%v)", c.dims, c.global, err)
		} else if usd, err := compileLimit(config.LimitConfig{Name: "c", Dimensions: c.dims, Unit: "usd", RateUSD: 10_000, Period: time.Minute, Algorithm: "concurrency"}); err != nil || usd.spendCap() {
			// Its dollars in flight are no spend of the ledger's.
			t.Errorf("%v: a concurrency limit in dollars is a spend cap (%v)", c.dims, err)
		}
		if !c.global {
			continue
		}
		for _, v := range []string{"gpt-4o", "{acme}", "x{acme}y", "}", "%7Bglobal%7D"} {
			r := &Reservation{st: &state{cfg: &config.Config{Region: v}}, model: v,
				req: Request{Route: v, Upstream: v, IP: v, Attributes: map[string]string{"team": v}}}
			if key := l.key(r); weighted.HashTag(key) != globalTag {
				t.Errorf("%v, value %q: key %q has the hash tag %q, want %q", c.dims, v, key, weighted.HashTag(key), globalTag)
			}
		}
	}
}
