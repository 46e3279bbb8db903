package config

import (
	"path"
	"strings"

	"github.com/costgate/costgate/costmodel"
)

// RouteKinds maps each priced API path to the shape of its requests.
var RouteKinds = map[string]costmodel.Kind{
	"/v1/chat/completions": costmodel.ChatCompletions,
	"/v1/completions":      costmodel.Completions,
	"/v1/embeddings":       costmodel.Embeddings,
	"/v1/responses":        costmodel.Responses,
	"/v1/messages":         costmodel.AnthropicMessages,
}

// UpstreamKindFor tells which upstream kind serves a path by default.
func UpstreamKindFor(path string) string {
	if path == "/v1/messages" {
		return "anthropic"
	}
	return "openai"
}

// CleanPrefix is p with its dot-segments and empty segments removed and
// its trailing slash kept: the form genericPath gives a request's path, so
// the form a price rule's prefix must have to match it.
func CleanPrefix(p string) string {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}
