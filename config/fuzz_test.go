package config

import (
	"reflect"
	"testing"

	"github.com/costgate/costgate/examples"
)

// FuzzParseConfig checks that Parse never panics on arbitrary bytes, and
// that a config it accepts is a fixed point: validating it again finds
// nothing, and applying the defaults again changes nothing.
func FuzzParseConfig(f *testing.F) {
	for _, b := range validConfigs {
		f.Add(b)
	}
	f.Add([]byte("limits:\n  - name: x\n    algorithm: leaky\n    rate: -1\n    period: -5s\n"))
	f.Add([]byte("admin_token: [1, 2]\nmax_body_bytes: -1\n"))
	f.Add([]byte("admin_token: t\nbudgets:\n  - name: b\n    amount: 1e400\n"))
	f.Add([]byte("admin_token: t\nlimits:\n  - name: x\n    rate: 9223372036854775807\n    period: 1ns\n    burst: 9223372036854775807\n"))
	f.Add([]byte("{}"))
	f.Add([]byte("- a\n- b\n"))
	f.Add([]byte("admin_token: &a t\nregion: *a\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			if c != nil {
				t.Errorf("Parse returned a config with the error %v", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Errorf("a parsed config does not validate again: %v", err)
		}
		again := *c
		again.applyDefaults(Defaults{})
		if !reflect.DeepEqual(&again, c) {
			t.Errorf("applying the defaults twice changed the config:\n%+v\n%+v", c, &again)
		}
		for i, l := range c.Limits {
			if _, err := l.Weighted(); err != nil {
				t.Errorf("limits[%d] validated but does not convert: %v", i, err)
			}
		}
	})
}

// validConfigs are configs Parse accepts: the fuzzer's seeds for the
// success path, checked by TestValidConfigSeeds so that they stay valid.
var validConfigs = [][]byte{
	examples.QuickstartConfig(),
	examples.DemoConfig(),
	[]byte("admin_token: t\n"),
	[]byte(`admin_token: t
upstreams:
  - name: openai
    kind: openai
    simulate: always
tenants:
  - name: acme
    plan: free
    keys: [{key: k1, id: acme-key, user: alice}]
limits:
  - name: r
    dimensions: [tenant, model]
    algorithm: gcra
    unit: tokens
    rate: 100
    period: 1m
    burst: 200
  - name: usd
    unit: usd
    rate_usd: "0.25"
    period: 1h
budgets:
  - name: daily
    amount: "1.50"
costs:
  prices:
    my-model: {input: "0.30", output: "1.20", max_output_tokens: 100}
  output_reserve: 50
`),
	[]byte(`admin_token: t
upstreams:
  - name: geo
    kind: generic
    base_url: https://geo.example
    auth_query: api_key
    cost:
      unit: addresses
      per_unit: 0.005
      units: {json: addresses, default: 1, max: 1000}
    paths:
      - prefix: /v1/batch
        cost: {per_call: 0.01}
`),
}

func TestValidConfigSeeds(t *testing.T) {
	for i, b := range validConfigs {
		if _, err := Parse(b); err != nil {
			t.Errorf("seed %d: %v", i, err)
		}
	}
}
