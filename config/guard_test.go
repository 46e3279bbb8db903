package config_test

import (
	"strings"
	"testing"

	"github.com/costgate/costgate/config"
)

// The stream guard is set for all upstreams and replaced whole for one;
// its increment is checked, at the field that sets it.
func TestStreamGuard(t *testing.T) {
	const base = "admin_token: x\nupstreams:\n  - {name: openai, kind: openai, base_url: 'http://127.0.0.1:1'}\n  - {name: claude, kind: anthropic, base_url: 'http://127.0.0.1:2', stream_guard: {enabled: false, increment_tokens: 64}}\n"
	cfg, err := config.Parse([]byte(base + "stream_guard: {enabled: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.StreamGuard("openai"); !g.Enabled || g.IncrementTokens != config.DefaultIncrementTokens {
		t.Errorf("openai's guard %+v, want the config's, with the default increment", g)
	}
	if g := cfg.StreamGuard("claude"); g.Enabled || g.IncrementTokens != 64 {
		t.Errorf("claude's guard %+v, want its own", g)
	}
	if g := cfg.StreamGuard("nope"); !g.Enabled {
		t.Errorf("an unknown upstream's guard %+v, want the config's", g)
	}
	off, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if off.StreamGuard("openai").Enabled {
		t.Error("the guard is on by default")
	}
	for _, c := range []struct{ name, yaml, want string }{
		{"negative", "stream_guard: {enabled: true, increment_tokens: -1}\n", "stream_guard.increment_tokens: must be from 1 to 1000000"},
		{"huge", "stream_guard: {increment_tokens: 9223372036854775807}\n", "stream_guard.increment_tokens"},
		{"not a number", "stream_guard: {increment_tokens: lots}\n", "cannot unmarshal !!str `lots`"},
		{"unknown field", "stream_guard: {enabeld: true}\n", "field enabeld not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := config.Parse([]byte(base + c.yaml)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	bad := strings.Replace(base, "increment_tokens: 64", "increment_tokens: 0", 1)
	if _, err := config.Parse([]byte(bad + "stream_guard: {enabled: true}\n")); err != nil {
		t.Errorf("an upstream's increment of 0 takes the default, got %v", err)
	}
	bad = strings.Replace(base, "increment_tokens: 64", "increment_tokens: 2000000", 1)
	if _, err := config.Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "upstreams[1].stream_guard.increment_tokens") {
		t.Errorf("got %v, want an error at upstreams[1].stream_guard.increment_tokens", err)
	}
}
