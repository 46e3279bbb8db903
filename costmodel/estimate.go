package costmodel

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Estimate is the priced estimate of one request before it is served:
// its input tokens counted, its output tokens reserved.
type Estimate struct {
	Kind            Kind    `json:"kind"`
	Model           string  `json:"model,omitempty"`
	Encoding        string  `json:"encoding,omitempty"` // "o200k_base", "cl100k_base", "anthropic-approx"; empty for generic rules
	Stream          bool    `json:"stream"`
	StreamUsage     bool    `json:"stream_usage,omitempty"` // the client asked for a usage report in the stream (stream_options.include_usage)
	MaxOutputTokens int64   `json:"max_output_tokens"`      // the output limit the client set; 0 when not given
	Usage           Usage   `json:"usage"`                  // InputTokens counted, OutputTokens reserved
	Cost            NanoUSD `json:"cost_nano_usd"`          // Price.Cost(Usage)
	UnknownModel    bool    `json:"unknown_model,omitempty"`
	// Uncounted is set when the request's real usage may exceed what
	// costgate can see: it holds parts whose tokens only the provider can
	// count (documents, audio, images whose size is not in the request:
	// reserved at the upper bounds of parts.go), audio output (a chat
	// request whose modalities hold "audio"), server-side state
	// (Responses' previous_response_id or conversation), a hosted or
	// server tool (web search, an Anthropic code execution or tool search),
	// or the model produces hidden reasoning tokens that a stream does not
	// show (a reasoning model of the table, an unknown model, Claude with
	// thinking enabled). A stream cut without a usage report must then
	// never be charged less than this estimate's cost.
	Uncounted bool `json:"uncounted,omitempty"`
	// OutputCap is the most output tokens the request may produce: its
	// output limit (or the model's maximum, or the default) times Outputs,
	// before output_reserve. A learned reservation is capped by it (see
	// WithOutput); 0 for a request without output (embeddings, generic).
	OutputCap int64 `json:"output_cap,omitempty"`
	// Outputs is how many completions the request asks for (n, best_of,
	// times the prompts of a completions request); 0 without output.
	Outputs int64 `json:"outputs,omitempty"`
	// Tools tells that the request offers tools or functions.
	Tools bool `json:"tools,omitempty"`
	// PreviousResponseID is the stored Responses answer a Responses
	// request continues (its previous_response_id); empty for none.
	PreviousResponseID string `json:"previous_response_id,omitempty"`
}

// MarshalJSON encodes e with its cost also written in dollars ("cost_usd"),
// for `costgate estimate`.
func (e Estimate) MarshalJSON() ([]byte, error) {
	type plain Estimate
	return json.Marshal(struct {
		plain
		CostUSD string `json:"cost_usd"`
	}{plain(e), e.Cost.String()})
}

// Estimate counts and prices the request body of an API of the given kind.
// A body that is not valid JSON, or has a field of the wrong type, gives an
// error matching *BadRequestError; so does a request whose token counts or
// cost cannot be represented (it wraps ErrCostOverflow). A model missing from the price table is
// priced at the default price, counted by UnknownModels and flagged in the
// result. Generic requests are estimated by Rule.Estimate instead.
func (e *Estimator) Estimate(kind Kind, body []byte) (Estimate, error) {
	var (
		est Estimate
		err error
	)
	switch kind {
	case ChatCompletions:
		est, err = e.estimateChat(body)
	case Completions:
		est, err = e.estimateCompletions(body)
	case Embeddings:
		est, err = e.estimateEmbeddings(body)
	case Responses:
		est, err = e.estimateResponses(body)
	case AnthropicMessages:
		est, err = e.estimateAnthropic(body)
	default:
		return Estimate{Kind: kind}, badRequest(kind, nil, "an Estimator cannot read %s bodies; price them with a Rule", kind)
	}
	if err != nil {
		return Estimate{Kind: kind}, err
	}
	if overflowed(est.Usage, est.Cost) {
		return Estimate{Kind: kind}, overflowError(kind)
	}
	est.Kind = kind
	return est, nil
}

// finish prices an estimate whose input and output tokens are set.
func (e *Estimator) finish(m model, est *Estimate) {
	est.Model = m.name
	est.Encoding = m.encName
	est.UnknownModel = m.unknown
	est.Uncounted = est.Uncounted || m.reasoning
	if m.unknown {
		e.unknown.Add(1)
	}
	est.Cost = e.costOf(m, est.Usage)
}

// reserveOthers adds to est what the other models a request may run may
// bill (see otherModel), as Usage.Steps priced at their models: each
// call reads the prompt and writes its output. A request that names more
// than maxStepModels other models, or a name that is no model's, is
// refused.
func (e *Estimator) reserveOthers(est *Estimate, kind Kind, others []otherModel) error {
	if len(others) == 0 {
		return nil
	}
	steps := &Steps{}
	in := est.Usage.InputTokens
	for _, o := range others {
		if err := checkModelName(kind, o.model); err != nil || servedModel(o.model) != o.model {
			return fmt.Errorf("another model: want a model's name, not %q", o.model)
		}
		u := Usage{InputTokens: mulSat(o.calls, in), OutputTokens: mulSat(o.calls, o.output)}
		i := slices.IndexFunc(steps.parts, func(p modelUsage) bool { return p.model == o.model })
		if i < 0 {
			if len(steps.parts) == maxStepModels {
				return fmt.Errorf("more than %d other models", maxStepModels)
			}
			steps.parts = append(steps.parts, modelUsage{model: o.model})
			i = len(steps.parts) - 1
		}
		p := &steps.parts[i].usage
		p.InputTokens, p.OutputTokens = addSat(p.InputTokens, u.InputTokens), addSat(p.OutputTokens, u.OutputTokens)
		est.Usage.InputTokens = addSat(est.Usage.InputTokens, u.InputTokens)
		est.Usage.OutputTokens = addSat(est.Usage.OutputTokens, u.OutputTokens)
	}
	est.Usage.Steps = steps
	return nil
}
