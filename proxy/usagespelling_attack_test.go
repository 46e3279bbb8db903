package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
)

// TestBillAtkUsageInMixedSpellings: an OpenAI-compatible upstream's usage
// report that names the input in one spelling and the output in the other
// (prompt_tokens beside output_tokens, input_tokens beside
// completion_tokens: a gateway that translates between the chat and
// Responses shapes) was read in the spelling of its input alone: its 3,000
// output tokens, which the upstream bills, were charged as none. Each kind
// now counts at the larger figure of its two spellings, whichever names
// the input.
func TestBillAtkUsageInMixedSpellings(t *testing.T) {
	const out = 3000
	for _, c := range []struct {
		name, usage string
		stream      bool
	}{
		{"prompt-and-output", `{"prompt_tokens":9,"output_tokens":3000,"total_tokens":3009}`, false},
		{"input-and-completion", `{"input_tokens":9,"completion_tokens":3000}`, false},
		{"prompt-null-input-and-completion", `{"prompt_tokens":null,"input_tokens":9,"completion_tokens":3000}`, false},
		{"prompt-and-output-details", `{"prompt_tokens":9,"output_tokens":3000,"output_tokens_details":{"reasoning_tokens":2000}}`, false},
		{"stream-prompt-and-output", `{"prompt_tokens":9,"output_tokens":3000}`, true},
		{"stream-input-and-completion", `{"input_tokens":9,"completion_tokens":3000}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				if !c.stream {
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":%s}`, c.usage)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hi"}}]}`+"\n\n")
				fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":%s}`+"\n\ndata: [DONE]\n\n", c.usage)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			client := s.client("cg-test-acme")
			if c.stream {
				st := client.Chat.Completions.NewStreaming(context.Background(), chatParams("hi", 4000))
				for st.Next() {
				}
				if err := st.Err(); err != nil {
					t.Fatal(err)
				}
			} else if _, err := client.Chat.Completions.New(context.Background(), chatParams("hi", 4000)); err != nil {
				t.Fatal(err)
			}
			e := s.settled(t, 1)[0]
			if e.Actual.OutputTokens < out || e.Actual.InputTokens < 9 {
				t.Errorf("charged %d input and %d output tokens (%v); the upstream reported and bills 9 and %d",
					e.Actual.InputTokens, e.Actual.OutputTokens, e.ActualCost, out)
			}
		})
	}
}
