package costmodel_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestModelNameBound: every priced API refuses a model name longer than
// MaxModelName as a bad request, before anything is counted, and takes
// one at the bound.
func TestModelNameBound(t *testing.T) {
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[costmodel.Kind]string{
		costmodel.ChatCompletions:   `{"model":%q,"messages":[{"role":"user","content":"hi"}]}`,
		costmodel.Completions:       `{"model":%q,"prompt":"hi"}`,
		costmodel.Embeddings:        `{"model":%q,"input":"hi"}`,
		costmodel.Responses:         `{"model":%q,"input":"hi"}`,
		costmodel.AnthropicMessages: `{"model":%q,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
	}
	for kind, body := range bodies {
		at := strings.Repeat("m", costmodel.MaxModelName)
		if _, err := est.Estimate(kind, []byte(fmt.Sprintf(body, at))); err != nil {
			t.Errorf("%v: a model name of %d bytes: %v", kind, len(at), err)
		}
		var bad *costmodel.BadRequestError
		if _, err := est.Estimate(kind, []byte(fmt.Sprintf(body, at+"m"))); !errors.As(err, &bad) {
			t.Errorf("%v: a model name of %d bytes: %v, want a bad request", kind, len(at)+1, err)
		}
	}
}
