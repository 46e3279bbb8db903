package policies_test

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/costgate/costgate/policies"
)

const shadowPolicy = `# METADATA
# custom:
#   shadow: true
package costgate.policies.strict

import rego.v1

decision := {"outcome": "hard", "status": 429, "reason": "strict"} if input.caller.tenant == "acme"

shadow_decision := {"outcome": "hard", "status": 403, "reason": "stricter"} if input.caller.tenant == "acme"
`

const enforcedPolicy = `package costgate.policies.open

import rego.v1

decision := {"outcome": "allow"}
`

// TestPromote: a promotion enforces a shadow policy's decision rule for
// the source it names, and nothing else.
func TestPromote(t *testing.T) {
	fsys := fstest.MapFS{
		"strict.rego": {Data: []byte(shadowPolicy)},
		"open.rego":   {Data: []byte(enforcedPolicy)},
	}
	set, err := policies.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	info, ok := set.Policy("strict")
	if !ok || !info.Shadow || len(info.SourceSHA256) != 64 {
		t.Fatalf("strict: %+v", info)
	}
	in := &policies.Input{Caller: policies.Caller{Tenant: "acme"}}
	decide := func(s *policies.Set) policies.Decision {
		t.Helper()
		d, err := s.Decide(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.DecideRego(context.Background(), in)
		if err != nil || r.Outcome != d.Outcome || r.Status != d.Status {
			t.Fatalf("fast %+v, rego %+v %v", d, r, err)
		}
		return d
	}
	if d := decide(set); d.Outcome != policies.Allow || len(d.Shadow) != 2 {
		t.Fatalf("before: %+v", d)
	}
	for name, promoted := range map[string]map[string]string{
		"another source": {"strict": "00"},
		"not shadow":     {"open": set.Policies()[0].SourceSHA256},
		"unknown":        {"nope": info.SourceSHA256},
	} {
		if d := decide(set.Promote(promoted)); d.Outcome != policies.Allow {
			t.Errorf("%s: %+v, want allow", name, d)
		}
	}
	p := set.Promote(map[string]string{"strict": info.SourceSHA256})
	d := decide(p)
	if d.Outcome != policies.Hard || d.Status != 429 || d.Policy != "strict" || len(d.Shadow) != 1 || d.Shadow[0].Status != 403 {
		t.Fatalf("promoted: %+v", d)
	}
	if pi, _ := p.Policy("strict"); pi.Shadow || !pi.Promoted {
		t.Fatalf("promoted info: %+v", pi)
	}
	if pi, _ := set.Policy("strict"); !pi.Shadow || pi.Promoted {
		t.Fatalf("the original set changed: %+v", pi)
	}
	if got := set.Drifted(map[string]string{"strict": info.SourceSHA256, "gone": "x"}); len(got) != 1 || got[0] != "gone" {
		t.Fatalf("drifted: %v", got)
	}

	// A changed file, or a changed library, is another source.
	changed := fstest.MapFS{
		"strict.rego": {Data: []byte(shadowPolicy + "\n# a comment\n")},
		"open.rego":   {Data: []byte(enforcedPolicy)},
	}
	lib := fstest.MapFS{
		"strict.rego": {Data: []byte(shadowPolicy)},
		"open.rego":   {Data: []byte(enforcedPolicy)},
		"lib.rego":    {Data: []byte("package costgate.lib.x\n\nimport rego.v1\n\ny := 1\n")},
	}
	for name, fs := range map[string]fstest.MapFS{"changed": changed, "library": lib} {
		s2, err := policies.Load(fs)
		if err != nil {
			t.Fatal(err)
		}
		if s2.SourceSHA256() == set.SourceSHA256() {
			t.Errorf("%s: same set digest", name)
		}
		if got := s2.Drifted(map[string]string{"strict": info.SourceSHA256}); len(got) != 1 {
			t.Errorf("%s: not drifted", name)
		}
		if d := decide(s2.Promote(map[string]string{"strict": info.SourceSHA256})); d.Outcome != policies.Allow {
			t.Errorf("%s: a promotion for other code applies: %+v", name, d)
		}
	}
	// The same files give the same digests.
	again, _ := policies.Load(fsys)
	if again.SourceSHA256() != set.SourceSHA256() {
		t.Error("the set's digest is not stable")
	}
	if pi, _ := again.Policy("strict"); pi.SourceSHA256 != info.SourceSHA256 {
		t.Error("the policy's digest is not stable")
	}
}
