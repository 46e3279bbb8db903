package policies

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
)

// A promotion enforces the decision rule of a policy its files declare
// shadow, for one version of its source: the SHA-256 of its files and of
// the library files it may import. A changed file changes the digest, and
// the promotion no longer applies.

// digests computes each policy's SourceSHA256 and the set's digest from
// the SHA-256 of each policy and library file, by file name.
func (s *Set) digests(sums map[string][sha256.Size]byte) {
	own := map[string]bool{}
	for _, p := range s.policies {
		for _, f := range p.Files {
			own[f] = true
		}
	}
	var libs, all []string
	for f := range sums {
		all = append(all, f)
		if !own[f] {
			libs = append(libs, f)
		}
	}
	sort.Strings(libs)
	sort.Strings(all)
	for _, p := range s.policies {
		files := append([]string(nil), p.Files...)
		sort.Strings(files)
		p.SourceSHA256 = digestOf(sums, append(files, libs...))
	}
	s.digest = digestOf(sums, all)
}

func digestOf(sums map[string][sha256.Size]byte, files []string) string {
	h := sha256.New()
	for _, f := range files {
		sum := sums[f]
		h.Write([]byte(f))
		h.Write([]byte{0})
		h.Write(sum[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SourceSHA256 is the SHA-256 (hex) of the set's policy and library files
// (not its tests): two sets with the same digest were loaded from the same
// sources.
func (s *Set) SourceSHA256() string { return s.digest }

// Policy describes the policy id; false when the set has none.
func (s *Set) Policy(id string) (PolicyInfo, bool) {
	for _, p := range s.policies {
		if p.ID == id {
			info := p.PolicyInfo
			info.Files = append([]string(nil), p.Files...)
			return info, true
		}
	}
	return PolicyInfo{}, false
}

// Promote returns a set that enforces the decision rule of each shadow
// policy of promoted (policy id to the SourceSHA256 it was promoted for)
// whose source has that digest; its shadow_decision rule stays shadow. A
// promoted policy's info says Promoted, and no longer Shadow. Policies
// absent from s, not shadow, or of another source are left as they are
// (Drifted names them). s itself is not changed; the sets share their
// compiled rules. Promote is safe for concurrent use.
func (s *Set) Promote(promoted map[string]string) *Set {
	if len(promoted) == 0 {
		return s
	}
	out := *s
	out.policies = make([]*policy, len(s.policies))
	for i, p := range s.policies {
		out.policies[i] = p
		if want, ok := promoted[p.ID]; !ok || !p.Shadow || want != p.SourceSHA256 {
			continue
		}
		cp := &policy{PolicyInfo: p.PolicyInfo}
		cp.Shadow, cp.Promoted = false, true
		for _, r := range p.rules {
			rc := *r
			if rc.name == decisionRule {
				rc.shadow = false
			}
			cp.rules = append(cp.rules, &rc)
		}
		out.policies[i] = cp
	}
	return &out
}

// Drifted lists, in id order, the ids of promoted (policy id to the
// SourceSHA256 it was promoted for) that s does not enforce by that
// promotion: the policy is gone, or its source has another digest.
func (s *Set) Drifted(promoted map[string]string) []string {
	var out []string
	for id, want := range promoted {
		info, ok := s.Policy(id)
		if !ok || info.SourceSHA256 != want {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}
