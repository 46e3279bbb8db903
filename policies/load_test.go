package policies

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"testing/fstest"
)

func quickstartFS() fstest.MapFS { return dirFS("../examples/quickstart/policies") }

// dirFS copies a directory's .rego files into a MapFS, so tests can edit them.
func dirFS(dir string) fstest.MapFS {
	m := fstest.MapFS{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		panic(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(dir + "/" + e.Name())
		if err != nil {
			panic(err)
		}
		m[e.Name()] = &fstest.MapFile{Data: b}
	}
	return m
}

func mustLoad(t testing.TB, fsys fstest.MapFS) *Set {
	t.Helper()
	s, err := Load(fsys)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return s
}

func baseInput() *Input {
	return &Input{
		Caller:   Caller{Tenant: "demo-free", KeyID: "k1", Plan: "free", IP: "192.0.2.1"},
		Request:  Request{Route: "chat", Upstream: "openai", Model: "gpt-4o-mini"},
		Estimate: Estimate{InputTokens: 12, OutputTokens: 64, CostNanoUSD: 40_000},
		Spend:    []Spend{{Scope: "tenant", Period: "day", SpentNanoUSD: 10_000_000, BudgetNanoUSD: 50_000_000}},
		Time:     Time{Unix: 1764500000, Hour: 10, Weekday: 1},
	}
}

func TestQuickstart(t *testing.T) {
	s := mustLoad(t, quickstartFS())
	if got := s.Tests(); got < 10 {
		t.Errorf("Tests() = %d, want the quickstart's Rego tests to have run", got)
	}
	tests := []struct {
		name   string
		edit   func(*Input)
		want   Outcome
		status int
	}{
		{"free plan, allowed model", func(*Input) {}, Allow, 0},
		{"free plan, haiku", func(in *Input) { in.Request.Model = "claude-3-5-haiku-20241022" }, Allow, 0},
		{"free plan, gpt-4o", func(in *Input) { in.Request.Model = "gpt-4o" }, Hard, 403},
		{"pro plan, gpt-4o", func(in *Input) { in.Caller.Plan = "pro"; in.Request.Model = "gpt-4o" }, Allow, 0},
		{"budget spent", func(in *Input) { in.Spend[0].SpentNanoUSD = in.Spend[0].BudgetNanoUSD }, Hard, 402},
		{"no spend entries", func(in *Input) { in.Spend = nil }, Allow, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput()
			tc.edit(in)
			d, err := s.Decide(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			if d.Outcome != tc.want || d.Status != tc.status {
				t.Fatalf("Decide = %+v, want %s %d", d, tc.want, tc.status)
			}
			if d.Outcome == Hard && (d.Policy != "quickstart" || d.Reason == "") {
				t.Errorf("hard decision without policy or reason: %+v", d)
			}
		})
	}
}

func TestLoadErrorsCarryFileAndLine(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string // substring of the error
	}{
		{"parse error", map[string]string{"a.rego": "package costgate.policies.a\n\ndecision := {\n"}, "a.rego:4"},
		{"unknown input field", map[string]string{"a.rego": "package costgate.policies.a\n\ndecision := {\"outcome\": \"hard\", \"status\": 403} if {\n\tinput.caller.plann == \"free\"\n}\n"}, "a.rego:4"},
		{"wrong input type", map[string]string{"a.rego": "package costgate.policies.a\n\ndecision := {\"outcome\": \"allow\"} if {\n\tinput.caller.plan + 1 > 3\n}\n"}, "a.rego:4"},
		{"no decision rule", map[string]string{"a.rego": "package costgate.policies.a\n\nx := 1\n"}, "a.rego:1"},
		{"nested policy package", map[string]string{"a.rego": "package costgate.policies.a.b\n\ndecision := {\"outcome\": \"allow\"}\n"}, "a.rego:1"},
		{"failing test", map[string]string{
			"a.rego":      "package costgate.policies.a\n\ndecision := {\"outcome\": \"allow\"}\n",
			"a_test.rego": "package costgate.policies.a_test\n\nimport data.costgate.policies.a\n\ntest_ok if a.decision.outcome == \"allow\"\n\ntest_wrong if {\n\ta.decision.outcome == \"hard\"\n}\n",
		}, "a_test.rego:7"},
		{"network I/O", map[string]string{"a.rego": "package costgate.policies.a\n\ndecision := {\"outcome\": \"allow\"} if {\n\thttp.send({\"method\": \"get\", \"url\": \"http://example.com\"}).status_code == 200\n}\n"}, "a.rego:4"},
		{"wall clock", map[string]string{"a.rego": "package costgate.policies.a\n\ndecision := {\"outcome\": \"allow\"} if time.now_ns() > 0\n"}, "a.rego:3"},
		{"bad shadow annotation", map[string]string{"a.rego": "# METADATA\n# custom:\n#   shadow: yes please\npackage costgate.policies.a\n\ndecision := {\"outcome\": \"allow\"}\n"}, "a.rego:1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for k, v := range tc.files {
				fsys[k] = &fstest.MapFile{Data: []byte(v)}
			}
			_, err := Load(fsys)
			var perr *Error
			if !errors.As(err, &perr) {
				t.Fatalf("Load error = %v (%T), want *Error", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load error = %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestLoadEmpty(t *testing.T) {
	_, err := Load(fstest.MapFS{"README.md": &fstest.MapFile{Data: []byte("x")}})
	if !errors.Is(err, ErrNoPolicies) {
		t.Fatalf("Load(empty) = %v, want ErrNoPolicies", err)
	}
}

func TestTestReportsLikeOPATest(t *testing.T) {
	var out bytes.Buffer
	passed, failed, err := Test(context.Background(), quickstartFS(), &out)
	if err != nil {
		t.Fatal(err)
	}
	if failed != 0 || passed < 10 {
		t.Fatalf("Test = %d passed, %d failed\n%s", passed, failed, out.String())
	}
	if !strings.Contains(out.String(), "PASS: ") {
		t.Errorf("no summary line in\n%s", out.String())
	}

	fsys := quickstartFS()
	fsys["extra_test.rego"] = &fstest.MapFile{Data: []byte("package x_test\n\ntest_fails if false\n")}
	out.Reset()
	passed2, failed2, err := Test(context.Background(), fsys, &out)
	if err != nil {
		t.Fatal(err)
	}
	if failed2 != 1 || passed2 != passed {
		t.Fatalf("Test = %d passed, %d failed, want %d and 1\n%s", passed2, failed2, passed, out.String())
	}
	if !strings.Contains(out.String(), "extra_test.rego:3") || !strings.Contains(out.String(), "FAIL: 1/") {
		t.Errorf("failure not reported with file and line:\n%s", out.String())
	}
}

func TestShadowNeverChangesEnforcement(t *testing.T) {
	s := mustLoad(t, mapFS(map[string]string{
		"a.rego": "package costgate.policies.a\n\ndecision := {\"outcome\": \"soft\", \"reason\": \"a\", \"friction\": {\"delay_ms\": 5}}\n",
		// A shadow policy whose decision is malformed on every input.
		"b.rego": "# METADATA\n# custom:\n#   shadow: true\npackage costgate.policies.b\n\ndecision := {\"outcome\": \"hard\", \"status\": 500}\n",
		// A shadow rule beside an enforced allow, refusing everything.
		"c.rego": "package costgate.policies.c\n\ndecision := {\"outcome\": \"allow\"}\n\nshadow_decision := {\"outcome\": \"hard\", \"status\": 403, \"reason\": \"c\"}\n",
	}))
	d, err := s.Decide(context.Background(), baseInput())
	if err != nil {
		t.Fatalf("a failing shadow policy made Decide fail: %v", err)
	}
	if d.Outcome != Soft || d.Policy != "a" || d.Friction.DelayMS != 5 {
		t.Fatalf("enforced decision changed by shadow policies: %+v", d)
	}
	if len(d.Shadow) != 2 || d.Shadow[0].Policy != "b" || !strings.Contains(d.Shadow[0].Error, "not 429, 402 or 403") ||
		d.Shadow[1] != (Shadow{Policy: "c", Outcome: Hard, Status: 403, Reason: "c"}) {
		t.Fatalf("Shadow = %+v", d.Shadow)
	}
}

func TestDecideNilInput(t *testing.T) {
	s := mustLoad(t, quickstartFS())
	if _, err := s.Decide(context.Background(), nil); !errors.Is(err, ErrNilInput) {
		t.Fatalf("Decide(nil) = %v, want ErrNilInput", err)
	}
}

func TestEnforcedPolicyErrorIsAnError(t *testing.T) {
	s := mustLoad(t, mapFS(map[string]string{
		"a.rego": "package costgate.policies.a\n\ndecision := {\"outcome\": \"hard\"} if input.request.page > 3\n",
	}))
	in := baseInput()
	in.Request.Page = 4
	_, err := s.Decide(context.Background(), in)
	if err == nil || !strings.Contains(err.Error(), "policy a") || !strings.Contains(err.Error(), "needs status") {
		t.Fatalf("Decide = %v, want an error naming policy a and the missing status", err)
	}
}

// TestEnforcedPolicyErrorLeavesTheOthers: an input that breaks one
// enforced policy (here a decision made malformed, as a caller's request
// can make a rule conflict) is an error naming it, and the other
// policies still decide: the refusal of b stands.
func TestEnforcedPolicyErrorLeavesTheOthers(t *testing.T) {
	for _, fast := range []bool{true, false} {
		s := mustLoad(t, mapFS(map[string]string{
			"a.rego": "package costgate.policies.a\n\ndecision := {\"outcome\": \"hard\"} if input.request.page > 3\n",
			"b.rego": "package costgate.policies.b\n\ndecision := {\"outcome\": \"hard\", \"status\": 402, \"reason\": \"b\"} if input.request.page > 3\n",
			"c.rego": "package costgate.policies.c\n\ndecision := {\"outcome\": \"soft\", \"friction\": {\"delay_ms\": 5}}\n",
		}))
		in := baseInput()
		in.Request.Page = 4
		d, err := s.decide(context.Background(), in, fast)
		if err == nil || !strings.Contains(err.Error(), "policy a") || strings.Contains(err.Error(), "policy b") {
			t.Errorf("fast %v: err = %v, want one naming policy a alone", fast, err)
		}
		if d.Outcome != Hard || d.Status != 402 || d.Policy != "b" {
			t.Errorf("fast %v: Decision = %+v, want b's 402", fast, d)
		}
	}
}

func TestLibraryPackages(t *testing.T) {
	s := mustLoad(t, mapFS(map[string]string{
		"lib/plans.rego": "package costgate.lib.plans\n\nquota := {\"free\": 10, \"pro\": 100}\n\nover(plan, n) if n > quota[plan]\n",
		"p.rego":         "package costgate.policies.p\n\nimport data.costgate.lib.plans\n\ndecision := {\"outcome\": \"hard\", \"status\": 429, \"reason\": \"quota\"} if plans.over(input.caller.plan, input.request.page)\n",
	}))
	if ps := s.Policies(); len(ps) != 1 || ps[0].ID != "p" || !ps[0].Fast {
		t.Fatalf("policies = %+v, want p alone, on the fast path", ps)
	}
	in := baseInput()
	for page, want := range map[int64]Outcome{10: Allow, 11: Hard} {
		in.Request.Page = page
		d, err := s.Decide(context.Background(), in)
		if err != nil || d.Outcome != want {
			t.Fatalf("page %d: Decide = %+v, %v; want %s", page, d, err, want)
		}
	}
}
