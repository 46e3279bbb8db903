package simulator_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/costgate/costgate/simulator"
)

// Anthropic's 500 error type is api_error; server_error is not one of its types.
func TestAnthropicServerErrorType(t *testing.T) {
	u := newUpstream(t, simulator.Config{ErrorRate: 1})
	status, b := u.post(t, "/v1/messages", requests[5].body)
	checkError(t, "/v1/messages", status, b, http.StatusInternalServerError, "api_error")
}

// Every chunk of a legacy completions stream has object text_completion.
func TestCompletionsStreamObject(t *testing.T) {
	u := newUpstream(t, simulator.Config{})
	_, b := u.post(t, "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","stream":true,"stream_options":{"include_usage":true},"max_tokens":3,"prompt":"hi"}`)
	for _, ev := range readEvents(t, b) {
		if ev.data == "[DONE]" {
			continue
		}
		var c struct {
			Object string `json:"object"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatal(err)
		}
		if c.Object != "text_completion" {
			t.Errorf("chunk object %q, want text_completion: %s", c.Object, ev.data)
		}
	}
}
