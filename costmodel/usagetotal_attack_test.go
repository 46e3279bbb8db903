package costmodel

import "testing"

// TestUsageAtkTotalBeyondItsParts: an OpenAI-compatible upstream may
// leave out of completion_tokens part of what it bills (xAI's reasoning
// models report their reasoning tokens beside completion_tokens, and a
// total_tokens that holds them). Read as OpenAI's shape alone, such a
// report bills the visible completion: 10 output tokens of the 5,010 the
// upstream bills. What a total holds beyond input and output is charged
// as output (the dearer rate, as the rate limit service charges such a
// total), and reasoning tokens above the completion they should be part
// of are taken to be apart from it; so are cached tokens above the
// prompt (a cost of 10 input tokens at the cached rate where the upstream
// reads 100,000 from its cache and 10 more). A report in both spellings
// (prompt_tokens and input_tokens) counts each kind at its larger figure.
func TestUsageAtkTotalBeyondItsParts(t *testing.T) {
	for _, c := range []struct {
		name, body string
		kind       Kind
		in, out    int64
	}{
		{"openai-total-consistent", `{"usage":{"prompt_tokens":20,"completion_tokens":5010,"total_tokens":5030,"completion_tokens_details":{"reasoning_tokens":5000}}}`, ChatCompletions, 20, 5010},
		{"xai-total-holds-reasoning", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":5030,"completion_tokens_details":{"reasoning_tokens":5000}}}`, ChatCompletions, 20, 5010},
		{"total-beyond-parts", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":9030}}`, ChatCompletions, 20, 9010},
		{"reasoning-above-completion-no-total", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"completion_tokens_details":{"reasoning_tokens":5000}}}`, ChatCompletions, 20, 5010},
		{"responses-total", `{"object":"response","usage":{"input_tokens":20,"output_tokens":10,"total_tokens":5030,"output_tokens_details":{"reasoning_tokens":5000}}}`, Responses, 20, 5010},
		{"total-below-parts-takes-nothing-off", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":3}}`, ChatCompletions, 20, 10},
		{"total-not-an-integer-is-ignored", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":"lots"}}`, ChatCompletions, 20, 10},
		{"cached-above-prompt-is-apart", `{"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":100000}}}`, ChatCompletions, 100010, 5},
		{"cached-above-prompt-with-total", `{"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":100015,"prompt_tokens_details":{"cached_tokens":100000}}}`, ChatCompletions, 100010, 5},
		{"openai-cached-within-prompt", `{"usage":{"prompt_tokens":2000,"completion_tokens":5,"total_tokens":2005,"prompt_tokens_details":{"cached_tokens":1024}}}`, ChatCompletions, 2000, 5},
		{"two-spellings-the-larger", `{"usage":{"prompt_tokens":10,"completion_tokens":5,"input_tokens":10,"output_tokens":5000}}`, ChatCompletions, 10, 5000},
		{"two-spellings-input", `{"usage":{"prompt_tokens":9000,"completion_tokens":5,"input_tokens":10,"output_tokens":5}}`, Responses, 9000, 5},
		{"mixed-prompt-and-output", `{"usage":{"prompt_tokens":20,"output_tokens":5000}}`, ChatCompletions, 20, 5000},
		{"mixed-input-and-completion", `{"usage":{"input_tokens":20,"completion_tokens":5000}}`, ChatCompletions, 20, 5000},
		{"mixed-prompt-null", `{"usage":{"prompt_tokens":null,"input_tokens":20,"completion_tokens":5000}}`, Responses, 20, 5000},
		{"mixed-output-details", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"output_tokens_details":{"reasoning_tokens":5000}}}`, ChatCompletions, 20, 5010},
		{"total-spelled-otherwise", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"Total_Tokens":5030}}`, ChatCompletions, 20, 5010},
	} {
		t.Run(c.name, func(t *testing.T) {
			for name, parse := range map[string]func(Kind, []byte) (Usage, error){"ParseUsage": ParseUsage, "encoding/json": parseUsage} {
				u, err := parse(c.kind, []byte(c.body))
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if u.InputTokens != c.in || u.OutputTokens != c.out {
					t.Errorf("%s: read %d in, %d out; want %d in, %d out (%+v)", name, u.InputTokens, u.OutputTokens, c.in, c.out, u)
				}
			}
		})
	}
}
