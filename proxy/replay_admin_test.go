package proxy_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAdminPolicyReplay: POST /admin/v1/policies/replay evaluates a
// candidate bundle against the traffic the replica captured.
func TestAdminPolicyReplay(t *testing.T) {
	s := newStack(t, "", "capture: {enabled: true}\n")
	h := s.srv.AdminHandler()
	post := func(body string) (int, map[string]any) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/admin/v1/policies/replay", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer test-admin")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var out map[string]any
		json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out
	}
	chat := `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(chat))
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	refuseAll, _ := json.Marshal(map[string]any{"policies": map[string]string{"no.rego": `package costgate.policies.no

import rego.v1

decision := {"outcome": "hard", "status": 403, "reason": "closed"}
`}})
	// The writer flushes every second.
	var out map[string]any
	code := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if code, out = post(string(refuseAll)); code == 200 && out["replayed"] != float64(0) {
			break
		}
	}
	if code != 200 || out["replayed"] != float64(1) || out["changed"] != float64(1) {
		t.Fatalf("replay: %d %v; want the one captured request replayed and changed", code, out)
	}
	// The dashboard shows the last replay's summary.
	code, data := adminDo(t, h, "GET", "/admin/data.json", "test-admin")
	var d struct {
		Replay *struct {
			Files       []string `json:"files"`
			Replayed    int      `json:"replayed"`
			Changed     int      `json:"changed"`
			Transitions []struct {
				Name  string `json:"name"`
				Count int    `json:"count"`
			} `json:"transitions"`
		} `json:"replay"`
	}
	if err := json.Unmarshal([]byte(data), &d); code != 200 || err != nil || d.Replay == nil {
		t.Fatalf("/admin/data.json: %d %v %s; want the last replay's summary", code, err, data)
	}
	if r := d.Replay; len(r.Files) != 1 || r.Files[0] != "no.rego" || r.Replayed != 1 || r.Changed != 1 ||
		len(r.Transitions) != 1 || r.Transitions[0].Name != "allow->hard" || r.Transitions[0].Count != 1 {
		t.Errorf("the dashboard's replay summary: %+v; want no.rego, 1 replayed, 1 changed allow->hard", *r)
	}
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"no policies", `{}`, 400},
		{"unknown field", `{"policies":{"a.rego":"package x"},"extra":1}`, 400},
		{"bad rego", `{"policies":{"a.rego":"package costgate.policies.a\ndecision := {"}}`, 400},
		{"climbing name", `{"policies":{"../a.rego":"package x"}}`, 400},
		{"bad since", `{"policies":{"a.rego":"package x"},"since":"yesterday"}`, 400},
	} {
		if code, out := post(tc.body); code != tc.status {
			t.Errorf("%s: %d %v; want %d", tc.name, code, out, tc.status)
		}
	}
}

// Without capture there is nothing to replay: 409, saying how to turn it on.
func TestAdminPolicyReplayNeedsCapture(t *testing.T) {
	h := newStack(t, "", "").srv.AdminHandler()
	req := httptest.NewRequest(http.MethodPost, "/admin/v1/policies/replay", strings.NewReader(`{"policies":{"a.rego":"package x"}}`))
	req.Header.Set("Authorization", "Bearer test-admin")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "capture.enabled") {
		t.Errorf("%d %s; want 409 naming capture.enabled", rec.Code, rec.Body.String())
	}
}
