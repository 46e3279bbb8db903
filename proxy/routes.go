package proxy

import "github.com/costgate/costgate/costmodel"

// routeKinds maps each priced API path to the shape of its requests.
var routeKinds = map[string]costmodel.Kind{
	"/v1/chat/completions": costmodel.ChatCompletions,
	"/v1/completions":      costmodel.Completions,
	"/v1/embeddings":       costmodel.Embeddings,
	"/v1/responses":        costmodel.Responses,
	"/v1/messages":         costmodel.AnthropicMessages,
}

// upstreamKindFor tells which upstream kind serves a path by default.
func upstreamKindFor(path string) string {
	if path == "/v1/messages" {
		return "anthropic"
	}
	return "openai"
}
