package policies

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"testing"
)

func TestExamplePoliciesRegoTests(t *testing.T) {
	var out bytes.Buffer
	passed, failed, err := Test(context.Background(), dirFS("../examples/policies"), &out)
	if err != nil {
		t.Fatal(err)
	}
	if failed != 0 || passed < 30 {
		t.Fatalf("%d passed, %d failed:\n%s", passed, failed, out.String())
	}
}

func TestExamplePoliciesCombined(t *testing.T) {
	s := mustLoad(t, dirFS("../examples/policies"))
	var ids []string
	for _, p := range s.Policies() {
		ids = append(ids, p.ID)
		if p.ID == "ip_abuse" && !p.Shadow {
			t.Errorf("ip_abuse is not loaded as a shadow policy")
		}
		if p.ID == "budget" && !p.ShadowRule {
			t.Errorf("budget's shadow_decision is not seen")
		}
	}
	if want := []string{"budget", "ip_abuse", "plans", "search_pagination"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("policies = %v, want %v", ids, want)
	}
	in := func(edit func(*Input)) *Input {
		in := &Input{
			Caller:   Caller{Tenant: "acme", User: "u1", KeyID: "k1", Plan: "pro", IP: "198.51.100.7", Region: "eu"},
			Request:  Request{Route: "chat", Upstream: "openai", Model: "gpt-4o", MaxOutputTokens: 1000},
			Estimate: Estimate{InputTokens: 500, OutputTokens: 1000, CostNanoUSD: 12_500_000},
		}
		edit(in)
		return in
	}
	tests := []struct {
		name string
		in   *Input
		want Decision
	}{
		{"plain pro request", in(func(*Input) {}), Decision{Outcome: Allow}},
		{"budget at 85% and pro over its token limit: friction merged", in(func(in *Input) {
			in.Spend = []Spend{{Scope: "user", Period: "day", SpentNanoUSD: 85, BudgetNanoUSD: 100}}
			in.Limits = []Limit{{Name: "tpm", Unit: "tokens", Limit: 10000, Remaining: 10}}
		}), Decision{Outcome: Soft, Reason: "over 80% of budget", Policy: "budget",
			Friction: Friction{DelayMS: 750, CapMaxTokens: 1024, Warning: "over 80% of budget"},
			Sources:  Sources{DelayMS: "plans", CapMaxTokens: "budget", Warning: []string{"budget"}}}},
		{"budget at 95% and free plan over tokens: hard wins", in(func(in *Input) {
			in.Caller.Plan = "free"
			in.Spend = []Spend{{Scope: "tenant", Period: "day", SpentNanoUSD: 95, BudgetNanoUSD: 100}}
			in.Limits = []Limit{{Name: "tpm", Unit: "tokens", Limit: 10000, Remaining: 10}}
		}), Decision{Outcome: Hard, Status: 429, Reason: "the free plan's token limit is reached", Policy: "plans"}},
		{"budget spent (402) beats token limit (429)", in(func(in *Input) {
			in.Caller.Plan = "free"
			in.Spend = []Spend{{Scope: "tenant", Period: "day", SpentNanoUSD: 100, BudgetNanoUSD: 100}}
			in.Limits = []Limit{{Name: "tpm", Unit: "tokens", Limit: 10000, Remaining: 10}}
		}), Decision{Outcome: Hard, Status: 402, Reason: "budget spent", Policy: "budget"}},
		{"abusive IP only in shadow, 70% budget only in shadow", in(func(in *Input) {
			in.Spend = []Spend{{Scope: "key", Period: "month", SpentNanoUSD: 75, BudgetNanoUSD: 100}}
			in.Limits = []Limit{{Name: "per_ip", Unit: "requests", Limit: 100, Remaining: 1}}
		}), Decision{Outcome: Allow, Shadow: []Shadow{
			{Policy: "budget", Outcome: Soft, Reason: "over 70% of budget", Friction: Friction{Warning: "over 70% of budget"}},
			{Policy: "ip_abuse", Outcome: Hard, Status: 429, Reason: "IP 198.51.100.7 sends too many requests"},
		}}},
		{"deep search page", in(func(in *Input) {
			in.Request = Request{Route: "search", Upstream: "brave", Page: 12}
		}), Decision{Outcome: Soft, Reason: "deep pagination", Policy: "search_pagination",
			Friction: Friction{DelayMS: 700}, Sources: Sources{DelayMS: "search_pagination"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Decide(context.Background(), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Decide =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestLoadDirNamesFilesUnderDir(t *testing.T) {
	s, err := LoadDir("../examples/quickstart/policies")
	if err != nil {
		t.Fatal(err)
	}
	p := s.Policies()[0]
	if p.Files[0] != "../examples/quickstart/policies/quickstart.rego" || p.Title != "Quickstart" || p.Description == "" {
		t.Fatalf("policy info %+v", p)
	}
	e, err := NewEngine(dirFS("../examples/quickstart/policies"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ReloadDir(t.TempDir()); !errors.Is(err, ErrNoPolicies) {
		t.Fatalf("ReloadDir(empty) = %v, want ErrNoPolicies", err)
	}
	if e.Set().Policies()[0].ID != "quickstart" {
		t.Fatal("the last good set was not kept")
	}
}
