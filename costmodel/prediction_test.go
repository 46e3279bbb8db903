package costmodel

import (
	"strconv"
	"strings"
	"testing"
)

// TestPredictionReserved: a predicted output's tokens that the answer
// rejects are billed as output tokens on top of the answer, and a stream
// never shows them. A tenant who sends a long prediction must be reserved
// for it: the reservation is at least the output limit plus the
// prediction's tokens, whatever the prediction's shape, and the estimate
// says it holds tokens the stream does not show.
func TestPredictionReserved(t *testing.T) {
	e := estimatorWith(t, Config{})
	text := strings.Repeat("func handler(w http.ResponseWriter) { return } ", 400)
	quoted := strconv.Quote(text)
	predTokens := e.resolve("gpt-4o-mini").countText(text)
	if predTokens < 4000 {
		t.Fatalf("prediction of %d tokens: too short to tell", predTokens)
	}
	for _, c := range []struct{ name, prediction string }{
		{"string content", `{"type":"content","content":` + quoted + `}`},
		{"text parts", `{"type":"content","content":[{"type":"text","text":` + quoted + `}]}`},
		{"another type", `{"type":"other","content":` + quoted + `}`},
	} {
		for _, stream := range []bool{false, true} {
			name := c.name
			if stream {
				name += "/stream"
			}
			t.Run(name, func(t *testing.T) {
				body := `{"model":"gpt-4o-mini","max_tokens":50,"stream":` + strconv.FormatBool(stream) +
					`,"messages":[{"role":"user","content":"edit this file"}],"prediction":` + c.prediction + `}`
				est, err := e.Estimate(ChatCompletions, []byte(body))
				if err != nil {
					t.Fatal(err)
				}
				if want := 50 + predTokens; est.Usage.OutputTokens < want {
					t.Errorf("output tokens reserved %d, want at least %d (the limit and the prediction)", est.Usage.OutputTokens, want)
				}
				if !est.Uncounted {
					t.Error("Uncounted = false: a stream does not show rejected prediction tokens")
				}
			})
		}
	}
	t.Run("null prediction", func(t *testing.T) {
		est, err := e.Estimate(ChatCompletions, []byte(`{"model":"gpt-4o-mini","max_tokens":50,"messages":[{"role":"user","content":"hi"}],"prediction":null}`))
		if err != nil {
			t.Fatal(err)
		}
		if est.Usage.OutputTokens != 50 || est.Uncounted {
			t.Errorf("output %d, uncounted %v: want 50, false", est.Usage.OutputTokens, est.Uncounted)
		}
	})
}
