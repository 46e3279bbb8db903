package costmodel

import (
	"bytes"
	"os"
	"testing"
)

// withModel returns body with "model": model added.
func withModel(t *testing.T, file, model string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(`{"model":"`+model+`",`), bytes.TrimPrefix(bytes.TrimSpace(b), []byte("{"))...)
}

// The OpenAI cookbook ("How to count tokens with tiktoken") sent these
// requests to the API, which reported these usage.prompt_tokens.
func TestCookbookVectors(t *testing.T) {
	e := newTestEstimator(t)
	cases := []struct {
		file, model string
		want        int64
	}{
		{"testdata/cookbook_chat.json", "gpt-3.5-turbo", 129},
		{"testdata/cookbook_chat.json", "gpt-4-0613", 129},
		{"testdata/cookbook_chat.json", "gpt-4", 129},
		{"testdata/cookbook_chat.json", "gpt-4o", 124},
		{"testdata/cookbook_chat.json", "gpt-4o-mini", 124},
		{"testdata/cookbook_tools.json", "gpt-3.5-turbo", 105},
		{"testdata/cookbook_tools.json", "gpt-4", 105},
		{"testdata/cookbook_tools.json", "gpt-4o", 101},
		{"testdata/cookbook_tools.json", "gpt-4o-mini", 101},
	}
	for _, c := range cases {
		t.Run(c.file+"/"+c.model, func(t *testing.T) {
			est, err := e.Estimate(ChatCompletions, withModel(t, c.file, c.model))
			if err != nil {
				t.Fatal(err)
			}
			if est.Usage.InputTokens != c.want {
				t.Errorf("input tokens = %d, want %d", est.Usage.InputTokens, c.want)
			}
		})
	}
}

func newTestEstimator(t testing.TB) *Estimator {
	t.Helper()
	e, err := NewEstimator(Config{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestToolSchemaWalk checks what schemaTokens leaves free: members that
// render no text of the client's (strict, a boolean additionalProperties,
// required entries that name properties, a type naming JSON types where
// only properties are read) do not change the cookbook's count, in the
// parameters or in an array's items; anything else adds its JSON text.
func TestToolSchemaWalk(t *testing.T) {
	e := newTestEstimator(t)
	body := func(function string) []byte {
		return []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":` + function + `}]}`)
	}
	count := func(function string) int64 {
		t.Helper()
		est, err := e.Estimate(ChatCompletions, body(function))
		if err != nil {
			t.Fatal(err)
		}
		return est.Usage.InputTokens
	}
	const (
		items = `{"type":"array","description":"Days","items":{"type":"object","properties":{"date":{"type":"string","description":"ISO date"}}}}`
		free  = `{"type":"array","description":"Days","items":{"type":["object","null"],"properties":{"date":{"type":"string","description":"ISO date"}},"required":["date"],"additionalProperties":false}}`
	)
	cases := []struct {
		name, base, same string
	}{
		{"cookbook", `{"name":"f","description":"d","parameters":{"type":"object","properties":{"unit":{"type":"string","description":"Unit","enum":["c","f"]}}}}`,
			`{"name":"f","description":"d","strict":true,"parameters":{"type":"object","properties":{"unit":{"type":"string","description":"Unit","enum":["c","f"]}},"required":["unit"],"additionalProperties":false}}`},
		{"items", `{"name":"f","parameters":{"type":"object","properties":{"days":` + items + `}}}`,
			`{"name":"f","parameters":{"type":"object","properties":{"days":` + free + `},"required":["days"],"additionalProperties":true}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if b, s := count(c.base), count(c.same); b != s {
				t.Errorf("%d input tokens; with members that render nothing, %d", b, s)
			}
		})
	}
	t.Run("cookbook/plus a title", func(t *testing.T) {
		b := count(cases[0].base)
		with := count(`{"name":"f","description":"d","parameters":{"type":"object","properties":{"unit":{"type":"string","description":"Unit","enum":["c","f"],"title":"Unit"}}}}`)
		if want := b + int64(encoderFor(EncodingO200k).Count(`"title":"Unit"`)); with != want {
			t.Errorf("with a title: %d input tokens, want %d", with, want)
		}
	})
}
