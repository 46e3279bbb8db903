package proxy_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
)

// TestSettleCountsAtkDearerPartsAtTheTextRate: a settlement with counts
// (input_tokens, output_tokens) cannot say which of its tokens were
// written to a prompt cache or were audio, which the upstream bills above
// the text rate (an Anthropic 1-hour cache write at twice the input rate,
// gpt-4o-audio-preview's audio output at 8 times the text output). The
// proxy prices the answer's own report of them; the counts path priced
// every token at the text rate, so that a request reserved from a body
// that asks for a cache write or audio, settled with its true counts, was
// billed a fraction of what the upstream bills: $0.0030 for a 1h cache
// write of 1,000 tokens that costs $0.0060, $0.0030 for 300 audio output
// tokens that cost $0.0240. What must hold: the parts its reservation
// holds at a dearer rate are charged at that rate, as the searches are
// (TestSettleCountsAtkFileSearchesOffTheBill), in the share of the counts
// the reservation holds (a prompt cached whole is cached whole, whatever
// its length) and no less than the part reserved, up to the counts, on
// the replica that made the reservation and on another.
func TestSettleCountsAtkDearerPartsAtTheTextRate(t *testing.T) {
	const acme = "cg-test-acme"
	wav := base64.StdEncoding.EncodeToString(make([]byte, 4000))
	cases := []struct {
		name, kind, body, model string
		in, out                 int64
		part                    func(reserved costmodel.Usage) costmodel.Usage // the settled usage priced as the proxy prices its answer
	}{
		{
			name: "anthropic 1h cache write", kind: "anthropic_messages", model: "claude-sonnet-4-5", in: 1000, out: 100,
			body: `{"model":"claude-sonnet-4-5","max_tokens":100,"system":[{"type":"text","text":"` + strings.Repeat("policy text ", 200) +
				`","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"hi"}]}`,
			part: func(r costmodel.Usage) costmodel.Usage {
				return costmodel.Usage{InputTokens: 1000, CacheWriteTokens: 1000, CacheWrite1hTokens: 1000, OutputTokens: 100}
			},
		},
		{
			name: "anthropic 5m cache write", kind: "anthropic_messages", model: "claude-sonnet-4-5", in: 1000, out: 100,
			body: `{"model":"claude-sonnet-4-5","max_tokens":100,"system":[{"type":"text","text":"` + strings.Repeat("policy text ", 200) +
				`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}`,
			part: func(r costmodel.Usage) costmodel.Usage {
				return costmodel.Usage{InputTokens: 1000, CacheWriteTokens: 1000, OutputTokens: 100}
			},
		},
		{
			name: "audio output", kind: "chat_completions", model: "gpt-4o-audio-preview", in: 20, out: 300,
			body: `{"model":"gpt-4o-audio-preview","max_tokens":300,"modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},` +
				`"messages":[{"role":"user","content":"read me a poem"}]}`,
			part: func(r costmodel.Usage) costmodel.Usage {
				return costmodel.Usage{InputTokens: 20, OutputTokens: 300, AudioOutputTokens: 300}
			},
		},
		{
			name: "audio input", kind: "chat_completions", model: "gpt-4o-audio-preview", in: 12, out: 10,
			body: `{"model":"gpt-4o-audio-preview","max_tokens":10,"messages":[{"role":"user","content":[` +
				`{"type":"input_audio","input_audio":{"data":"` + wav + `","format":"wav"}}]}]}`,
			part: func(r costmodel.Usage) costmodel.Usage {
				share := (12*r.AudioInputTokens + r.InputTokens - 1) / r.InputTokens // its share of the input, rounded up
				return costmodel.Usage{InputTokens: 12, AudioInputTokens: min(max(share, min(r.AudioInputTokens, 12)), 12), OutputTokens: 10}
			},
		},
	}
	url := redistest.New(t).URL
	extra := "\nreservations:\n  secret: \"replicas-share-this-secret-0123\"\n" + roomyLimits
	a := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, extra: extra})
	b := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, extra: extra})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			est, err := estimator(t).Estimate(mustKind(t, tc.kind), []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			r := est.Usage
			if r.CacheWriteTokens == 0 && r.AudioInputTokens == 0 && r.AudioOutputTokens == 0 {
				t.Fatalf("the request reserves no dearer part (%+v); the attack needs one", r)
			}
			want := estimator(t).Cost(tc.model, tc.part(r))
			text := estimator(t).Cost(tc.model, costmodel.Usage{InputTokens: tc.in, OutputTokens: tc.out})
			if want <= text {
				t.Fatalf("the dearer part costs %v, no more than the text rate's %v; the case proves nothing", want, text)
			}
			for _, on := range []*stack{a, b} {
				where := "the replica that made it"
				if on == b {
					where = "another replica"
				}
				id := reserveOn(t, a, acme, fmt.Sprintf(`{"kind":%q,"body":%s}`, tc.kind, tc.body))
				code, out := reserveCall(t, on.srv.Handler(), acme, "/v1/costgate/settle",
					fmt.Sprintf(`{"reservation_id":%q,"usage":{"input_tokens":%d,"output_tokens":%d}}`, id, tc.in, tc.out))
				if code != http.StatusOK {
					t.Fatalf("on %s, settle: %d %v", where, code, out)
				}
				if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) != want {
					t.Errorf("on %s, settled with counts: charged %v; want %v (at the text rate: %v)", where, costmodel.NanoUSD(got), want, text)
				}
			}
		})
	}
}

func mustKind(t *testing.T, s string) costmodel.Kind {
	t.Helper()
	k, err := costmodel.ParseKind(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
