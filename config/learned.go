package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Reserve is costs.output_reserve: the share of a request's output limit
// (max_tokens, or the model's maximum) reserved before the answer, either
// a percentage (1 to 100) or a quantile of the output learned from the
// tenant's settled requests like it, written "p95" (p50 to p99.9).
type Reserve struct {
	// Percent is the percentage reserved; 0 means 100. It is 0 when
	// Quantile is set.
	Percent int
	// Quantile is the learned quantile reserved (0.5 to 0.999), capped by
	// the output limit; a key with too few observations reserves the
	// whole output limit. 0 for a percentage.
	Quantile float64
}

// UnmarshalYAML reads a percentage (50) or a quantile ("p95", "p99.9").
func (r *Reserve) UnmarshalYAML(n *yaml.Node) error {
	v := strings.TrimSpace(n.Value)
	if q, ok := strings.CutPrefix(v, "p"); ok {
		whole, tenth, dotted := strings.Cut(q, ".")
		w, err1 := strconv.Atoi(whole)
		d, err2 := 0, error(nil)
		if dotted {
			d, err2 = strconv.Atoi(tenth)
		}
		permille := w*10 + d
		if err1 != nil || err2 != nil || !digits(whole) || (dotted && (len(tenth) != 1 || !digits(tenth))) || permille < 500 || permille > 999 {
			return fmt.Errorf("output_reserve %q: a quantile is written p50 to p99.9", n.Value)
		}
		*r = Reserve{Quantile: float64(permille) / 1000}
		return nil
	}
	p, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("output_reserve %q: want a percentage from 1 to 100, or a learned quantile such as p95", n.Value)
	}
	*r = Reserve{Percent: p}
	return nil
}

// MarshalYAML writes r as UnmarshalYAML reads it.
func (r Reserve) MarshalYAML() (any, error) {
	if r.Quantile > 0 {
		return r.String(), nil
	}
	return r.Percent, nil
}

// String is "p95" for a quantile, "50%" for a percentage.
func (r Reserve) String() string {
	if r.Quantile > 0 {
		return "p" + strconv.FormatFloat(math.Round(r.Quantile*1000)/10, 'f', -1, 64)
	}
	p := r.Percent
	if p == 0 {
		p = 100
	}
	return strconv.Itoa(p) + "%"
}

// FallbackPercent is the percentage reserved when no learned estimate
// applies: Percent, or 100 (the whole output limit) for a quantile.
func (r Reserve) FallbackPercent() int {
	if r.Quantile > 0 {
		return 100
	}
	return r.Percent
}

// LearnedConfig tunes the learned output estimates that output_reserve:
// pNN reserves (see package learned).
type LearnedConfig struct {
	// MinSamples is how many settled requests a tenant's model, route and
	// shape needs before its quantile is reserved. Default 100.
	MinSamples int `yaml:"min_samples"`
	// MaxKeys bounds the estimates held, MaxKeysPerTenant those of one
	// tenant. Default 20000 and 256.
	MaxKeys          int `yaml:"max_keys"`
	MaxKeysPerTenant int `yaml:"max_keys_per_tenant"`
	// Interval is how often each replica adds its observations to Redis
	// and reads back the merged estimates (or, without Redis, writes them
	// to data_dir/learned.json). Default 10s.
	Interval time.Duration `yaml:"interval"`
	// MaxExposure bounds, per tenant and replica, what the learned
	// reservations in flight leave unreserved: the sum over them of the
	// cost of their whole output limit less the cost reserved, in dollars,
	// and MaxExposureTokens the same in output tokens. A request that would
	// pass either bound reserves its whole output limit instead. So an
	// answer longer than its learned estimate can exceed a budget by no
	// more than MaxExposure per replica, or a token limit by no more than
	// MaxExposureTokens. Default "1.00" and 100000.
	MaxExposure       USD   `yaml:"max_exposure"`
	MaxExposureTokens int64 `yaml:"max_exposure_tokens"`
}

// validateLearned reports the problems of the output reserve and the
// learned estimates' knobs.
func (c *CostsConfig) validateLearned(bad func(path, format string, args ...any)) {
	if r := c.OutputReserve; r.Quantile == 0 && (r.Percent < 0 || r.Percent > 100) {
		bad("costs.output_reserve", "must be a percentage from 1 to 100, or a learned quantile such as p95")
	}
	l := c.Learned
	if l.MinSamples < 0 || l.MaxKeys < 0 || l.MaxKeysPerTenant < 0 || l.Interval < 0 || l.MaxExposure < 0 || l.MaxExposureTokens < 0 {
		bad("costs.learned", "min_samples, max_keys, max_keys_per_tenant, interval, max_exposure and max_exposure_tokens must not be negative")
	}
	if l.Interval > 0 && l.Interval < 100*time.Millisecond {
		bad("costs.learned.interval", "must be at least 100ms")
	}
}

// digits tells whether s is one or more ASCII digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
