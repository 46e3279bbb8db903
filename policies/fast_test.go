package policies

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

// TestFastPathEqualsRego decides randomized inputs with the fast path and
// with the general Rego evaluator alone, and requires the same Decision, or
// an error from both.
func TestFastPathEqualsRego(t *testing.T) {
	dirs := []string{"../examples/policies", "../examples/quickstart/policies", "testdata/constructs"}
	n := 4000
	if testing.Short() || raceEnabled {
		n = 800 // the race detector makes the general evaluator ten times slower
	}
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) {
			s := mustLoad(t, dirFS(dir))
			for _, p := range s.Policies() {
				if !p.Fast {
					t.Logf("policy %s runs on the general evaluator: %s", p.ID, p.Slow)
				}
			}
			r := rand.New(rand.NewPCG(7, uint64(len(dir))))
			ctx := context.Background()
			var errs, bails int
			why := map[string]int{}
			outcomes := map[Outcome]int{}
			for i := range n {
				in := randomInput(r)
				bails += countBails(s, in, why)
				got, gotErr := s.Decide(ctx, in)
				want, wantErr := s.DecideRego(ctx, in)
				if (gotErr != nil) != (wantErr != nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
					t.Fatalf("input %d %+v:\nfast error %v\nrego error %v", i, in, gotErr, wantErr)
				}
				if gotErr != nil {
					errs++
					continue
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("input %d %+v:\nfast %+v\nrego %+v", i, in, got, want)
				}
				outcomes[got.Outcome]++
			}
			if n := fastPanics.Load(); n != 0 {
				t.Fatalf("the fast path panicked %d times", n)
			}
			t.Logf("%d inputs: %v, %d errors, %d rule evaluations handed to the general evaluator: %v", n, outcomes, errs, bails, why)
			if len(outcomes) < 2 {
				t.Errorf("the random inputs reach only %v: the test compares too little", outcomes)
			}
		})
	}
}

// countBails reports how many fast rules of s hand in over to the general
// evaluator.
func countBails(s *Set, in *Input, why map[string]int) int {
	if s.prog == nil {
		return 0
	}
	m := s.prog.machine(in)
	defer s.prog.release(m)
	n := 0
	for _, p := range s.policies {
		for _, r := range p.rules {
			if r.fast == nil {
				continue
			}
			if _, _, err := r.fast.eval(m); err == errBail {
				n++
				why[m.why]++
			}
			m.bail, m.why = false, ""
		}
	}
	return n
}

func TestFastPathCoverage(t *testing.T) {
	for _, dir := range []string{"../examples/policies", "../examples/quickstart/policies"} {
		s := mustLoad(t, dirFS(dir))
		for _, p := range s.Policies() {
			if !p.Fast {
				t.Errorf("%s: policy %s is not on the fast path: %s", dir, p.ID, p.Slow)
			}
		}
	}
}

// TestFastPathFallsBack checks that constructs the fast path does not
// compile leave the policy on the general evaluator, with the reason, and
// that decisions stay right.
func TestFastPathFallsBack(t *testing.T) {
	tests := []struct {
		name, src, slow string
	}{
		{"with", `package costgate.policies.p
decision := {"outcome": "soft", "reason": "x", "friction": {"delay_ms": 1}} if {
	inner with input.caller.plan as "free"
}
inner if input.caller.plan == "free"`, "with"},
		{"function with a constant argument", `package costgate.policies.p
f(1) := 2
decision := {"outcome": "hard", "status": 429, "reason": "x"} if f(input.request.page) > 1`, "not a plain variable"},
		{"object comprehension", `package costgate.policies.p
decision := {"outcome": "hard", "status": 429, "reason": "x"} if {
	count({l.name: l.remaining | some l in input.limits; l.remaining == 0}) > 1
}`, "term"},
		{"unknown builtin", `package costgate.policies.p
decision := {"outcome": "hard", "status": 403, "reason": "x"} if regex.match("^10[.]", input.caller.ip)`, "regex.match"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustLoad(t, fstest.MapFS{"p.rego": &fstest.MapFile{Data: []byte(tc.src)}})
			p := s.Policies()[0]
			if p.Fast || !strings.Contains(p.Slow, tc.slow) {
				t.Fatalf("policy is fast=%v slow=%q, want it on the general evaluator because of %q", p.Fast, p.Slow, tc.slow)
			}
			r := rand.New(rand.NewPCG(1, 1))
			for range 200 {
				in := randomInput(r)
				got, err1 := s.Decide(context.Background(), in)
				want, err2 := s.DecideRego(context.Background(), in)
				if fmt.Sprint(err1) != fmt.Sprint(err2) || !reflect.DeepEqual(got, want) {
					t.Fatalf("Decide = %+v, %v; general evaluator %+v, %v", got, err1, want, err2)
				}
			}
		})
	}
}

// TestBenchInputsStayOnFastPath makes sure the benchmark measures the fast
// path: realistic inputs never need the general evaluator.
func TestBenchInputsStayOnFastPath(t *testing.T) {
	s := mustLoad(t, dirFS("../examples/policies"))
	why := map[string]int{}
	n := 0
	for _, in := range benchInputs(512) {
		n += countBails(s, in, why)
	}
	if n != 0 {
		t.Fatalf("%d of 512 benchmark inputs left the fast path: %v", n, why)
	}
}

// TestFastPathIteratesInputObjects is a regression test: iterating the
// fields of one element of input.limits or input.spend found nothing on the
// fast path, so a policy refusing on a field value silently allowed.
func TestFastPathIteratesInputObjects(t *testing.T) {
	tests := []struct{ name, body string }{
		{"limit", `some _, v in input.limits[0]
	v == "bad"`},
		{"spend", `some v in input.spend[0]
	v == "bad"`},
		{"comprehension", `"bad" in [v | some v in input.limits[0]]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := "package costgate.policies.p\ndecision := {\"outcome\": \"hard\", \"status\": 403, \"reason\": \"x\"} if {\n\t" + tc.body + "\n}\n"
			s := mustLoad(t, fstest.MapFS{"p.rego": &fstest.MapFile{Data: []byte(src)}})
			in := baseInput()
			in.Limits = []Limit{{Name: "bad", Unit: "requests", Limit: 1}}
			in.Spend = []Spend{{Scope: "bad", Period: "day"}}
			got, err := s.Decide(context.Background(), in)
			if err != nil || got.Outcome != Hard {
				t.Fatalf("Decide = %v, %v; want hard", got, err)
			}
		})
	}
}
