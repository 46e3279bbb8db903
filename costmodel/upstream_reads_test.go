package costmodel_test

// Attacks of a tenant who wants to pay less: request bodies whose input
// costgate counts below what the upstream reads, or whose input the
// upstream takes from its own state without the estimate saying so
// (Estimate.Uncounted). An estimate is the charge of an answer whose usage
// cannot be read (too large, cut, queued), so an undercount is paid for.

import (
	"errors"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

func paylessEstimator(t *testing.T) *costmodel.Estimator {
	t.Helper()
	e, err := costmodel.NewEstimator(costmodel.Config{CacheEntries: -1})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// paylessText is a long text: 10,000 tokens of o200k_base.
var paylessText = strings.Repeat("hello world ", 5000)

// TestPayLessContentPartReadByItsType: an upstream reads a content part by
// its "type" (vLLM and other OpenAI-compatible servers dispatch on it). A
// part of type text that also carries an image_url, an assistant tool
// call of type custom, must be counted for the text the upstream reads,
// not for the 85-token image or nothing.
func TestPayLessContentPartReadByItsType(t *testing.T) {
	e := paylessEstimator(t)
	want := e.CountText("gpt-4o", paylessText)
	cases := []struct{ name, body string }{
		{"text part with a low-detail image_url", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"` + paylessText + `","image_url":{"url":"https://example.com/a.png","detail":"low"}}]}]}`},
		{"text part with an image_url after the text", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"image_url":{"url":"https://example.com/a.png","detail":"low"},"text":"` + paylessText + `","type":"text"}]}]}`},
		{"custom tool call in an assistant message", `{"model":"gpt-4o","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"custom","custom":{"name":"run","input":"` + paylessText + `"}}]},{"role":"user","content":"go on"}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			est, err := e.Estimate(costmodel.ChatCompletions, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if est.Usage.InputTokens < want && !est.Uncounted {
				t.Errorf("input counted %d tokens (cost %v, Uncounted false); the upstream reads at least %d", est.Usage.InputTokens, est.Cost, want)
			}
		})
	}
}

// TestPayLessPromptTheUpstreamRenders: request members that the upstream
// renders into the prompt and bills as input tokens (a structured output
// schema, custom tool definitions, custom tool outputs, a document's
// context) are counted, or the estimate says it could not count them.
func TestPayLessPromptTheUpstreamRenders(t *testing.T) {
	e := paylessEstimator(t)
	schema := `{"type":"object","properties":{"a":{"type":"string","description":"` + paylessText + `"}}}`
	cases := []struct {
		name  string
		kind  costmodel.Kind
		model string
		body  string
	}{
		{"chat response_format json_schema", costmodel.ChatCompletions, "gpt-4o",
			`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":` + schema + `}}}`},
		{"chat custom tool definition", costmodel.ChatCompletions, "gpt-4o",
			`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"custom","custom":{"name":"run","description":"` + paylessText + `"}}]}`},
		{"responses text.format json_schema", costmodel.Responses, "gpt-4.1",
			`{"model":"gpt-4.1","input":"hi","text":{"format":{"type":"json_schema","name":"x","schema":` + schema + `}}}`},
		{"responses custom tool definition", costmodel.Responses, "gpt-4.1",
			`{"model":"gpt-4.1","input":"hi","tools":[{"type":"custom","name":"run","description":"` + paylessText + `"}]}`},
		{"responses custom_tool_call_output", costmodel.Responses, "gpt-4.1",
			`{"model":"gpt-4.1","input":[{"type":"custom_tool_call_output","call_id":"c","output":"` + paylessText + `"}]}`},
		{"anthropic document context", costmodel.AnthropicMessages, "claude-sonnet-4-5",
			`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"x"},"context":"` + paylessText + `"}]}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := e.CountText(c.model, paylessText)
			est, err := e.Estimate(c.kind, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if est.Usage.InputTokens < want && !est.Uncounted {
				t.Errorf("input counted %d tokens (cost %v, Uncounted false); the upstream renders at least %d", est.Usage.InputTokens, est.Cost, want)
			}
		})
	}
}

// TestPayLessServerSideInputIsUncounted: input the upstream takes from its
// own state (a stored item or prompt, a vector store's results, a remote
// MCP server's tools, a previous answer's audio) is invisible to costgate,
// as previous_response_id is: the estimate must say so (Uncounted), so
// that a stream cut before its usage is not charged below it.
func TestPayLessServerSideInputIsUncounted(t *testing.T) {
	e := paylessEstimator(t)
	cases := []struct {
		name string
		kind costmodel.Kind
		body string
	}{
		{"responses item_reference", costmodel.Responses, `{"model":"gpt-4.1","input":[{"type":"item_reference","id":"msg_1"}]}`},
		{"responses stored prompt", costmodel.Responses, `{"model":"gpt-4.1","prompt":{"id":"pmpt_1","version":"2"},"input":"hi"}`},
		{"responses file_search tool", costmodel.Responses, `{"model":"gpt-4.1","input":"hi","tools":[{"type":"file_search","vector_store_ids":["vs_1"]}]}`},
		{"responses mcp tool", costmodel.Responses, `{"model":"gpt-4.1","input":"hi","tools":[{"type":"mcp","server_label":"x","server_url":"https://example.com/mcp"}]}`},
		{"chat assistant audio by id", costmodel.ChatCompletions, `{"model":"gpt-4o-audio-preview","messages":[{"role":"assistant","audio":{"id":"audio_1"}},{"role":"user","content":"again"}]}`},
		{"anthropic mcp_servers", costmodel.AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":5,"mcp_servers":[{"type":"url","url":"https://example.com/mcp","name":"x"}],"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			est, err := e.Estimate(c.kind, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if !est.Uncounted {
				t.Errorf("Uncounted false with input %d tokens (cost %v); the upstream bills input costgate cannot see", est.Usage.InputTokens, est.Cost)
			}
		})
	}
}

// TestPayLessAnthropicSearchResult: Anthropic's search_result block (its
// "source" is a string, its text in "content") is a valid block, at the
// top of a message and in a tool_result; its text is counted.
func TestPayLessAnthropicSearchResult(t *testing.T) {
	e := paylessEstimator(t)
	block := `{"type":"search_result","source":"https://example.com/a","title":"a","content":[{"type":"text","text":"` + paylessText + `"}]}`
	want := e.CountText("claude-sonnet-4-5", paylessText)
	for name, content := range map[string]string{
		"in a message":     `[` + block + `]`,
		"in a tool_result": `[{"type":"tool_result","tool_use_id":"t","content":[` + block + `]}]`,
	} {
		t.Run(name, func(t *testing.T) {
			est, err := e.Estimate(costmodel.AnthropicMessages, []byte(`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":`+content+`}]}`))
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if est.Usage.InputTokens < want && !est.Uncounted {
				t.Errorf("input counted %d tokens; the block holds %d", est.Usage.InputTokens, want)
			}
		})
	}
}

// TestPayLessNumberAndKeySpellings: spellings of priced members that
// Python's json and pydantic (which coerce 1e3, 16.0 and "16" to 16) read
// as a value: costgate reads the same value or refuses the body, never a
// smaller one; a UTF-8 BOM, and an escaped or long-s spelling of a priced
// key beside the plain one, are refused.
func TestPayLessNumberAndKeySpellings(t *testing.T) {
	e := paylessEstimator(t)
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name  string
		kind  costmodel.Kind
		body  string
		limit int64 // the output limit read when accepted; -1: must be refused
	}{
		{"chat max_tokens 1e3", costmodel.ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":1e3}`, -1},
		{"chat max_tokens 16.0", costmodel.ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":16.0}`, -1},
		{"chat max_tokens -0", costmodel.ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":-0}`, 0},
		{"chat max_tokens null", costmodel.ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_tokens":null}`, 0},
		{"chat n 2.0", costmodel.ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"n":2.0}`, -1},
		{"chat n as a string", costmodel.ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"n":"2"}`, -1},
		{"chat max_completion_tokens 1E2", costmodel.ChatCompletions, `{"model":"gpt-4o",` + msgs + `,"max_completion_tokens":1E2}`, -1},
		{"responses max_output_tokens 5e0", costmodel.Responses, `{"model":"gpt-4.1","input":"x","max_output_tokens":5e0}`, -1},
		{"responses max_output_tokens string", costmodel.Responses, `{"model":"gpt-4.1","input":"x","max_output_tokens":"5"}`, -1},
		{"anthropic max_tokens 8.0", costmodel.AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":8.0,` + msgs + `}`, -1},
		{"anthropic max_tokens huge", costmodel.AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":123456789012345678901234567890,` + msgs + `}`, -1},
		{"completions best_of 3.0", costmodel.Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":"x","best_of":3.0}`, -1},
		{"UTF-8 BOM", costmodel.ChatCompletions, "\ufeff" + `{"model":"gpt-4o",` + msgs + `}`, -1},
		{"anthropic max_tokens escaped twice", costmodel.AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":8,"max\u005ftokens":1,` + msgs + `}`, -1},
		{"anthropic stream long-s", costmodel.AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":8,"stream":false,"ſtream":true,` + msgs + `}`, -1},
		{"responses input escaped twice", costmodel.Responses, `{"model":"gpt-4.1","input":"x","\u0069nput":"a much longer input"}`, -1},
		{"chat message role escaped twice", costmodel.ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","rol\u0065":"system","content":"hi"}]}`, -1},
		{"chat part type twice", costmodel.ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","TYPE":"text","image_url":{"url":"https://x","detail":"low"},"text":"hi"}]}]}`, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			est, err := e.Estimate(c.kind, []byte(c.body))
			var bad *costmodel.BadRequestError
			if c.limit < 0 {
				if !errors.As(err, &bad) {
					t.Fatalf("accepted (limit %d, cost %v, err %v); want a *BadRequestError", est.MaxOutputTokens, est.Cost, err)
				}
				return
			}
			if err != nil || est.MaxOutputTokens != c.limit {
				t.Fatalf("limit %d, err %v; want %d", est.MaxOutputTokens, err, c.limit)
			}
		})
	}
}

// TestPayLessBothOutputLimits: a chat request that gives max_tokens and
// max_completion_tokens is limited by the larger: OpenAI-compatible
// servers differ in the one they honour.
func TestPayLessBothOutputLimits(t *testing.T) {
	e := paylessEstimator(t)
	for _, body := range []string{
		`{"model":"gpt-4o","max_completion_tokens":10,"max_tokens":9000,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o","max_tokens":9000,"max_completion_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o","max_tokens":10,"max_completion_tokens":9000,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		est, err := e.Estimate(costmodel.ChatCompletions, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if est.MaxOutputTokens != 9000 || est.OutputCap != 9000 {
			t.Errorf("%s: output limit %d, cap %d; want 9000", body, est.MaxOutputTokens, est.OutputCap)
		}
	}
}
