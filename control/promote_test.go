package control_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
)

// strictPolicy is declared shadow: it would refuse every request of the
// config's tenant yamlco with a 429.
const strictPolicy = `# METADATA
# title: strict
# custom:
#   shadow: true
package costgate.policies.strict

import rego.v1

decision := {"outcome": "hard", "status": 429, "reason": "strict: yamlco is closed"} if input.caller.tenant == "yamlco"
`

// policyReplica is a replica with the policy directory dir and capture on.
func policyReplica(t *testing.T, up, dsn, dir string) *replica {
	t.Helper()
	return newReplica(t, up, replicaOptions{dsn: dsn, extra: fmt.Sprintf("policies:\n  dir: %q\ncapture:\n  enabled: true\n", dir)})
}

func policyDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "strict.rego"), []byte(strictPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

type replayAnswer struct {
	ReplayID     string `json:"replay_id"`
	Policy       string `json:"policy"`
	ReportSHA256 string `json:"report_sha256"`
	PolicySHA256 string `json:"policy_sha256"`
	Document     struct {
		Summary struct {
			Replayed    int            `json:"replayed"`
			Changed     int            `json:"changed"`
			Transitions map[string]int `json:"transitions"`
		} `json:"summary"`
		Report json.RawMessage `json:"report"`
	} `json:"document"`
}

// replayStrict runs the promotion replay of strict on r until the
// capture (flushed every second) holds at least n requests.
func replayStrict(t *testing.T, r *replica, n int) replayAnswer {
	t.Helper()
	var out replayAnswer
	deadline := time.Now().Add(15 * time.Second)
	for {
		out = replayAnswer{}
		st, body := r.call(t, "test-admin", "POST", "/admin/v1/policies/strict/promote/replay", `{"since":"1h"}`, &out)
		if st == 200 && out.Document.Summary.Replayed >= n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("promotion replay: %d %s", st, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// auditActions lists the policy's audit entries, oldest first, as
// "action" with their details.
func auditOf(t *testing.T, r *replica, policy string) []map[string]any {
	t.Helper()
	var out struct {
		Audit []struct {
			Action string         `json:"action"`
			Actor  string         `json:"actor"`
			Kind   string         `json:"kind"`
			Detail map[string]any `json:"detail"`
		} `json:"audit"`
	}
	r.must(t, 200, "GET", "/admin/v1/audit?entity="+policy, "", &out)
	var es []map[string]any
	for i := len(out.Audit) - 1; i >= 0; i-- {
		a := out.Audit[i]
		if a.Kind != "policy" {
			t.Fatalf("audit kind %q", a.Kind)
		}
		a.Detail["action"], a.Detail["actor"] = a.Action, a.Actor
		es = append(es, a.Detail)
	}
	return es
}

func modeOf(t *testing.T, r *replica, policy string) (mode string, promotedBy string) {
	t.Helper()
	var out struct {
		Policies []struct {
			ID        string `json:"id"`
			Mode      string `json:"mode"`
			Declared  string `json:"declared"`
			Promotion *struct {
				By string `json:"promoted_by"`
			} `json:"promotion"`
		} `json:"policies"`
	}
	r.must(t, 200, "GET", "/admin/v1/policies", "", &out)
	for _, p := range out.Policies {
		if p.ID == policy {
			if p.Declared != "shadow" {
				t.Fatalf("declared %q", p.Declared)
			}
			if p.Promotion != nil {
				promotedBy = p.Promotion.By
			}
			return p.Mode, promotedBy
		}
	}
	t.Fatalf("policy %s not listed", policy)
	return "", ""
}

// TestPromotion promotes a shadow policy through the admin API of one of
// two replicas on one PostgreSQL: refused without a replay, with another
// digest, by the read-only token; once acknowledged, both replicas
// enforce it within a second; the audit log keeps the replay and the
// promotion; a demotion and a changed policy file return it to shadow.
func TestPromotion(t *testing.T) {
	dsn := pgtest.New(t)
	up := simulatorURL(t)
	dir := policyDir(t)
	a := policyReplica(t, up, dsn, dir)
	b := policyReplica(t, up, dsn, dir)

	for _, r := range []*replica{a, b} {
		if st, body := r.chat(t, "cg-test-yaml"); st != 200 {
			t.Fatalf("shadow policy refuses: %d %s", st, body)
		}
	}
	if _, body := a.call(t, "test-admin", "GET", "/admin/v1/shadow", "", nil); !strings.Contains(body, "strict") {
		t.Fatalf("the shadow view does not record strict: %s", body)
	}
	if m, _ := modeOf(t, a, "strict"); m != "shadow" {
		t.Fatalf("mode %q", m)
	}

	t.Run("refused without an acknowledged replay", func(t *testing.T) {
		cases := []struct {
			name, token, path, body string
			want                    int
			says                    string
		}{
			{"no replay", "test-admin", "strict/promote", `{}`, 400, "replay_id and acknowledge_sha256 are required"},
			{"unknown replay", "test-admin", "strict/promote", `{"replay_id":"rpl_nope","acknowledge_sha256":"` + strings.Repeat("0", 64) + `"}`, 409, "no replay"},
			{"unknown field", "test-admin", "strict/promote", `{"replay_id":"x","ack":"y"}`, 400, "unknown field"},
			{"unknown policy", "test-admin", "nope/promote", `{"replay_id":"x","acknowledge_sha256":"y"}`, 404, "no policy"},
			{"replay of an unknown policy", "test-admin", "nope/promote/replay", `{}`, 404, "no policy"},
			{"bad since", "test-admin", "strict/promote/replay", `{"since":"-1h"}`, 400, "since"},
			{"read-only token", "test-read", "strict/promote", `{}`, 403, "read-only"},
			{"read-only replay", "test-read", "strict/promote/replay", `{}`, 403, "read-only"},
			{"read-only demote", "test-read", "strict/demote", `{}`, 403, "read-only"},
			{"demote what is not promoted", "test-admin", "strict/demote", `{}`, 404, "not promoted"},
		}
		for _, c := range cases {
			st, body := a.call(t, c.token, "POST", "/admin/v1/policies/"+c.path, c.body, nil)
			if st != c.want || !strings.Contains(body, c.says) {
				t.Errorf("%s: %d %s; want %d saying %q", c.name, st, body, c.want, c.says)
			}
		}
	})

	rp := replayStrict(t, a, 1)
	if rp.Policy != "strict" || len(rp.ReportSHA256) != 64 || rp.Document.Summary.Changed < 1 || rp.Document.Summary.Transitions["allow->hard"] < 1 {
		t.Fatalf("replay: %+v", rp)
	}

	t.Run("a digest that is not the report's is refused", func(t *testing.T) {
		for _, ack := range []string{strings.Repeat("a", 64), "not hex", rp.PolicySHA256, rp.ReportSHA256[:62]} {
			st, body := a.call(t, "test-admin", "POST", "/admin/v1/policies/strict/promote",
				fmt.Sprintf(`{"replay_id":%q,"acknowledge_sha256":%q}`, rp.ReplayID, ack), nil)
			if st != 409 || !strings.Contains(body, "acknowledge_sha256") {
				t.Errorf("ack %q: %d %s", ack, st, body)
			}
		}
		if m, _ := modeOf(t, a, "strict"); m != "shadow" {
			t.Fatalf("mode after refusals: %q", m)
		}
	})

	t.Run("acknowledged: enforced on both replicas within a second", func(t *testing.T) {
		a.must(t, 200, "POST", "/admin/v1/policies/strict/promote", fmt.Sprintf(`{"replay_id":%q,"acknowledge_sha256":%q}`, rp.ReplayID, rp.ReportSHA256), nil)
		if st, body := a.chat(t, "cg-test-yaml"); st != 429 || !strings.Contains(body, "yamlco is closed") {
			t.Fatalf("promoting replica: %d %s", st, body)
		}
		took := within(t, "the other replica enforces", time.Second, func() bool { st, _ := b.chat(t, "cg-test-yaml"); return st == 429 })
		t.Logf("promotion reached the other replica in %s", took)
		if m, by := modeOf(t, b, "strict"); m != "enforce" || by != "admin:tester" {
			t.Fatalf("the other replica shows %q promoted by %q", m, by)
		}
		st, body := a.call(t, "test-admin", "POST", "/admin/v1/policies/strict/promote",
			fmt.Sprintf(`{"replay_id":%q,"acknowledge_sha256":%q}`, rp.ReplayID, rp.ReportSHA256), nil)
		if st != 409 || !strings.Contains(body, "promoted already") {
			t.Fatalf("promoted twice: %d %s", st, body)
		}
	})

	t.Run("the audit log keeps the replay and the promotion", func(t *testing.T) {
		es := auditOf(t, b, "strict")
		// Earlier replays (of a capture not yet flushed) are recorded too.
		if len(es) < 2 || es[len(es)-2]["action"] != "replay" || es[len(es)-1]["action"] != "promote" {
			t.Fatalf("audit: %v", es)
		}
		for _, e := range es[len(es)-2:] {
			if e["replay_id"] != rp.ReplayID || e["report_sha256"] != rp.ReportSHA256 || e["actor"] != "admin:tester" {
				t.Fatalf("audit entry: %v", e)
			}
			sum, _ := e["summary"].(map[string]any)
			if sum["changed"] != float64(rp.Document.Summary.Changed) {
				t.Fatalf("audit summary: %v", e)
			}
		}
	})

	var rp2 replayAnswer
	t.Run("demoted: shadow again on both", func(t *testing.T) {
		a.must(t, 200, "POST", "/admin/v1/policies/strict/demote", `{"reason":"too strict"}`, nil)
		within(t, "both replicas serve", time.Second, func() bool {
			sa, _ := a.chat(t, "cg-test-yaml")
			sb, _ := b.chat(t, "cg-test-yaml")
			return sa == 200 && sb == 200
		})
		es := auditOf(t, a, "strict")
		if last := es[len(es)-1]; last["action"] != "demote" || last["reason"] != "too strict" || last["replay_id"] != rp.ReplayID {
			t.Fatalf("demotion's audit: %v", last)
		}
		rp2 = replayStrict(t, a, 1) // acknowledged for the code of now, used below
		st, body := a.call(t, "test-admin", "POST", "/admin/v1/policies/strict/promote",
			fmt.Sprintf(`{"replay_id":%q,"acknowledge_sha256":%q}`, rp.ReplayID, rp.ReportSHA256), nil)
		if st != 200 {
			t.Fatalf("promoting again on the same replay: %d %s", st, body)
		}
	})

	t.Run("a changed policy file drops the promotion", func(t *testing.T) {
		if st, _ := b.chat(t, "cg-test-yaml"); st != 429 {
			within(t, "promoted again", time.Second, func() bool { st, _ := b.chat(t, "cg-test-yaml"); return st == 429 })
		}
		if err := os.WriteFile(filepath.Join(dir, "strict.rego"), []byte(strictPolicy+"\n# changed\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		a.must(t, 200, "POST", "/admin/v1/reload", "", nil)
		b.must(t, 200, "POST", "/admin/v1/reload", "", nil)
		for _, r := range []*replica{a, b} {
			if st, body := r.chat(t, "cg-test-yaml"); st != 200 {
				t.Fatalf("the changed policy is still enforced: %d %s", st, body)
			}
		}
		within(t, "the drop in the audit log", 3*time.Second, func() bool {
			es := auditOf(t, a, "strict")
			last := es[len(es)-1]
			return last["action"] == "promotion_dropped" && last["actor"] == "costgate" && last["loaded_sha256"] != last["policy_sha256"]
		})
		if m, by := modeOf(t, b, "strict"); m != "shadow" || by != "" {
			within(t, "the other replica's view", time.Second, func() bool { m, by := modeOf(t, b, "strict"); return m == "shadow" && by == "" })
		}
		st, body := a.call(t, "test-admin", "POST", "/admin/v1/policies/strict/promote",
			fmt.Sprintf(`{"replay_id":%q,"acknowledge_sha256":%q}`, rp2.ReplayID, rp2.ReportSHA256), nil)
		if st != 409 || !strings.Contains(body, "source changed") {
			t.Fatalf("a replay of the old code: %d %s", st, body)
		}
	})
}

// TestPromotionEmbedded: the same promotion on the embedded store (one
// replica, SQLite).
func TestPromotionEmbedded(t *testing.T) {
	up := simulatorURL(t)
	dir := policyDir(t)
	a := policyReplica(t, up, "", dir)
	if st, body := a.chat(t, "cg-test-yaml"); st != 200 {
		t.Fatalf("shadow: %d %s", st, body)
	}
	rp := replayStrict(t, a, 1)
	a.must(t, 200, "POST", "/admin/v1/policies/strict/promote", fmt.Sprintf(`{"replay_id":%q,"acknowledge_sha256":%q}`, rp.ReplayID, rp.ReportSHA256), nil)
	if st, body := a.chat(t, "cg-test-yaml"); st != 429 {
		t.Fatalf("promoted: %d %s", st, body)
	}
	if es := auditOf(t, a, "strict"); len(es) < 2 || es[len(es)-1]["action"] != "promote" || es[len(es)-1]["replay_id"] != rp.ReplayID {
		t.Fatalf("audit: %v", es)
	}
	a.must(t, 200, "POST", "/admin/v1/policies/strict/demote", `{}`, nil)
	if st, body := a.chat(t, "cg-test-yaml"); st != 200 {
		t.Fatalf("demoted: %d %s", st, body)
	}
}
