package replay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/replay"
)

// copyPolicies copies the example policies (without their Rego tests) to
// a new directory, with the free plan's output cap replaced by freeCap.
func copyPolicies(t testing.TB, freeCap int) string {
	t.Helper()
	src := filepath.Join("..", "examples", "policies")
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".rego") || strings.HasSuffix(e.Name(), "_test.rego") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "plans.rego" {
			old := `"free": {"max_output_tokens": 1024,`
			if !strings.Contains(string(b), old) {
				t.Fatal("plans.rego no longer sets the free plan's cap as this test expects")
			}
			b = []byte(strings.Replace(string(b), old, fmt.Sprintf(`"free": {"max_output_tokens": %d,`, freeCap), 1))
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// call is one generated request.
type call struct {
	tenant, plan string
	model        string
	maxTokens    int64
	cost         int64
}

var plans = map[string]string{
	"free-0": "free", "free-1": "free", "free-2": "free",
	"pro-0": "pro", "pro-1": "pro", "ent-0": "enterprise", "odd": "gold",
}

// workload generates n requests from a fixed seed.
func workload(n int) []call {
	r := rand.New(rand.NewPCG(1, 2))
	tenants := []string{"free-0", "free-1", "free-2", "pro-0", "pro-1", "ent-0", "odd"}
	models := []string{"gpt-4o", "gpt-4o-mini", ""}
	caps := []int64{0, 100, 256, 257, 300, 1024, 1025, 2000, 9000, 40000}
	out := make([]call, n)
	for i := range out {
		t := tenants[r.IntN(len(tenants))]
		out[i] = call{tenant: t, plan: plans[t], model: models[r.IntN(len(models))],
			maxTokens: caps[r.IntN(len(caps))], cost: 1 + r.Int64N(1_000_000)}
	}
	return out
}

// capture runs calls through a real gate (the memory store, an embedded
// ledger, the example policies, capture on) and returns the capture
// directory once the gate is closed.
func capture(t testing.TB, calls []call) string {
	t.Helper()
	dir := t.TempDir()
	var tenants strings.Builder
	for _, name := range []string{"free-0", "free-1", "free-2", "pro-0", "pro-1", "ent-0", "odd"} {
		fmt.Fprintf(&tenants, "  - {name: %s, plan: %s, keys: [{id: %s-key, key: cg-%s}]}\n", name, plans[name], name, name)
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
policies: {dir: %q}
capture: {enabled: true}
tenants:
%s`, dir, copyPolicies(t, 1024), tenants.String())))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g, err := gate.Open(ctx, cfg, gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		caller := g.Trusted(c.tenant, "u", c.tenant+"-key", "")
		res, _ := g.Reserve(ctx, &gate.Request{ID: fmt.Sprintf("req_%06d", i), Caller: caller,
			Route: "/v1/chat/completions", Upstream: "openai",
			Estimate: costmodel.Estimate{Model: c.model, MaxOutputTokens: c.maxTokens, Cost: costmodel.NanoUSD(c.cost)}})
		if res != nil {
			res.Cancel(ctx)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "capture")
}

// plansDecision is the example plans policy, written again for the
// requests of this workload (no limits, no budgets): an unknown plan is
// refused, a model's output beyond the plan's cap (or uncapped) is capped.
func plansDecision(c call, freeCap int64) (policies.Outcome, int64) {
	caps := map[string]int64{"free": freeCap, "pro": 8192, "enterprise": 32768}
	cp, ok := caps[c.plan]
	switch {
	case !ok:
		return policies.Hard, 0
	case c.model != "" && (c.maxTokens == 0 || c.maxTokens > cp):
		return policies.Soft, cp
	}
	return policies.Allow, 0
}

// Tightening the free plan's cap from 1024 to 256 output tokens changes
// exactly the free plan's requests the test's own model says it does.
func TestReplayCountsTheChanges(t *testing.T) {
	calls := workload(700)
	dir := capture(t, calls)

	type agg struct {
		n    int
		cost costmodel.NanoUSD
	}
	wantTrans := map[string]agg{}
	wantTenants := map[string]agg{}
	var changed int
	for _, c := range calls {
		o1, cap1 := plansDecision(c, 1024)
		o2, cap2 := plansDecision(c, 256)
		if o1 == o2 && cap1 == cap2 {
			continue
		}
		changed++
		k := string(o1) + "->" + string(o2)
		wantTrans[k] = agg{wantTrans[k].n + 1, wantTrans[k].cost + costmodel.NanoUSD(c.cost)}
		wantTenants[c.tenant] = agg{wantTenants[c.tenant].n + 1, wantTenants[c.tenant].cost + costmodel.NanoUSD(c.cost)}
	}
	if changed == 0 || len(wantTrans) != 2 {
		t.Fatalf("the workload changes %d requests in %d ways; want both allow->soft and soft->soft", changed, len(wantTrans))
	}

	rep, err := replay.Run(context.Background(), os.DirFS(copyPolicies(t, 256)), dir, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != len(calls) || rep.Replayed != len(calls) || rep.Truncated != 0 || rep.Changed != changed {
		t.Fatalf("records %d, replayed %d, truncated %d, changed %d; want %d, %d, 0, %d",
			rep.Records, rep.Replayed, rep.Truncated, rep.Changed, len(calls), len(calls), changed)
	}
	var total costmodel.NanoUSD
	for _, tr := range rep.Transitions {
		w := wantTrans[tr.Name()]
		if tr.Count != w.n || tr.Cost != w.cost {
			t.Errorf("%s: %d requests, %s; want %d, %s", tr.Name(), tr.Count, tr.Cost, w.n, w.cost)
		}
		if len(tr.Samples) != min(3, w.n) {
			t.Errorf("%s: %d samples", tr.Name(), len(tr.Samples))
		}
		for _, s := range tr.Samples {
			if s.Input.Caller.Plan != "free" || s.New.Friction.CapMaxTokens != 256 || s.New.Policy != "plans" {
				t.Errorf("%s: sample %+v -> %+v of plan %q", tr.Name(), s.Old, s.New, s.Input.Caller.Plan)
			}
		}
		total += tr.Cost
		delete(wantTrans, tr.Name())
	}
	if len(wantTrans) > 0 {
		t.Errorf("transitions missing from the report: %v", wantTrans)
	}
	if rep.ChangedCost != total {
		t.Errorf("changed cost %s, want %s", rep.ChangedCost, total)
	}
	if len(rep.Policies) != 1 || rep.Policies[0].Policy != "plans" || rep.Policies[0].Count != changed {
		t.Errorf("policies %+v; want plans with %d changes", rep.Policies, changed)
	}
	if len(rep.Tenants) != len(wantTenants) {
		t.Errorf("tenants %+v; want %v", rep.Tenants, wantTenants)
	}
	for i, tc := range rep.Tenants {
		w := wantTenants[tc.Tenant]
		if tc.Count != w.n || tc.Cost != w.cost {
			t.Errorf("tenant %s: %d, %s; want %d, %s", tc.Tenant, tc.Count, tc.Cost, w.n, w.cost)
		}
		if i > 0 && rep.Tenants[i-1].Count < tc.Count {
			t.Errorf("tenants not sorted by changes: %+v", rep.Tenants)
		}
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"allow->soft", "soft->soft", "plans", "free-0"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}

	t.Run("the same report on one worker", func(t *testing.T) {
		one, err := replay.Run(context.Background(), os.DirFS(copyPolicies(t, 256)), dir, replay.Options{Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(one, rep) {
			t.Errorf("one worker:\n%+v\nGOMAXPROCS workers:\n%+v", one, rep)
		}
	})
	t.Run("the policies that took the decisions change nothing", func(t *testing.T) {
		rep, err := replay.Run(context.Background(), os.DirFS(copyPolicies(t, 1024)), dir, replay.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Changed != 0 || rep.Replayed != len(calls) {
			t.Errorf("changed %d of %d; want 0 of %d: %+v", rep.Changed, rep.Replayed, len(calls), rep.Transitions)
		}
	})
	t.Run("tenant and since filters", func(t *testing.T) {
		rep, err := replay.Run(context.Background(), os.DirFS(copyPolicies(t, 256)), dir, replay.Options{Tenant: "free-1"})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range calls {
			if c.tenant == "free-1" {
				n++
			}
		}
		if rep.Replayed != n || rep.Changed != wantTenants["free-1"].n {
			t.Errorf("free-1: replayed %d, changed %d; want %d, %d", rep.Replayed, rep.Changed, n, wantTenants["free-1"].n)
		}
		rep, err = replay.Run(context.Background(), os.DirFS(copyPolicies(t, 256)), dir,
			replay.Options{Since: time.Hour, Now: time.Now().Add(2 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Replayed != 0 || rep.Records != len(calls) {
			t.Errorf("an hour, two hours later: replayed %d of %d, want none", rep.Replayed, rep.Records)
		}
	})
}

// Both evaluators decide every captured input alike, and the decision a
// replay of the same policies gives is the one the gate took.
func TestFastPathAndOPAAgreeOnCapturedInputs(t *testing.T) {
	calls := workload(300)
	dir := capture(t, calls)
	set, err := policies.LoadDir(copyPolicies(t, 1024))
	if err != nil {
		t.Fatal(err)
	}
	files, err := replay.Files(dir)
	if err != nil || len(files) == 0 {
		t.Fatalf("files %v, %v", files, err)
	}
	n := 0
	for _, f := range files {
		_, err := replay.ReadFile(f, func(rec *replay.Record, line int) error {
			n++
			fast, err1 := set.Decide(context.Background(), rec.Input)
			ref, err2 := set.DecideRego(context.Background(), rec.Input)
			if err1 != nil || err2 != nil {
				return fmt.Errorf("%s: %v, %v", rec.RequestID, err1, err2)
			}
			if fast.String() != ref.String() || replay.TakenOf(&fast) != rec.Decision {
				return fmt.Errorf("%s: fast %s, OPA %s, taken %s", rec.RequestID, fast, ref, rec.Decision)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n != len(calls) {
		t.Errorf("%d records, want %d", n, len(calls))
	}
}

// A file cut in its last record is read up to it and the cut counted; a
// malformed line elsewhere, a foreign version and a file that is no
// capture are errors naming the file.
func TestBadCaptureFiles(t *testing.T) {
	src := capture(t, workload(20))
	files, err := replay.Files(src)
	if err != nil || len(files) != 1 {
		t.Fatalf("files %v, %v", files, err)
	}
	good, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(good), "\n")
	candidate := os.DirFS(copyPolicies(t, 256))
	write := func(t *testing.T, content string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "capture-20260101T000000.000000000Z-000001.jsonl"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	t.Run("truncated last record", func(t *testing.T) {
		cut := string(good[:len(good)-40])
		rep, err := replay.Run(context.Background(), candidate, write(t, cut), replay.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Truncated != 1 || rep.Records != 19 {
			t.Errorf("truncated %d, records %d; want 1, 19", rep.Truncated, rep.Records)
		}
		var text strings.Builder
		rep.WriteText(&text)
		if !strings.Contains(text.String(), "1 truncated records skipped") {
			t.Errorf("the text report hides the truncated record:\n%s", text.String())
		}
	})
	tests := []struct {
		name    string
		content string
		want    string
		version bool
	}{
		{"cut in the middle", lines[0] + lines[1] + lines[2][:30] + "\n" + strings.Join(lines[3:], ""), ".jsonl:3: malformed record", false},
		{"foreign version", `{"costgate_capture":2}` + "\n" + strings.Join(lines[1:], ""), "the file is version 2; this costgate reads version 1", true},
		{"not a capture", `{"hello":"world"}` + "\n", "not a capture header", true},
		{"empty", "", "not a capture header", true},
		{"unknown field", lines[0] + lines[1] + `{"request_id":"x","input":{},"bogus":1}` + "\n", `.jsonl:3: malformed record: json: unknown field "bogus"`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := replay.Run(context.Background(), candidate, write(t, tt.content), replay.Options{})
			var fe *replay.FileError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), tt.want) || errors.Is(err, replay.ErrVersion) != tt.version {
				t.Errorf("error %v; want a *FileError containing %q (ErrVersion %v)", err, tt.want, tt.version)
			}
		})
	}
	t.Run("a field the capture lacks", func(t *testing.T) {
		// A capture written before caller.region existed; the example
		// policies read it.
		if !strings.Contains(string(good), `,"region":""`) {
			t.Fatal("the capture has no caller.region to remove")
		}
		old := strings.ReplaceAll(string(good), `,"region":""`, "")
		_, err := replay.Run(context.Background(), candidate, write(t, old), replay.Options{})
		var mf *replay.MissingFieldError
		if !errors.As(err, &mf) || mf.Field != "caller.region" || !strings.Contains(err.Error(), "read input.caller.region") {
			t.Errorf("error %v; want a *MissingFieldError for caller.region", err)
		}
	})
	t.Run("a missing directory", func(t *testing.T) {
		_, err := replay.Run(context.Background(), candidate, filepath.Join(t.TempDir(), "nope"), replay.Options{})
		if err == nil || !strings.Contains(err.Error(), "capture directory") {
			t.Errorf("error %v", err)
		}
	})
}
