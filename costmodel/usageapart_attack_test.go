package costmodel

import "testing"

// TestUsageAtkCountsApartFromTheTotal: an OpenAI-compatible upstream may
// bill counts that its completion_tokens and total_tokens leave out.
// Perplexity's reports (sonar-deep-research, sonar-reasoning) give
// reasoning_tokens, citation_tokens (the search results the model read,
// billed as input) and num_search_queries (billed per search) beside the
// usage's prompt_tokens and completion_tokens, and a total_tokens of
// those two alone: read as OpenAI's shape, a deep research answer that
// bills 83,284 output tokens, 15,238 input tokens and 19 searches was
// charged 9,287 output tokens and 19 input tokens. Reasoning tokens above
// the completion they would be part of are apart from it whatever the
// total says, as they are without a total.
func TestUsageAtkCountsApartFromTheTotal(t *testing.T) {
	for _, c := range []struct {
		name, body    string
		in, out, srch int64
	}{
		{"reasoning-above-completion-with-total", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":30,"completion_tokens_details":{"reasoning_tokens":5000}}}`, 20, 5010, 0},
		{"perplexity-deep-research", `{"model":"sonar-deep-research","usage":{"prompt_tokens":19,"completion_tokens":9287,"total_tokens":9306,"citation_tokens":15219,"num_search_queries":19,"reasoning_tokens":73997,"search_context_size":"low"}}`, 15238, 83284, 19},
		{"top-level-reasoning-no-total", `{"usage":{"prompt_tokens":20,"completion_tokens":10,"reasoning_tokens":5000}}`, 20, 5010, 0},
		{"top-level-reasoning-within-completion", `{"usage":{"prompt_tokens":20,"completion_tokens":5010,"total_tokens":5030,"reasoning_tokens":5000}}`, 20, 5010, 0},
		{"spelled-otherwise", `{"usage":{"prompt_tokens":19,"completion_tokens":10,"Citation_Tokens":"1000","NUM_SEARCH_QUERIES":3,"reasoning_tokens":1e3}}`, 1019, 1010, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			for name, parse := range map[string]func(Kind, []byte) (Usage, error){"ParseUsage": ParseUsage, "encoding/json": parseUsage} {
				u, err := parse(ChatCompletions, []byte(c.body))
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if u.InputTokens != c.in || u.OutputTokens != c.out || u.WebSearchRequests != c.srch {
					t.Errorf("%s: read %d in, %d out, %d searches; the upstream bills %d in, %d out, %d searches (%+v)",
						name, u.InputTokens, u.OutputTokens, u.WebSearchRequests, c.in, c.out, c.srch, u)
				}
			}
		})
	}

	// A stream's usage chunk is read the same way.
	e := newTestEstimator(t)
	m := e.NewStreamMeter(ChatCompletions, "sonar-deep-research")
	m.Write([]byte(`data: {"id":"c","model":"sonar-deep-research","choices":[{"index":0,"delta":{"content":"42"}}]}` + "\n\n" +
		`data: {"id":"c","model":"sonar-deep-research","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":9287,"total_tokens":9306,"citation_tokens":15219,"num_search_queries":19,"reasoning_tokens":73997}}` + "\n\n" +
		"data: [DONE]\n\n"))
	u, reported := m.Usage()
	if !reported || u.InputTokens != 15238 || u.OutputTokens != 83284 || u.WebSearchRequests != 19 {
		t.Errorf("stream: read %d in, %d out, %d searches (reported %v); the upstream bills 15238 in, 83284 out, 19 searches",
			u.InputTokens, u.OutputTokens, u.WebSearchRequests, reported)
	}
}
