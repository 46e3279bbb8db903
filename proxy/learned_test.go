package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/costgate/costgate/ledger"
)

// TestLearnedReservationThroughTheSDK: with output_reserve: p95, requests
// through the official OpenAI SDK reserve max_tokens until the tenant's
// key has min_samples settled answers, then the p95 of what the simulator
// answered; the ledger keeps both, and the charge is the usage reported.
func TestLearnedReservationThroughTheSDK(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: `
costs:
  output_reserve: p95
  learned: {min_samples: 5, interval: 1h}
`})
	ctx := context.Background()
	client := s.client("cg-test-acme")
	var outs []int64
	for range 8 {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "gpt-4o-mini",
			MaxTokens: openai.Int(500),
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about rate limits.")},
		})
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, resp.Usage.CompletionTokens)
		if err := s.srv.WaitIdle(ctx); err != nil { // settled before the next one reserves
			t.Fatal(err)
		}
	}
	l := s.srv.Ledger()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := l.Entries(ctx, ledger.Query{Tenant: "acme", From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != len(outs) {
		t.Fatalf("%d ledger entries, want %d", len(page.Entries), len(outs))
	}
	maxOut := int64(0)
	for i, e := range page.Entries {
		maxOut = max(maxOut, outs[i])
		if e.Actual.OutputTokens != outs[i] {
			t.Errorf("entry %d charged %d output tokens, the simulator answered %d", i, e.Actual.OutputTokens, outs[i])
		}
		switch {
		case i < 5 && e.Estimated.OutputTokens != 500:
			t.Errorf("entry %d (a cold key) reserved %d output tokens, want max_tokens 500", i, e.Estimated.OutputTokens)
		case i >= 5 && (e.Estimated.OutputTokens >= 500 || e.Estimated.OutputTokens > maxOut+maxOut/50+1):
			t.Errorf("entry %d reserved %d output tokens; the answers so far were at most %d", i, e.Estimated.OutputTokens, maxOut)
		}
	}
}
