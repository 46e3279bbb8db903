package proxy

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
)

// Quote is what the server would reserve for one request before it
// forwards it, and why: costgate estimate prints it.
type Quote struct {
	// Route is the request's path without its query.
	Route string
	// Upstream names the generic upstream of a /u/NAME/... route.
	Upstream string
	// Estimate is the reservation: its Usage (input tokens counted, output
	// tokens reserved, or a generic route's units) and its Cost.
	Estimate costmodel.Estimate
	// Why says in sentences how the reservation was reached.
	Why []string
}

// QuoteRequest prices one request as a server running c would: method and target
// (a path, with its query) as the client sends them. An LLM route (a path
// such as /v1/chat/completions, or a kind such as chat_completions) is
// priced by the model's price under c's costs; a generic route,
// /u/NAME/..., by the cost rule of c's upstream NAME for that path.
func QuoteRequest(c *config.Config, method, target string, header http.Header, body []byte) (Quote, error) {
	path, _, _ := strings.Cut(target, "?")
	if strings.HasPrefix(path, "/u/") {
		return quoteGeneric(c, method, target, header, body)
	}
	kind, ok := config.RouteKinds[path]
	if !ok {
		var err error
		if kind, err = costmodel.ParseKind(path); err != nil || kind == costmodel.Generic {
			return Quote{}, fmt.Errorf("unknown route %q: want an API path (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages), a generic upstream's /u/NAME/..., or a kind (chat_completions, ...)", path)
		}
	}
	est, err := costmodel.NewEstimator(c.CostModel())
	if err != nil {
		return Quote{}, err
	}
	e, err := est.Estimate(kind, body)
	if err != nil {
		return Quote{}, err
	}
	q := Quote{Route: path, Estimate: e}
	if kind == costmodel.Embeddings {
		q.Why = append(q.Why, fmt.Sprintf("%d input tokens counted; an embedding has no output", e.Usage.InputTokens))
		return q, nil
	}
	reserve := c.Costs.OutputReserve.FallbackPercent()
	if reserve == 0 {
		reserve = 100
	}
	price, _ := est.Price(e.Model)
	var limit string
	switch {
	case e.MaxOutputTokens > 0:
		limit = fmt.Sprintf("the request's own output limit, %d tokens", e.MaxOutputTokens)
	case price.MaxOutputTokens > 0:
		limit = fmt.Sprintf("the request sets no output limit (max_output_tokens: 0), so the model's maximum output, %d tokens, is reserved", price.MaxOutputTokens)
	default:
		limit = "the request sets no output limit (max_output_tokens: 0) and the model's maximum output is not known, so the estimator's default is reserved"
	}
	q.Why = append(q.Why,
		fmt.Sprintf("%d input tokens counted, %d output tokens reserved: %s, at output_reserve %d%%, times the number of choices", e.Usage.InputTokens, e.Usage.OutputTokens, limit, reserve),
		"the reservation is debited from the limits and budgets before the request is forwarded, and settled to the usage the upstream reports when the answer ends")
	if e.UnknownModel {
		q.Why = append(q.Why, fmt.Sprintf("model %q is not in the price table: it is priced at the default price", e.Model))
	}
	return q, nil
}

// quoteGeneric prices a request to a generic upstream with its cost rule.
func quoteGeneric(c *config.Config, method, target string, header http.Header, body []byte) (Quote, error) {
	path, _, _ := strings.Cut(target, "?")
	name, _, _ := strings.Cut(strings.TrimPrefix(path, "/u/"), "/")
	var cfg *config.UpstreamConfig
	for i := range c.Upstreams {
		if c.Upstreams[i].Name == name {
			cfg = &c.Upstreams[i]
		}
	}
	switch {
	case cfg == nil:
		return Quote{}, fmt.Errorf("route %s: the config has no upstream named %q", path, name)
	case cfg.Kind != "generic":
		return Quote{}, fmt.Errorf("route %s: upstream %q is of kind %s, not generic: use its API path (/v1/...)", path, name, cfg.Kind)
	}
	u, err := newUpstream(*cfg, cfg.BaseURL)
	if err != nil {
		return Quote{}, err
	}
	r, err := http.NewRequest(method, "http://costgate"+target, bytes.NewReader(body))
	if err != nil {
		return Quote{}, fmt.Errorf("route %s: %w", target, err)
	}
	r.RequestURI = target
	if header != nil {
		r.Header = header
	}
	sub, ref := u.admit(r)
	if ref != nil {
		return Quote{}, fmt.Errorf("route %s: %d: %s", target, ref.status, ref.err.Message)
	}
	rule := u.rule(sub)
	e, err := rule.Estimate(costmodel.GenericRequest{Method: method, Path: sub, Query: r.URL.Query(), Header: r.Header, Body: body})
	if err != nil {
		return Quote{}, err
	}
	which := fmt.Sprintf("upstream %s's cost rule", name)
	if pc := u.pathCost(sub); pc != nil {
		which = fmt.Sprintf("upstream %s's cost rule for paths under %s", name, pc.Prefix)
	}
	unit := rule.Unit
	if unit == "" {
		unit = "units"
	}
	q := Quote{Route: path, Upstream: name, Estimate: e}
	q.Why = append(q.Why, fmt.Sprintf("priced by %s: per call %s, plus %d %s at %s each", which,
		rule.PerCall, e.Usage.Units, unit, rule.PerUnit))
	if rule.Actual != nil {
		q.Why = append(q.Why, "the reservation is settled to the units the upstream's response reports")
	} else {
		q.Why = append(q.Why, "the rule reads no actual units from the response: the estimate is what is charged")
	}
	return q, nil
}
