package policies_test

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/costgate/costgate/policies"
)

// InputPaths lists the constant prefix of every reference to input, in
// policies and libraries alike.
func TestInputPaths(t *testing.T) {
	tests := []struct {
		name string
		rego string
		want []string
	}{
		{"fields", `package costgate.policies.p
decision := {"outcome": "allow"} if {
	input.caller.plan == "free"
	input.request.attributes.tier == "x"
}`, []string{"caller.plan", "request.attributes.tier"}},
		{"list elements", `package costgate.policies.p
decision := {"outcome": "allow"} if {
	some l in input.limits
	l.remaining < input.spend[0].spent_nano_usd
}`, []string{"limits", "spend"}},
		{"a library", `package costgate.policies.p
import data.costgate.lib.l
decision := {"outcome": "allow"} if l.night
` + "\n-- lib --\n" + `package costgate.lib.l
night if input.time.hour < 6`, []string{"time.hour"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for i, src := range splitModules(tt.rego) {
				fsys[string(rune('a'+i))+".rego"] = &fstest.MapFile{Data: []byte(src)}
			}
			s, err := policies.Load(fsys)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.InputPaths(); !slices.Equal(got, tt.want) {
				t.Errorf("InputPaths %q, want %q", got, tt.want)
			}
		})
	}
}

func splitModules(s string) []string { return strings.Split(s, "\n-- lib --\n") }
