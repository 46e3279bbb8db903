package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestMetricsAtkModelLabelsNotFilledByATenant: eve sends requests naming
// 60 models of its choice, then acme uses gpt-4o-mini. The
// gen_ai.request.model label holds the price table's names only, so
// acme's tokens show under gpt-4o-mini. Before, the label kept the first
// 50 names any request sent: eve's filled it, and every other tenant's
// models showed as "other" for the life of the process.
func TestMetricsAtkModelLabelsNotFilledByATenant(t *testing.T) {
	s := newStack(t, "", "")
	for i := range 60 {
		resp := s.postAs(t, "cg-test-globex", "/v1/chat/completions",
			fmt.Sprintf(`{"model":"eve-model-%d","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`, i))
		resp.Body.Close()
	}
	resp := s.postAs(t, "cg-test-acme", "/v1/chat/completions",
		`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("acme's request: %d", resp.StatusCode)
	}
	if err := s.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, metrics := adminDo(t, s.srv.AdminHandler(), "GET", "/metrics", "test-admin")
	var mini, eve int
	for line := range strings.Lines(metrics) {
		if !strings.HasPrefix(line, "gen_ai_client_token_usage_count{") {
			continue
		}
		switch {
		case strings.Contains(line, `gen_ai_request_model="gpt-4o-mini"`):
			mini++
		case strings.Contains(line, `gen_ai_request_model="eve-model-`):
			eve++
		}
	}
	if mini == 0 {
		t.Error("acme's gpt-4o-mini tokens are not under their model's label: another tenant's model names filled it")
	}
	if eve > 0 {
		t.Errorf("%d series of model names a tenant chose, outside the price table", eve)
	}
}
