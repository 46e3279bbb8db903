package config_test

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/costgate/costgate/config"
)

func TestOutputReserve(t *testing.T) {
	for _, c := range []struct {
		in       string
		percent  int
		quantile float64
		fallback int
		str      string
		err      string
	}{
		{in: "50", percent: 50, fallback: 50, str: "50%"},
		{in: "0", fallback: 0, str: "100%"},
		{in: "p95", quantile: 0.95, fallback: 100, str: "p95"},
		{in: `"p99.9"`, quantile: 0.999, fallback: 100, str: "p99.9"},
		{in: "p50", quantile: 0.5, fallback: 100, str: "p50"},
		{in: "p49", err: "p50 to p99.9"},
		{in: "p100", err: "p50 to p99.9"},
		{in: "p1e2", err: "p50 to p99.9"},
		{in: "p+95", err: "p50 to p99.9"},
		{in: "pNaN", err: "p50 to p99.9"},
		{in: "p", err: "p50 to p99.9"},
		{in: "P95", err: "a learned quantile such as p95"},
		{in: "95%", err: "a learned quantile such as p95"},
		{in: "0.95", err: "a learned quantile such as p95"},
		{in: "99999999999999999999", err: "a learned quantile such as p95"},
	} {
		t.Run(c.in, func(t *testing.T) {
			var r config.Reserve
			err := yaml.Unmarshal([]byte(c.in), &r)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Percent != c.percent || r.Quantile != c.quantile || r.FallbackPercent() != c.fallback || r.String() != c.str {
				t.Fatalf("%+v fallback %d %q", r, r.FallbackPercent(), r.String())
			}
			out, err := yaml.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			var back config.Reserve
			if err := yaml.Unmarshal(out, &back); err != nil || back != r {
				t.Fatalf("round trip %q: %+v %v", out, back, err)
			}
		})
	}
}

func TestLearnedConfigErrorsNameTheirField(t *testing.T) {
	base := "admin_token: t\ntenants: [{name: a, plan: p, keys: [{key: k1234567890}]}]\ncosts:\n"
	for _, c := range []struct{ yaml, field string }{
		{"  output_reserve: 101\n", "costs.output_reserve"},
		{"  output_reserve: -1\n", "costs.output_reserve"},
		{"  output_reserve: p95\n  learned: {min_samples: -1}\n", "costs.learned"},
		{"  learned: {max_exposure: \"-1\"}\n", "costs.learned"},
		{"  learned: {interval: 1ms}\n", "costs.learned.interval"},
		{"  output_reserve: p999\n", "output_reserve"},
		{"  learned: {nope: 1}\n", "nope"},
	} {
		_, err := config.Parse([]byte(base + c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%q: error %v, want one naming %s", c.yaml, err, c.field)
		}
	}
	cfg, err := config.Parse([]byte(base + "  output_reserve: p95\n  learned: {min_samples: 50, max_exposure: \"0.25\", max_exposure_tokens: 5000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Costs.OutputReserve.Quantile != 0.95 || cfg.Costs.Learned.MinSamples != 50 || cfg.Costs.Learned.MaxExposure != 250_000_000 || cfg.CostModel().OutputReserve != 100 {
		t.Fatalf("%+v %+v", cfg.Costs.OutputReserve, cfg.Costs.Learned)
	}
}
