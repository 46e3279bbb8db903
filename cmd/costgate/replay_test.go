package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/replay"
)

// policy replay --format json reads the capture the config names and
// prints the report for CI.
func TestPolicyReplayJSON(t *testing.T) {
	dir := t.TempDir()
	capDir := filepath.Join(dir, "cap")
	w, err := replay.Open(replay.WriterConfig{Dir: capDir})
	if err != nil {
		t.Fatal(err)
	}
	allow := policies.Decision{Outcome: policies.Allow}
	for i, c := range []struct {
		plan string
		cost int64
	}{{"free", 100}, {"free", 9000}, {"pro", 9000}, {"free", 7000}} {
		in := &policies.Input{Caller: policies.Caller{Tenant: c.plan + "-co", KeyID: "k", Plan: c.plan},
			Estimate: policies.Estimate{CostNanoUSD: c.cost}, Time: policies.Time{Unix: 1_780_000_000}}
		w.Capture(fmt.Sprintf("req_%d", i), in, &allow)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(dir, "policies")
	os.Mkdir(pol, 0o700)
	os.WriteFile(filepath.Join(pol, "cheap.rego"), []byte(`package costgate.policies.cheap

decision := {"outcome": "hard", "status": 429, "reason": "too dear for free"} if {
	input.caller.plan == "free"
	input.estimate.cost_nano_usd > 1000
}
`), 0o600)
	cfg := filepath.Join(dir, "costgate.yaml")
	os.WriteFile(cfg, []byte("admin_token: t\ncapture: {dir: cap}\n"), 0o600)

	out, _, err := runCmd(t, "", "policy", "replay", "--policies", pol, "--format", "json", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var rep replay.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if rep.Replayed != 4 || rep.Changed != 2 || rep.ChangedCost != 16000 || len(rep.Transitions) != 1 {
		t.Fatalf("report %+v", rep)
	}
	tr := rep.Transitions[0]
	if tr.Name() != "allow->hard" || tr.Count != 2 || len(tr.Samples) != 2 || tr.Samples[0].RequestID != "req_1" || tr.Samples[0].New.Status != 429 {
		t.Errorf("transition %+v", tr)
	}
	if len(rep.Tenants) != 1 || rep.Tenants[0].Tenant != "free-co" || len(rep.Policies) != 1 || rep.Policies[0].Policy != "cheap" {
		t.Errorf("tenants %+v, policies %+v", rep.Tenants, rep.Policies)
	}

	text, _, err := runCmd(t, "", "policy", "replay", "--policies", pol, "--capture", capDir, "--tenant", "pro-co")
	if err != nil || !strings.Contains(text, "replayed 1 of 4") || !strings.Contains(text, "0 would be decided differently") {
		t.Errorf("text for pro-co: %v\n%s", err, text)
	}
	for _, args := range [][]string{
		{"policy", "replay"},
		{"policy", "replay", "--policies", pol, "--format", "xml", "--capture", capDir},
		{"policy", "replay", "--policies", filepath.Join(dir, "none"), "--capture", capDir},
	} {
		if _, _, err := runCmd(t, "", args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
