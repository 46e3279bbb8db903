package policies

import (
	"context"
	"strings"
	"testing"
)

// TestOnErrorAtkBrokenInputPassesAHardLimit: a policy refuses a request
// whose priority attribute, a number, is above 5. A caller that sends a
// priority that is no number makes the policy fail to evaluate, and a
// failed policy allows: the caller passed the refusal. A package that
// says on_error: deny refuses such a request (403, naming the policy),
// on the fast path and on the general evaluator; one that says nothing
// still allows, with the error; a value other than allow or deny is a
// load error.
func TestOnErrorAtkBrokenInputPassesAHardLimit(t *testing.T) {
	policy := func(onError string) string {
		meta := ""
		if onError != "" {
			meta = "# METADATA\n# custom:\n#   on_error: " + onError + "\npackage costgate.policies.prio\n"
		} else {
			meta = "package costgate.policies.prio\n"
		}
		return meta + `
decision := {"outcome": "hard", "status": 429, "reason": "priority above 5"} if {
	to_number(input.request.attributes.priority) > 5
}
`
	}
	for _, fast := range []bool{true, false} {
		for _, tc := range []struct {
			onError, priority string
			outcome           Outcome
			status            int
		}{
			{"deny", "9", Hard, 429},
			{"deny", "1", Allow, 0},
			{"deny", "nine", Hard, 403},
			{"deny", "0x", Hard, 403},
			{"allow", "nine", Allow, 0},
			{"", "nine", Allow, 0},
		} {
			s := mustLoad(t, mapFS(map[string]string{"prio.rego": policy(tc.onError)}))
			in := baseInput()
			in.Request.Attributes = map[string]string{"priority": tc.priority}
			d, err := s.decide(context.Background(), in, fast)
			broken := tc.priority == "nine" || tc.priority == "0x"
			if broken != (err != nil) {
				t.Errorf("fast %v, on_error %q, priority %q: err = %v", fast, tc.onError, tc.priority, err)
			}
			if d.Outcome != tc.outcome || d.Status != tc.status {
				t.Errorf("fast %v, on_error %q, priority %q: %+v, want %v %d", fast, tc.onError, tc.priority, d, tc.outcome, tc.status)
			}
			if tc.status == 403 && (d.Policy != "prio" || !strings.Contains(d.Reason, "prio")) {
				t.Errorf("a refusal on error names no policy: %+v", d)
			}
		}
	}
	if _, err := Load(mapFS(map[string]string{"prio.rego": policy("maybe")})); err == nil || !strings.Contains(err.Error(), "on_error") {
		t.Errorf("on_error: maybe loaded: %v", err)
	}
	if s := mustLoad(t, mapFS(map[string]string{"prio.rego": policy("deny")})); !s.Policies()[0].DenyOnError {
		t.Error("PolicyInfo.DenyOnError is false for on_error: deny")
	}
}
