package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
)

// TestPolicyPromoteCommands: costgate policy promote replays, then
// promotes with the acknowledged report; policy list shows the mode;
// policy demote returns the policy to shadow.
func TestPolicyPromoteCommands(t *testing.T) {
	dir := t.TempDir()
	pol := `# METADATA
# custom:
#   shadow: true
package costgate.policies.strict

import rego.v1

decision := {"outcome": "hard", "status": 429, "reason": "strict"} if input.caller.tenant == "acme"
`
	if err := os.WriteFile(filepath.Join(dir, "strict.rego"), []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(fmt.Appendf(nil, `
admin_token: cli-admin
data_dir: %q
policies:
  dir: %q
capture:
  enabled: true
upstreams:
  - name: openai
    kind: openai
    base_url: http://127.0.0.1:1
    simulate: always
tenants:
  - name: acme
    plan: free
    keys:
      - id: k1
        key: cg-cli-acme
`, t.TempDir(), dir))
	if err != nil {
		t.Fatal(err)
	}
	_, data := serveForCLI(t, cfg)
	chat := func() int {
		t.Helper()
		req, _ := http.NewRequest("POST", data.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer cg-cli-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := chat(); st != 200 {
		t.Fatalf("shadow: %d", st)
	}
	var rp struct {
		ReplayID     string `json:"replay_id"`
		ReportSHA256 string `json:"report_sha256"`
		Document     struct {
			Summary struct{ Replayed, Changed int }
		}
	}
	for deadline := time.Now().Add(10 * time.Second); rp.Document.Summary.Replayed == 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			_, _, err := runCmd(t, "", "policy", "promote", "strict")
			t.Fatalf("the capture is never replayed: %v", err)
		}
		// The capture's writer flushes every second: until then there is
		// no capture, or a file without its header yet.
		out, _, err := runCmd(t, "", "policy", "promote", "strict", "--since", "1h")
		if err != nil {
			continue
		}
		if err := json.Unmarshal([]byte(out), &rp); err != nil {
			t.Fatal(err)
		}
	}
	if rp.Document.Summary.Changed != 1 {
		t.Fatalf("replay: %+v", rp)
	}
	if _, _, err := runCmd(t, "", "policy", "promote", "strict", "--replay", rp.ReplayID); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Fatalf("--replay without --ack: %v", err)
	}
	if _, _, err := runCmd(t, "", "policy", "promote", "strict", "--replay", rp.ReplayID, "--ack", strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("a wrong --ack: %v", err)
	}
	out, _, err := runCmd(t, "", "policy", "promote", "strict", "--replay", rp.ReplayID, "--ack", rp.ReportSHA256)
	if err != nil || !strings.Contains(out, `"enforce"`) || !strings.Contains(out, "admin:carol") {
		t.Fatalf("promote: %v %s", err, out)
	}
	if st := chat(); st != 429 {
		t.Fatalf("promoted: %d", st)
	}
	if out, _, err := runCmd(t, "", "policy", "list"); err != nil || !strings.Contains(out, `"mode": "enforce"`) {
		t.Fatalf("list: %v %s", err, out)
	}
	if _, _, err := runCmd(t, "", "policy", "demote", "strict", "--reason", "done"); err != nil {
		t.Fatal(err)
	}
	if st := chat(); st != 200 {
		t.Fatalf("demoted: %d", st)
	}
}
