package rls

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/weighted"
)

// fuzzConfig has nodes of every kind: exact, wildcard and any values,
// nesting, roles, hits in tokens, blocks, unlimited and a limit that
// replaces others.
const fuzzConfig = `
admin_token: t
tenants: [{name: acme, plan: free, keys: [{key: k}]}, {name: benchco, plan: bench, keys: [{key: kb}]}]
limits: [{name: free-requests, plans: [free], dimensions: [tenant], rate: 3, period: 1m}]
rls:
  domains:
    - domain: d
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - {key: generic_key, value: search, price_per_hit: "0.01", rate_limit: {unit: minute, requests_per_unit: 2}}
            - key: model
              as: model
              descriptors:
                - {key: tokens, value: input, hits: input_tokens, rate_limit: {unit: minute, requests_per_unit: 1000}}
                - {key: tokens, value: output, hits: output_tokens}
        - {key: tenant, value: "b*", as: tenant, plan: bench, rate_limit: {unit: second, requests_per_unit: 5}}
        - {key: tenant, value: "bench-*", as: tenant, rate_limit: {unit: second, requests_per_unit: 9}}
        - {key: tenant, value: acme, as: tenant}
        - {key: ip, rate_limit: {name: ipl, unit: second, requests_per_unit: 4}}
        - {key: ip, value: "10.*", rate_limit: {name: ipblock, unit: second, requests_per_unit: 0}}
        - {key: rep, rate_limit: {name: rep, unit: second, requests_per_unit: 3, replaces: [{name: ipl}, {name: ipblock}]}}
        - {key: ip, value: "10.1*", shadow_mode: true, rate_limit: {unit: second, requests_per_unit: 0}}
        - {key: free, rate_limit: {unlimited: true}}
        - key: user
          as: user
          tenant: acme
          descriptors:
            - {key: q, hits: tokens, rate_limit: {unit: hour, requests_per_unit: 7, algorithm: token_bucket}}
`

// FuzzConvert checks the conversion of a request for the gate on
// arbitrary descriptors: it never panics, each descriptor matches the
// node that a direct reading of the configuration finds (refMatch), and
// what it hands the gate is well formed.
func FuzzConvert(f *testing.F) {
	cfg, err := config.Parse([]byte(fuzzConfig))
	if err != nil {
		f.Fatal(err)
	}
	est, err := costmodel.NewEstimator(cfg.CostModel())
	if err != nil {
		f.Fatal(err)
	}
	tr, err := compile(cfg, est)
	if err != nil {
		f.Fatal(err)
	}
	dom := tr.domains["d"]
	for _, s := range []string{
		"tenant=acme",
		"tenant=acme;generic_key=search|ip=10.0.0.1",
		"tenant=bench-3|tenant=bench-3;generic_key=search|ip=192.0.2.1",
		"tenant=bx;model=m;tokens=input|tenant=acme;model=m;tokens=output",
		"user=u;q=x|free=1|ip=10.1.2.3",
		"tenant=a}b",
		"tenant=;generic_key=search",
		"ip=a:b%c|ip=a:b%c",
		"",
		"|",
		"nothing=x;more=y",
		"ip=10.0.0.1|rep=x",
		"rep=y|ip=192.0.2.9|ip=10.2.3.4",
		"nothing=x|other=x|more=x|again=x",
		"a=b=c|a=b=c|a%3Db=c|a%3Db=c",
		"tenant=acme;model=GPT-4o;tokens=input|tenant=acme;model=gpt-4o-2024-08-06;tokens=input",
		"tenant=acme;model=M\xff;tokens=input|tenant=acme;model=m\xfe;tokens=input|tenant=acme;model=m\uFFFD;tokens=input",
	} {
		f.Add(s, uint32(0), int64(-1), false, uint32(0), int32(-1))
		f.Add(s, uint32(3), int64(0), false, uint32(2), int32(2))
		f.Add(s, uint32(1), int64(1<<62), true, uint32(0), int32(1))
	}
	c := new(call)
	f.Fuzz(func(t *testing.T, s string, reqHits uint32, dHits int64, negative bool, ovRate uint32, ovUnit int32) {
		req := &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: reqHits}
		for part := range strings.SplitSeq(s, "|") {
			d := &commonv3.RateLimitDescriptor{IsNegativeHits: negative}
			if dHits >= 0 {
				d.HitsAddend = wrapperspb.UInt64(uint64(dHits))
			}
			if ovUnit >= 0 && len(req.Descriptors)%2 == 1 {
				// Envoy's limit override on every second descriptor.
				d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: ovRate, Unit: typev3.RateLimitUnit(ovUnit)}
			}
			for kv := range strings.SplitSeq(part, ";") {
				if kv == "" {
					continue
				}
				k, v, _ := strings.Cut(kv, "=")
				d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		if err := c.convert(dom, req, nil); err != nil {
			return
		}
		if len(c.descs) != len(req.Descriptors) {
			t.Fatalf("%d descriptors, %d converted", len(req.Descriptors), len(c.descs))
		}
		var n [numKinds]int
		for i, dc := range c.descs {
			// Replaced exactly when another matched limit names its own
			// (limits Envoy overrides take no part).
			replaced := false
			for _, o := range c.descs {
				if o.override == nil && dc.override == nil && o.n != nil && o.n.limit != nil && dc.n != nil && dc.n.limit != nil && slices.Contains(o.n.limit.replaces, dc.n.limit) {
					replaced = true
				}
			}
			if dc.replaced != replaced {
				t.Fatalf("descriptor %d: replaced %v, want %v", i, dc.replaced, replaced)
			}
			if (dc.override != nil) != (req.Descriptors[i].Limit != nil) || dc.override != nil && c.limitOf(&c.descs[i]) != dc.override {
				t.Fatalf("descriptor %d: override %v, sent %v", i, dc.override, req.Descriptors[i].Limit)
			}
			want := refMatch(cfg.RLS.Domains[0].Descriptors, req.Descriptors[i].Entries)
			if dc.override != nil {
				if want == nil && dc.n != bareNode {
					t.Fatalf("descriptor %d: an override on an unmatched descriptor has node %v", i, dc.n)
				}
			} else if got := dc.n != nil; got != (want != nil) {
				t.Fatalf("descriptor %d matched %v, the configuration says %v", i, got, want != nil)
			}
			if want != nil && limitName(want) != nodeName(dc.n) {
				t.Fatalf("descriptor %d matched limit %q, the configuration says %q", i, nodeName(dc.n), limitName(want))
			}
			if dc.other {
				// Another tenant's: decided on a call of its own.
				if dc.extra >= 0 || dc.named || dc.kind != kindNone && len(c.others) == 0 {
					t.Fatalf("descriptor %d names another tenant than %q (others %q) but has an item or names the caller", i, c.tenant, c.others)
				}
				continue
			}
			n[dc.kind]++
			if dc.kind == kindNone {
				if dc.extra >= 0 || dc.named {
					t.Fatalf("descriptor %d asks nothing but has an item or names the caller", i)
				}
				continue
			}
			if dc.hits < 0 || dc.hits > maxHits {
				t.Fatalf("descriptor %d: hits %d", i, dc.hits)
			}
			g := &c.groups[dc.kind]
			l := c.limitOf(&c.descs[i])
			if dc.extra >= len(g.extras) || (l != nil && !l.block) != (dc.extra >= 0) { // a block in shadow mode has no counter
				t.Fatalf("descriptor %d: item %d of %d", i, dc.extra, len(g.extras))
			}
		}
		for k := range c.groups {
			g := &c.groups[k]
			if kind(k) == kindNone {
				continue
			}
			if g.n != n[k] || len(g.actual) != len(g.extras) {
				t.Fatalf("group %d: %d descriptors counted, %d seen; %d items, %d actual costs", k, g.n, n[k], len(g.extras), len(g.actual))
			}
			if g.named && c.tenant == "" {
				t.Fatalf("group %d names a caller, and the request none", k)
			}
			for i, e := range g.extras {
				if !strings.HasPrefix(e.Key, "{") || weighted.HashTag(e.Key) == e.Key || e.Cost < 0 || e.Cost > maxHits || g.actual[i] < 0 || g.actual[i] > maxHits {
					t.Fatalf("group %d item %d: %+v, actual %d", k, i, e, g.actual[i])
				}
				if kind(k) != kindDebit && e.Cost != 0 {
					t.Fatalf("a %d item costs %d", k, e.Cost)
				}
				for j := range i {
					if g.extras[j].Key == e.Key && g.extras[j].Limit.Name == e.Limit.Name {
						t.Fatalf("group %d: item %d repeats item %d", k, i, j)
					}
				}
			}
		}
		// Two descriptors share a counter (a limit and a key) only when
		// they are the same: no value, key or override can make another
		// descriptor's key.
		for i := range c.descs {
			for j := range i {
				a, b := &c.descs[i], &c.descs[j]
				if a.extra < 0 || b.extra < 0 {
					continue
				}
				ea, eb := &c.groups[a.kind].extras[a.extra], &c.groups[b.kind].extras[b.extra]
				if ea.Key == eb.Key && ea.Limit.Name == eb.Limit.Name && !sameEntries(est, req.Descriptors[i], req.Descriptors[j]) {
					t.Fatalf("descriptors %d and %d share limit %q key %q", j, i, ea.Limit.Name, ea.Key)
				}
			}
		}
		if c.block >= 0 && c.limitOf(&c.descs[c.block]) == nil {
			t.Fatalf("block %d has no limit", c.block)
		}
		if strings.ContainsAny(c.tenant, "{}") {
			t.Fatalf("tenant %q", c.tenant)
		}
	})
}

// sameEntries tells whether a and b have the same entries, in order: a
// model entry's value (fuzzConfig's key "model") by the model it names,
// its canonical name in est's price table, when it is UTF-8 of at most
// maxEntryLen bytes.
func sameEntries(est *costmodel.Estimator, a, b *commonv3.RateLimitDescriptor) bool {
	value := func(e *commonv3.RateLimitDescriptor_Entry) string {
		if v := e.GetValue(); e.GetKey() == "model" && len(v) <= maxEntryLen && utf8.ValidString(v) {
			return est.Canonical(v)
		}
		return e.GetValue()
	}
	return slices.EqualFunc(a.GetEntries(), b.GetEntries(), func(x, y *commonv3.RateLimitDescriptor_Entry) bool {
		return x.GetKey() == y.GetKey() && value(x) == value(y)
	})
}

// refMatch finds the configured node that entries reach, by the
// definition: at each level, among the nodes of the entry's key, the one
// of its exact value, else the longest wildcard prefix of it, else the one
// of any value.
func refMatch(nodes []config.RLSDescriptor, entries []*commonv3.RateLimitDescriptor_Entry) *config.RLSDescriptor {
	var found *config.RLSDescriptor
	for _, e := range entries {
		found = nil
		best := -1
		for i := range nodes {
			n := &nodes[i]
			if n.Key != e.GetKey() {
				continue
			}
			switch p, wild := strings.CutSuffix(n.Value, "*"); {
			case n.Value == e.GetValue() && !wild:
				found, best = n, 1<<30
			case n.Value == "" && best < 0:
				found = n
			case wild && strings.HasPrefix(e.GetValue(), p) && len(p) > best:
				found, best = n, len(p)
			}
		}
		if found == nil {
			return nil
		}
		nodes = found.Descriptors
	}
	return found
}

func limitName(n *config.RLSDescriptor) string {
	if n.RateLimit == nil {
		return ""
	}
	if n.RateLimit.Unlimited {
		return "unlimited"
	}
	return n.RateLimit.Name
}

func nodeName(n *node) string {
	switch {
	case n.limit == nil:
		return ""
	case n.limit.unlimited:
		return "unlimited"
	}
	return n.limit.info.current.Name
}
