package proxy_test

import (
	"context"
	"testing"

	"github.com/costgate/costgate/internal/redistest"
	"github.com/openai/openai-go/v3"
)

// TestIsolationAtkProxiedTrafficSpendsAJobLimit: a limit per job across
// tenants (dimensions [attr.job], the reserve API's attribute) is one
// key ":attr.job=" for every proxied request, which names no job: acme's
// chat completions through the OpenAI SDK spend it, and then globex's are
// refused 429 by a limit neither tenant's requests are under. Held: a
// proxied request is not under a limit keyed by an attribute, and a job
// named through the reserve API is still limited.
func TestIsolationAtkProxiedTrafficSpendsAJobLimit(t *testing.T) {
	s := newStackWith(t, stackOptions{redisURL: redistest.New(t).URL, policies: allowAll, extra: `
limits:
  - {name: per-job, dimensions: [attr.job], unit: requests, algorithm: fixed_window, rate: 2, period: 1h}
`})
	ctx := context.Background()
	chat := func(key string) error {
		_, err := s.client(key).Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "gpt-4o-mini",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
			MaxTokens: openai.Int(8),
		})
		return err
	}
	for i := range 3 {
		if err := chat("cg-test-acme"); err != nil {
			t.Errorf("acme's chat completion %d: %v", i, err)
		}
	}
	if err := chat("cg-test-globex"); err != nil {
		t.Errorf("globex's chat completion after acme's three: %v", err)
	}
	h := s.srv.Handler()
	for i, want := range []int{200, 200, 429} {
		if code, out := reserveCall(t, h, "cg-test-globex", "/v1/costgate/reserve", `{"attributes":{"job":"export"}}`); code != want {
			t.Errorf("reservation %d of job export: %d %v; want %d", i, code, out, want)
		}
	}
}
