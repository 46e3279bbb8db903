package policies

import (
	"context"
	"fmt"
	"reflect"
	"testing"
)

// TestFastPathStopsWhereRegoStops pins down where evaluation stops: complete
// rules with constant values stop at the first solution in both
// evaluators (OPA's early exit), so an error in a later solution or
// definition is, or is not, reached in both alike.
func TestFastPathStopsWhereRegoStops(t *testing.T) {
	tests := map[string]string{
		"later definition divides by zero": `package costgate.policies.p
decision := {"outcome": "hard", "status": 429, "reason": "x"} if input.request.page > 5
decision := {"outcome": "hard", "status": 429, "reason": "x"} if 100 / input.estimate.input_tokens > 1`,
		"earlier definition divides by zero": `package costgate.policies.p
decision := {"outcome": "hard", "status": 429, "reason": "x"} if 100 / input.estimate.input_tokens > 1
decision := {"outcome": "hard", "status": 429, "reason": "x"} if input.request.page > 5`,
		"later solution divides by zero": `package costgate.policies.p
decision := {"outcome": "hard", "status": 429, "reason": "x"} if {
	some l in input.limits
	100 / l.remaining > 1
}`,
		"helper with later definition dividing by zero": `package costgate.policies.p
big if input.request.page > 5
big if 100 / input.estimate.input_tokens > 1
decision := {"outcome": "hard", "status": 429, "reason": "x"} if big`,
		"non-constant values": `package costgate.policies.p
decision := {"outcome": "hard", "status": 429, "reason": sprintf("%d", [input.request.page])} if input.request.page > 5
decision := {"outcome": "hard", "status": 429, "reason": sprintf("%d", [input.request.page])} if 100 / input.estimate.input_tokens > 1`,
	}
	inputs := []*Input{}
	for _, page := range []int64{0, 6} {
		for _, tokens := range []int64{0, 10} {
			for _, limits := range [][]Limit{nil, {{Remaining: 1}, {Remaining: 0}}, {{Remaining: 0}, {Remaining: 1}}} {
				in := baseInput()
				in.Request.Page, in.Estimate.InputTokens, in.Limits = page, tokens, limits
				inputs = append(inputs, in)
			}
		}
	}
	for name, src := range tests {
		t.Run(name, func(t *testing.T) {
			s := mustLoad(t, mapFS(map[string]string{"p.rego": src}))
			if !s.Policies()[0].Fast {
				t.Fatalf("not on the fast path: %s", s.Policies()[0].Slow)
			}
			for _, in := range inputs {
				got, err1 := s.Decide(context.Background(), in)
				want, err2 := s.DecideRego(context.Background(), in)
				if fmt.Sprint(err1) != fmt.Sprint(err2) || !reflect.DeepEqual(got, want) {
					t.Errorf("page %d tokens %d limits %v:\nfast %+v %v\nrego %+v %v", in.Request.Page, in.Estimate.InputTokens, in.Limits, got, err1, want, err2)
				}
			}
		})
	}
}
