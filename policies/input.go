package policies

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Input is the document a policy sees as `input`. The proxy fills it once per
// request; policies only read it. Its JSON form (snake_case names, every field
// always present, lists never null) is described by schema/input.schema.json,
// which the policy compiler also uses to type-check every reference to input:
// a misspelt field such as input.caller.plann is a load error, not a rule that
// silently never matches.
//
// Money is integer nano-dollars (1 USD = 1_000_000_000); tokens are integer
// token counts; times are whole seconds. There are no floats anywhere.
type Input struct {
	Caller   Caller   `json:"caller"`
	Request  Request  `json:"request"`
	Estimate Estimate `json:"estimate"`
	// Limits lists every limit that applies to the request, in the order the
	// limiter checked them. Empty when no limit applies.
	Limits []Limit `json:"limits"`
	// Spend lists the period-to-date spend for each budget that applies to the
	// request. Empty when no budget applies.
	Spend []Spend `json:"spend"`
	Time  Time    `json:"time"`
}

// Caller identifies who sends the request. Empty strings mean unknown.
type Caller struct {
	Tenant string `json:"tenant"`
	User   string `json:"user"`
	KeyID  string `json:"key_id"`
	Plan   string `json:"plan"`
	IP     string `json:"ip"`
	Region string `json:"region"`
}

// Request describes what is asked of the upstream.
type Request struct {
	// Route is the configured route name, Upstream the upstream name.
	Route    string `json:"route"`
	Upstream string `json:"upstream"`
	// Model is the model the client asked for, by its canonical name (as
	// per-model limits key it: lowercased, a dated alias by its model's
	// name, "ft:" and the base of a fine-tuned model); empty for APIs
	// without models.
	Model string `json:"model"`
	// OtherModels are the models besides Model the request may run, by
	// their canonical names: an Anthropic advisor tool's, its fallbacks'. A
	// policy that keeps a plan off a model must look here too: a
	// request to a cheap model with an advisor on the other one runs it.
	OtherModels []string `json:"other_models,omitempty"`
	Stream      bool     `json:"stream"`
	// MaxOutputTokens is the output token cap the client sent (max_tokens,
	// max_output_tokens, max_completion_tokens); 0 means none was sent.
	MaxOutputTokens int64 `json:"max_output_tokens"`
	// Page is the 1-based result page a paginated API (such as a search API)
	// is asked for; 0 when the request is not paginated.
	Page int64 `json:"page"`
	// Attributes are the custom attributes the caller gave the request
	// (the reserve API's attributes); empty for proxied requests.
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Estimate is the cost model's estimate of the request before it is sent.
type Estimate struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	CostNanoUSD  int64 `json:"cost_nano_usd"`
	// OutputBasis is "learned" when OutputTokens is the learned quantile
	// of the output of the tenant's requests like this one
	// (output_reserve: pNN), "limit" when it is the request's output limit
	// times output_reserve (or the request has no output).
	OutputBasis string `json:"output_basis"`
	// OutputQuantile is the learned quantile output_reserve asks for
	// ("p95"), empty under a percentage; OutputSamples is how many settled
	// requests the learned estimate rests on (fewer than
	// costs.learned.min_samples: the basis is "limit").
	OutputQuantile string `json:"output_quantile"`
	OutputSamples  int64  `json:"output_samples"`
}

// Limit is the state of one configured limit for this request, before the
// request is charged to it.
type Limit struct {
	Name string `json:"name"`
	// Unit is the limit's unit: requests, tokens, input_tokens,
	// output_tokens, usd (counted in nano-dollars) or a custom unit.
	Unit         string `json:"unit"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetSeconds int64  `json:"reset_seconds"`
}

// Spend is the period-to-date spend against one budget.
type Spend struct {
	// Scope is "tenant", "user" or "key"; Period is "day" or "month".
	Scope         string `json:"scope"`
	Period        string `json:"period"`
	SpentNanoUSD  int64  `json:"spent_nano_usd"`
	BudgetNanoUSD int64  `json:"budget_nano_usd"`
}

// Time is when the request arrived. The proxy gives Hour (0-23) and Weekday
// (0 is Sunday) in UTC, always: no setting changes the zone. (TimeOf gives
// them in its argument's location, for tests and tools.)
type Time struct {
	Unix    int64 `json:"unix"`
	Hour    int   `json:"hour"`
	Weekday int   `json:"weekday"`
}

// MarshalJSON writes the JSON form of in that policies see: lists are never
// null.
func (in Input) MarshalJSON() ([]byte, error) {
	type plain Input // without this method
	if in.Limits == nil {
		in.Limits = []Limit{}
	}
	if in.Spend == nil {
		in.Spend = []Spend{}
	}
	return json.Marshal(plain(in))
}

// TimeOf returns the Time of t, in t's location.
func TimeOf(t time.Time) Time {
	return Time{Unix: t.Unix(), Hour: t.Hour(), Weekday: int(t.Weekday())}
}

// DecodeInput parses the JSON form of an Input, as written by
// `costgate policy eval` users and by tests. Unknown fields and trailing data
// are errors.
func DecodeInput(data []byte) (*Input, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var in Input
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("policies: decode input: %w", err)
	}
	if dec.More() {
		return nil, errors.New("policies: decode input: trailing data after the input object")
	}
	if err := in.Validate(); err != nil {
		return nil, err
	}
	return &in, nil
}

// Validate reports whether in is well formed: known spend scopes and periods,
// an hour in 0-23 and a weekday in 0-6.
func (in *Input) Validate() error {
	for i, s := range in.Spend {
		switch s.Scope {
		case "tenant", "user", "key":
		default:
			return fmt.Errorf("policies: input: spend[%d]: unknown scope %q", i, s.Scope)
		}
		switch s.Period {
		case "day", "month":
		default:
			return fmt.Errorf("policies: input: spend[%d]: unknown period %q", i, s.Period)
		}
	}
	if in.Time.Hour < 0 || in.Time.Hour > 23 {
		return fmt.Errorf("policies: input: time.hour %d out of range 0-23", in.Time.Hour)
	}
	if in.Time.Weekday < 0 || in.Time.Weekday > 6 {
		return fmt.Errorf("policies: input: time.weekday %d out of range 0-6", in.Time.Weekday)
	}
	return nil
}

// Value returns in as a Rego value, exactly as its JSON form would parse:
// every field present and lists never null. It is what the Rego evaluator
// sees as input.
func (in *Input) Value() ast.Value {
	limits := make([]*ast.Term, len(in.Limits))
	for i, l := range in.Limits {
		limits[i] = ast.ObjectTerm(
			ast.Item(ast.InternedTerm("name"), ast.StringTerm(l.Name)),
			ast.Item(ast.InternedTerm("unit"), ast.StringTerm(l.Unit)),
			ast.Item(ast.InternedTerm("limit"), ast.InternedTerm(l.Limit)),
			ast.Item(ast.InternedTerm("remaining"), ast.InternedTerm(l.Remaining)),
			ast.Item(ast.InternedTerm("reset_seconds"), ast.InternedTerm(l.ResetSeconds)),
		)
	}
	spend := make([]*ast.Term, len(in.Spend))
	for i, s := range in.Spend {
		spend[i] = ast.ObjectTerm(
			ast.Item(ast.InternedTerm("scope"), ast.StringTerm(s.Scope)),
			ast.Item(ast.InternedTerm("period"), ast.StringTerm(s.Period)),
			ast.Item(ast.InternedTerm("spent_nano_usd"), ast.InternedTerm(s.SpentNanoUSD)),
			ast.Item(ast.InternedTerm("budget_nano_usd"), ast.InternedTerm(s.BudgetNanoUSD)),
		)
	}
	c, r, e := &in.Caller, &in.Request, &in.Estimate
	return ast.NewObject(
		ast.Item(ast.InternedTerm("caller"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("tenant"), ast.StringTerm(c.Tenant)),
			ast.Item(ast.InternedTerm("user"), ast.StringTerm(c.User)),
			ast.Item(ast.InternedTerm("key_id"), ast.StringTerm(c.KeyID)),
			ast.Item(ast.InternedTerm("plan"), ast.StringTerm(c.Plan)),
			ast.Item(ast.InternedTerm("ip"), ast.StringTerm(c.IP)),
			ast.Item(ast.InternedTerm("region"), ast.StringTerm(c.Region)),
		)),
		ast.Item(ast.InternedTerm("request"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("route"), ast.StringTerm(r.Route)),
			ast.Item(ast.InternedTerm("upstream"), ast.StringTerm(r.Upstream)),
			ast.Item(ast.InternedTerm("model"), ast.StringTerm(r.Model)),
			ast.Item(ast.InternedTerm("other_models"), stringsTerm(r.OtherModels)),
			ast.Item(ast.InternedTerm("stream"), ast.InternedTerm(r.Stream)),
			ast.Item(ast.InternedTerm("max_output_tokens"), ast.InternedTerm(r.MaxOutputTokens)),
			ast.Item(ast.InternedTerm("page"), ast.InternedTerm(r.Page)),
			ast.Item(ast.InternedTerm("attributes"), attributesTerm(r.Attributes)),
		)),
		ast.Item(ast.InternedTerm("estimate"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("input_tokens"), ast.InternedTerm(e.InputTokens)),
			ast.Item(ast.InternedTerm("output_tokens"), ast.InternedTerm(e.OutputTokens)),
			ast.Item(ast.InternedTerm("cost_nano_usd"), ast.InternedTerm(e.CostNanoUSD)),
			ast.Item(ast.InternedTerm("output_basis"), ast.StringTerm(e.OutputBasis)),
			ast.Item(ast.InternedTerm("output_quantile"), ast.StringTerm(e.OutputQuantile)),
			ast.Item(ast.InternedTerm("output_samples"), ast.InternedTerm(e.OutputSamples)),
		)),
		ast.Item(ast.InternedTerm("limits"), ast.ArrayTerm(limits...)),
		ast.Item(ast.InternedTerm("spend"), ast.ArrayTerm(spend...)),
		ast.Item(ast.InternedTerm("time"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("unix"), ast.InternedTerm(in.Time.Unix)),
			ast.Item(ast.InternedTerm("hour"), ast.InternedTerm(in.Time.Hour)),
			ast.Item(ast.InternedTerm("weekday"), ast.InternedTerm(in.Time.Weekday)),
		)),
	)
}

// stringsTerm is ss as a Rego array.
func stringsTerm(ss []string) *ast.Term {
	items := make([]*ast.Term, len(ss))
	for i, v := range ss {
		items[i] = ast.StringTerm(v)
	}
	return ast.ArrayTerm(items...)
}

// attributesTerm is a request's custom attributes as a Rego object.
func attributesTerm(attrs map[string]string) *ast.Term {
	items := make([][2]*ast.Term, 0, len(attrs))
	for k, v := range attrs {
		items = append(items, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
	}
	return ast.ObjectTerm(items...)
}
