package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/openai/openai-go/v3"
)

// TestBillAtkServedModelUnknownToTheTable: OpenAI's answer names the
// dated snapshot that served the request ("gpt-5.5-pro-2026-04-23" for
// "gpt-5.5-pro"), and settlement prices the model the answer names. A
// snapshot the price table has no alias for is a model it does not know,
// priced at costs.default_price: with the quickstart's ($2.50 and $10 per
// million tokens) a gpt-5.5-pro request ($30 and $180) was charged
// $0.030 of the $0.540 the upstream bills, 18 times less. An answer's
// model the table does not know is now priced no lower than the model
// asked for; a known one (a cheaper model served) is priced as served
// (TestHostileUpModelNames).
func TestBillAtkServedModelUnknownToTheTable(t *testing.T) {
	const (
		asked  = "gpt-5.5-pro"
		served = "gpt-5.5-pro-2026-04-23"
		usage  = `{"prompt_tokens":9,"completion_tokens":3000,"total_tokens":3009}`
	)
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := est.Cost(asked, costmodel.Usage{InputTokens: 9, OutputTokens: 3000})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":%q,"choices":[{"index":0,"delta":{"content":"Hi"}}]}`+"\n\n", served)
					fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":%q,"choices":[],"usage":%s}`+"\n\ndata: [DONE]\n\n", served, usage)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":%s}`, served, usage)
			}}
			extra := "\ncosts:\n  default_price: {input: \"2.50\", output: \"10.00\", max_output_tokens: 16384}\n" + roomyLimits
			s := newStackWith(t, stackOptions{policies: allowAll, extra: extra, upstream: up})
			params := openai.ChatCompletionNewParams{
				Model:               asked,
				Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
				MaxCompletionTokens: openai.Int(4000),
			}
			client := s.client("cg-test-acme")
			if stream {
				st := client.Chat.Completions.NewStreaming(context.Background(), params)
				for st.Next() {
				}
				if err := st.Err(); err != nil {
					t.Fatal(err)
				}
			} else if _, err := client.Chat.Completions.New(context.Background(), params); err != nil {
				t.Fatal(err)
			}
			e := s.settled(t, 1)[0]
			if e.Actual.OutputTokens != 3000 {
				t.Fatalf("charged %d output tokens; the upstream reported 3000", e.Actual.OutputTokens)
			}
			if e.ActualCost < want {
				t.Errorf("charged %v for the %s answer to a %s request; the upstream bills %s's price, %v", e.ActualCost, served, asked, asked, want)
			}
		})
	}
}

// TestSettleAnswerAtkServedModelUnknownToTheTable: the reserve API's
// settlement with the upstream's own answer (kind and response) priced
// the model that answer names as the proxy did: a gpt-5.5-pro call whose
// answer names a snapshot the table does not know was charged at
// costs.default_price, 18 times less than it bills. It is charged as the
// proxy now charges it, no less than the model reserved.
func TestSettleAnswerAtkServedModelUnknownToTheTable(t *testing.T) {
	const answer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-5.5-pro-2026-04-23",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":9,"completion_tokens":3000,"total_tokens":3009}}`
	extra := "\ncosts:\n  default_price: {input: \"2.50\", output: \"10.00\", max_output_tokens: 16384}\n" + roomyLimits
	s := newStackWith(t, stackOptions{policies: allowAll, extra: extra})
	const acme = "cg-test-acme"
	id := reserveOn(t, s, acme, `{"kind":"chat_completions","body":{"model":"gpt-5.5-pro","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4000}}`)
	code, out := reserveCall(t, s.srv.Handler(), acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"kind":"chat_completions","response":%s}`, id, answer))
	if code != http.StatusOK {
		t.Fatalf("settle: %d %v", code, out)
	}
	want := estimator(t).Cost("gpt-5.5-pro", costmodel.Usage{InputTokens: 9, OutputTokens: 3000})
	if got, _ := out["cost_nanousd"].(float64); costmodel.NanoUSD(got) < want {
		t.Errorf("settled with its answer: charged %v; the upstream bills gpt-5.5-pro's price, %v", costmodel.NanoUSD(got), want)
	}
}
