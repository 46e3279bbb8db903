package costmodel

import (
	"fmt"
	"strings"
)

// Kind is the API shape of a request: which body format Estimate reads and
// which usage format ParseUsage and a StreamMeter read. The zero value is
// ChatCompletions.
type Kind uint8

const (
	// ChatCompletions is OpenAI's POST /v1/chat/completions.
	ChatCompletions Kind = iota
	// Completions is OpenAI's legacy POST /v1/completions.
	Completions
	// Embeddings is OpenAI's POST /v1/embeddings.
	Embeddings
	// Responses is OpenAI's POST /v1/responses.
	Responses
	// AnthropicMessages is Anthropic's POST /v1/messages.
	AnthropicMessages
	// Generic is any other metered HTTP API, priced by a Rule.
	Generic
)

var kindNames = [...]string{
	ChatCompletions:   "chat_completions",
	Completions:       "completions",
	Embeddings:        "embeddings",
	Responses:         "responses",
	AnthropicMessages: "anthropic_messages",
	Generic:           "generic",
}

// String returns the kind's name, for example "chat_completions".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// ParseKind reads a kind from its name as String returns it; it also accepts
// the API paths ("/v1/chat/completions", "/v1/messages", ...) and the short
// names "chat", "messages" and "anthropic". Case and surrounding space are
// ignored.
func ParseKind(s string) (Kind, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "chat_completions", "chat", "chat.completions", "/v1/chat/completions":
		return ChatCompletions, nil
	case "completions", "/v1/completions":
		return Completions, nil
	case "embeddings", "/v1/embeddings":
		return Embeddings, nil
	case "responses", "/v1/responses":
		return Responses, nil
	case "anthropic_messages", "anthropic", "messages", "/v1/messages":
		return AnthropicMessages, nil
	case "generic":
		return Generic, nil
	}
	return 0, fmt.Errorf("costmodel: unknown kind %q", s)
}

// MarshalText implements encoding.TextMarshaler with String.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseKind.
func (k *Kind) UnmarshalText(b []byte) error {
	v, err := ParseKind(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}
