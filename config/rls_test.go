package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/weighted"
)

// rlsBase is a config whose rls section a test adds.
const rlsBase = "admin_token: x\nlimits: [{name: free-requests, dimensions: [tenant], rate: 5, period: 1m}]\n"

func TestRLSErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"domain required", "rls: {domains: [{descriptors: [{key: a}]}]}", "rls.domains[0].domain: required"},
		{"bad transport", "rls: {transport: grpc}", `rls.transport: must be "grpcwire" or "grpc-go", not "grpc"`},
		{"reflection on grpcwire", "rls: {transport: grpcwire, reflection: true}", `rls.transport: the reflection service (rls.reflection) needs transport "grpc-go"`},
		{"duplicate domain", "rls: {domains: [{domain: d}, {domain: d}]}", `rls.domains[1].domain: duplicate domain "d"`},
		{"key required", "rls: {domains: [{domain: d, descriptors: [{value: v}]}]}", "rls.domains[0].descriptors[0].key: required"},
		{"duplicate any value", "rls: {domains: [{domain: d, descriptors: [{key: a}, {key: a}]}]}", `rls.domains[0].descriptors[1]: duplicate descriptor key "a" with any value`},
		{"duplicate value", "rls: {domains: [{domain: d, descriptors: [{key: a, value: v}, {key: a, value: v}]}]}", `rls.domains[0].descriptors[1].value: duplicate`},
		{"star alone", "rls: {domains: [{domain: d, descriptors: [{key: a, value: '*'}]}]}", "rls.domains[0].descriptors[0].value: leave the value out"},
		{"star inside", "rls: {domains: [{domain: d, descriptors: [{key: a, value: 'a*b'}]}]}", "rls.domains[0].descriptors[0].value: only a trailing *"},
		{"bad role", "rls: {domains: [{domain: d, descriptors: [{key: a, as: team}]}]}", `rls.domains[0].descriptors[0].as: must be tenant, user or model, not "team"`},
		{"tenant twice", "rls: {domains: [{domain: d, descriptors: [{key: a, as: tenant, tenant: acme}]}]}", "rls.domains[0].descriptors[0].tenant: set tenant or as: tenant"},
		{"model twice", "rls: {domains: [{domain: d, descriptors: [{key: a, as: model, model: gpt-4o}]}]}", "rls.domains[0].descriptors[0].model: set model or as: model"},
		{"model and tenant in one key", "rls: {domains: [{domain: d, descriptors: [{key: a, value: 'gpt*', as: model}, {key: a, as: tenant}]}]}", `rls.domains[0].descriptors[1].as: key "a" is read as a model's name by another descriptor of this level`},
		{"user and model in one key", "rls: {domains: [{domain: d, descriptors: [{key: a, value: x, as: user}, {key: a, as: model}]}]}", `rls.domains[0].descriptors[0].as: key "a" is read as a model's name by another descriptor of this level`},
		{"tenant with a hash tag", "rls: {domains: [{domain: d, descriptors: [{key: a, tenant: 'a{b}'}]}]}", "rls.domains[0].descriptors[0].tenant: must not contain"},
		{"plan without tenant", "rls: {domains: [{domain: d, descriptors: [{key: a, plan: free}]}]}", "rls.domains[0].descriptors[0].plan: a plan is for the tenant"},
		{"bad hits", "rls: {domains: [{domain: d, descriptors: [{key: a, hits: bytes}]}]}", `rls.domains[0].descriptors[0].hits: must be one of requests, tokens, input_tokens, output_tokens, not "bytes"`},
		{"price on tokens", "rls: {domains: [{domain: d, descriptors: [{key: a, hits: output_tokens, price_per_hit: '0.01'}]}]}", "rls.domains[0].descriptors[0].price_per_hit: only hits in requests take a price"},
		{"negative price", "rls: {domains: [{domain: d, descriptors: [{key: a, price_per_hit: '-0.01'}]}]}", "rls.domains[0].descriptors[0].price_per_hit: must not be negative"},
		{"bad posture", "rls: {domains: [{domain: d, descriptors: [{key: a, on_store_failure: maybe}]}]}", "rls.domains[0].descriptors[0].on_store_failure"},
		{"bad loss posture", "rls: {domains: [{domain: d, descriptors: [{key: a, on_data_loss: keep}]}]}", "rls.domains[0].descriptors[0].on_data_loss"},
		{"bad unit", "rls: {domains: [{domain: d, descriptors: [{key: a, descriptors: [{key: b, rate_limit: {unit: fortnight, requests_per_unit: 1}}]}]}]}", `rls.domains[0].descriptors[0].descriptors[0].rate_limit.unit: must be second, minute, hour, day, week, month or year, not "fortnight"`},
		{"no unit", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {requests_per_unit: 1}}]}]}", "rls.domains[0].descriptors[0].rate_limit.unit"},
		{"bad algorithm", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}}]}]}", `rls.domains[0].descriptors[0].rate_limit.algorithm: unknown algorithm "leaky"`},
		{"concurrency", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, algorithm: concurrency}}]}]}", "rls.domains[0].descriptors[0].rate_limit.algorithm: concurrency needs a release"},
		{"negative rate", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: -1}}]}]}", "rls.domains[0].descriptors[0].rate_limit.requests_per_unit: must not be negative"},
		{"negative multiplier", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: -2}}]}]}", "rls.domains[0].descriptors[0].rate_limit.unit_multiplier: must be positive"},
		{"period too long", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 2}}]}]}", "rls.domains[0].descriptors[0].rate_limit.unit_multiplier: the period is longer"},
		{"period overflows", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 9223372036854775807}}]}]}", "rls.domains[0].descriptors[0].rate_limit.unit_multiplier"},
		{"burst on a window", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, burst: 5, algorithm: fixed_window}}]}]}", "rls.domains[0].descriptors[0].rate_limit.burst: does not apply to fixed_window"},
		{"burst on a block", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 0, algorithm: token_bucket, burst: 5}}]}]}", "rls.domains[0].descriptors[0].rate_limit.burst: a limit of 0"},
		{"rate too large", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 9223372036854775807}}]}]}", "rls.domains[0].descriptors[0].rate_limit: rate"},
		{"unlimited with a rate", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unlimited: true, unit: second}}]}]}", "rls.domains[0].descriptors[0].rate_limit.unlimited: an unlimited descriptor takes no other"},
		{"name of a configured limit", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {name: free-requests, unit: second, requests_per_unit: 1}}]}]}", `rls.domains[0].descriptors[0].rate_limit.name: duplicate limit or budget name "free-requests"`},
		{"names collide", "rls: {domains: [{domain: d, descriptors: [{key: a, value: 'x:y', rate_limit: {unit: second, requests_per_unit: 1}}, {key: a, value: 'x_y', rate_limit: {unit: second, requests_per_unit: 1}}]}]}", `rls.domains[0].descriptors[1].rate_limit.name: duplicate limit or budget name "d.a_x_y"`},
		{"an override's name", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {name: d.override.second.1.5, unit: second, requests_per_unit: 1}}]}]}", `rls.domains[0].descriptors[0].rate_limit.name: must not contain ".override."`},
		{"key delimiter in a name", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {name: 'a{b', unit: second, requests_per_unit: 1}}]}]}", "rls.domains[0].descriptors[0].rate_limit.name: must not contain"},
		{"unknown field", "rls: {domains: [{domain: d, descriptors: [{key: a, detailed_metric: true}]}]}", "field detailed_metric not found"},
		{"replaces an unknown limit", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: x}]}}]}]}", `rls.domains[0].descriptors[0].rate_limit.replaces[0].name: no descriptor of this domain has a rate_limit named "x"`},
		{"replaces itself", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}}]}]}", "rls.domains[0].descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself"},
		{"replaces no name", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}}]}]}", "rls.domains[0].descriptors[0].rate_limit.replaces[0].name: required"},
		{"replaces a configured limit", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: free-requests}]}}]}]}", `no descriptor of this domain has a rate_limit named "free-requests"`},
		{"replaces another domain's limit", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {name: da, unit: second, requests_per_unit: 1}}]}, {domain: e, descriptors: [{key: a, rate_limit: {name: ea, unit: second, requests_per_unit: 1, replaces: [{name: da}]}}]}]}", `rls.domains[1].descriptors[0].rate_limit.replaces[0].name: no descriptor of this domain has a rate_limit named "da"`},
		{"unlimited replaces", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {name: a, unit: second, requests_per_unit: 1}}, {key: b, rate_limit: {unlimited: true, replaces: [{name: a}]}}]}]}", "rls.domains[0].descriptors[1].rate_limit.unlimited: an unlimited descriptor takes no other"},
		{"lease share", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 10, lease: {max_share: 0}}}]}]}", "rls.domains[0].descriptors[0].rate_limit.lease.max_share: must be more than 0"},
		{"lease ttl", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 10, lease: {max_share: 0.1, ttl: 2h}}}]}]}", "rls.domains[0].descriptors[0].rate_limit.lease.ttl"},
		{"lease of a block", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 0, lease: {max_share: 0.1}}}]}]}", "rls.domains[0].descriptors[0].rate_limit.lease: a limit of 0 refuses everything"},
		{"price billed to nobody", "rls: {domains: [{domain: d, descriptors: [{key: a, descriptors: [{key: b, price_per_hit: '0.01'}]}]}]}", "rls.domains[0].descriptors[0].descriptors[0].price_per_hit: no tenant would be billed"},
		{"price of unlimited", "rls: {domains: [{domain: d, descriptors: [{key: a, price_per_hit: '0.01', rate_limit: {unlimited: true}}]}]}", "rls.domains[0].descriptors[0].price_per_hit: an unlimited descriptor is neither counted nor charged"},
		{"tokens of unlimited", "rls: {domains: [{domain: d, descriptors: [{key: a, hits: output_tokens, rate_limit: {unlimited: true}}]}]}", "rls.domains[0].descriptors[0].hits: an unlimited descriptor is neither counted nor charged: its output_tokens would go unbilled"},
		{"lease of unlimited", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unlimited: true, lease: {max_share: 0.1}}}]}]}", "rls.domains[0].descriptors[0].rate_limit.unlimited: an unlimited descriptor takes no other"},
		{"lease of concurrency", "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, algorithm: concurrency, lease: {max_share: 0.1}}}]}]}", "rls.domains[0].descriptors[0].rate_limit.algorithm: concurrency needs a release"},
		{"bad listen", "rls_listen: nowhere\n", "rls_listen: must be host:port"},
		{"demo keys in public", "rls_listen: ':8081'\ntenants: [{name: demo, plan: free, keys: [{key: cg-demo-free}]}]\n", "rls_listen: this configuration holds published demo keys"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Parse([]byte(rlsBase + c.yaml + "\n"))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	var fe *config.FieldError
	_, err := config.Parse([]byte(rlsBase + "rls: {domains: [{domain: d, descriptors: [{key: a, rate_limit: {unit: eon, requests_per_unit: 1}}]}]}\n"))
	if !errors.As(err, &fe) || fe.Path != "rls.domains[0].descriptors[0].rate_limit.unit" {
		t.Errorf("want a *FieldError at rls.domains[0].descriptors[0].rate_limit.unit, got %#v", err)
	}
}

func TestRLSDefaults(t *testing.T) {
	cfg, err := config.Parse([]byte(rlsBase + `
tenants: [{name: acme, plan: free, keys: [{key: k1}]}]
rls_listen: 127.0.0.1:8081
rls:
  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 60}
        - key: tenant
          as: tenant
          descriptors:
            - key: generic_key
              value: search
              price_per_hit: "0.005"
              rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 3, algorithm: token_bucket, burst: 6}
        - key: internal
          rate_limit: {unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RLS.Reflection {
		t.Error("reflection is on by default")
	}
	d := cfg.RLS.Domains[0].Descriptors
	ip := d[0]
	if ip.Hits != "requests" || ip.OnStoreFailure != "fail_open" || ip.RateLimit.Algorithm != "token_bucket" ||
		ip.RateLimit.Name != "edge.remote_address" || ip.RateLimit.Period() != time.Minute {
		t.Errorf("defaults: %+v %+v", ip, *ip.RateLimit)
	}
	search := d[1].Descriptors[0]
	if search.RateLimit.Name != "edge.tenant.generic_key_search" || search.RateLimit.Period() != 10*time.Second {
		t.Errorf("nested: %+v", *search.RateLimit)
	}
	l, err := search.RateLimit.Weighted()
	if err != nil || l.Algorithm != weighted.TokenBucket || l.Rate != 3 || l.Burst != 6 || l.Period != 10*time.Second {
		t.Errorf("Weighted = %v, %v", l, err)
	}
	if u := d[2].RateLimit; !u.Unlimited || u.Name != "" || u.Algorithm != "" {
		t.Errorf("an unlimited limit took defaults: %+v", *u)
	}
	// Demo keys are fine on a loopback RLS listener.
	if _, err := config.Parse([]byte("admin_token: cg-demo-admin\nrls_listen: '[::1]:8081'\n")); err != nil {
		t.Errorf("demo token with a loopback rls_listen: %v", err)
	}
}

// TestRLSPlanAtkUnknownPlan: while a limit applies by plan, a tenant the
// rate limit service names on a plan no tenant of the configuration has
// (a misspelling, another case) would get none of the plan's limits:
// refused, naming the plans. Without a limit or budget by plan a plan is
// a label, and any is taken.
func TestRLSPlanAtkUnknownPlan(t *testing.T) {
	planned := "admin_token: x\ntenants: [{name: acme, plan: free, keys: [{key: k}]}]\nlimits: [{name: free-requests, plans: [free], dimensions: [tenant], rate: 5, period: 1m}]\n"
	for _, plan := range []string{"fre", "Free", "' free'", "bench"} {
		rls := "rls: {domains: [{domain: d, descriptors: [{key: tenant, as: tenant, descriptors: [{key: x, tenant: t1, plan: " + plan + "}]}]}]}\n"
		_, err := config.Parse([]byte(planned + rls))
		if err == nil || !strings.Contains(err.Error(), "rls.domains[0].descriptors[0].descriptors[0].plan: no tenant has plan") || !strings.Contains(err.Error(), "the tenants' plans: free") {
			t.Errorf("plan %s under a limit by plan: %v; want the plan refused, naming free", plan, err)
		}
	}
	ok := "rls: {domains: [{domain: d, descriptors: [{key: x, tenant: t1, plan: free}]}]}\n"
	if _, err := config.Parse([]byte(planned + ok)); err != nil {
		t.Errorf("a known plan: %v", err)
	}
	label := "rls: {domains: [{domain: d, descriptors: [{key: x, tenant: t1, plan: gold}]}]}\n"
	if _, err := config.Parse([]byte(rlsBase + label)); err != nil {
		t.Errorf("a plan without limits by plan: %v", err)
	}
}
