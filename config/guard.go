package config

import "fmt"

// StreamGuardConfig makes costgate debit a stream's output as it passes, in
// increments beyond its reservation, and stop the stream in its API's own
// format when an increment is refused (see the proxy's stream guard). It
// is set for all upstreams (stream_guard) and may be set again, whole, for
// one upstream (upstreams[].stream_guard).
type StreamGuardConfig struct {
	// Enabled turns the guard on. Default false.
	Enabled bool `yaml:"enabled"`
	// IncrementTokens is how many output tokens one increment debits, 1 to
	// 1,000,000. A budget can be exceeded by about one increment per
	// stream in flight. Default 256.
	IncrementTokens int64 `yaml:"increment_tokens"`
}

// DefaultIncrementTokens is a stream guard's increment when the config
// sets none.
const DefaultIncrementTokens = 256

func (g *StreamGuardConfig) applyDefaults() {
	if g.IncrementTokens == 0 {
		g.IncrementTokens = DefaultIncrementTokens
	}
}

func (g StreamGuardConfig) validate(p string, bad func(path, format string, args ...any)) {
	if g.IncrementTokens < 1 || g.IncrementTokens > 1_000_000 {
		bad(p+".increment_tokens", "must be from 1 to 1000000 tokens, not %d", g.IncrementTokens)
	}
}

// StreamGuard is the stream guard of the upstream named name: its own
// stream_guard when it sets one, else the config's.
func (c *Config) StreamGuard(name string) StreamGuardConfig {
	for _, u := range c.Upstreams {
		if u.Name == name && u.StreamGuard != nil {
			return *u.StreamGuard
		}
	}
	return c.StreamGuardAll
}

func (c *Config) guardDefaults() {
	c.StreamGuardAll.applyDefaults()
	for i := range c.Upstreams {
		if g := c.Upstreams[i].StreamGuard; g != nil {
			g.applyDefaults()
		}
	}
}

func (c *Config) validateGuards(bad func(path, format string, args ...any)) {
	c.StreamGuardAll.validate("stream_guard", bad)
	for i, u := range c.Upstreams {
		if u.StreamGuard != nil {
			u.StreamGuard.validate(fmt.Sprintf("upstreams[%d].stream_guard", i), bad)
		}
	}
}
