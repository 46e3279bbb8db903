package costmodel

import (
	"math"
	"testing"
)

func TestWithOutputStaysWithinTheCap(t *testing.T) {
	e, err := NewEstimator(Config{})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"gpt-4o-mini","max_tokens":1000,"n":2,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"hi"}]}`
	est, err := e.Estimate(ChatCompletions, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if est.OutputCap != 2000 || est.Outputs != 2 || !est.Tools || !est.Learnable() {
		t.Fatalf("shape of the estimate: cap %d outputs %d tools %v learnable %v", est.OutputCap, est.Outputs, est.Tools, est.Learnable())
	}
	for _, c := range []struct{ tokens, want int64 }{
		{300, 300}, {0, 0}, {-5, 0}, {math.MinInt64, 0}, {2000, 2000}, {5000, 2000}, {math.MaxInt64, 2000},
	} {
		got := e.WithOutput(est, c.tokens)
		if got.Usage.OutputTokens != c.want {
			t.Errorf("WithOutput(%d): %d output tokens, want %d", c.tokens, got.Usage.OutputTokens, c.want)
		}
		want := e.Cost("gpt-4o-mini", got.Usage)
		if got.Cost != want || got.Cost < 0 || got.Cost > est.Cost {
			t.Errorf("WithOutput(%d): cost %d, want %d, at most %d", c.tokens, got.Cost, want, est.Cost)
		}
		if got.Usage.InputTokens != est.Usage.InputTokens {
			t.Errorf("WithOutput changed the input")
		}
	}
	half, _ := NewEstimator(Config{OutputReserve: 50})
	h, _ := half.Estimate(ChatCompletions, []byte(body))
	if h.OutputCap != 2000 || h.Usage.OutputTokens != 1000 {
		t.Fatalf("cap %d reserved %d at output_reserve 50", h.OutputCap, h.Usage.OutputTokens)
	}
	if got := half.WithOutput(h, 1500); got.Usage.OutputTokens != 1000 {
		t.Fatalf("a learned estimate above what is reserved: %d", got.Usage.OutputTokens)
	}
}

func TestLearnable(t *testing.T) {
	e, _ := NewEstimator(Config{})
	for _, c := range []struct {
		kind Kind
		body string
		want bool
	}{
		{ChatCompletions, `{"model":"gpt-4o-mini","messages":[]}`, true},
		{ChatCompletions, `{"model":"gpt-4o-mini","stream":true,"messages":[]}`, true},
		{ChatCompletions, `{"model":"o3","stream":true,"messages":[]}`, false},
		{ChatCompletions, `{"model":"o3","messages":[]}`, true},
		{ChatCompletions, `{"model":"gpt-4o-audio-preview","modalities":["text","audio"],"messages":[]}`, false},
		{Embeddings, `{"model":"text-embedding-3-small","input":"x"}`, false},
		{AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":100,"tools":[{"name":"t","input_schema":{"type":"object"}}],"messages":[]}`, true},
		{Responses, `{"model":"gpt-4o-mini","input":"x"}`, true},
		{Completions, `{"model":"gpt-3.5-turbo-instruct","prompt":["a","b"],"max_tokens":10}`, true},
	} {
		est, err := e.Estimate(c.kind, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if est.Learnable() != c.want {
			t.Errorf("%s: learnable %v, want %v", c.body, est.Learnable(), c.want)
		}
	}
}
