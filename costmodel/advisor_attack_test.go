package costmodel

import (
	"fmt"
	"strings"
	"testing"
)

// TestUsageAtkStepsOfOtherModels: Anthropic's advisor tool runs a
// sub-inference on a stronger model (claude-opus-4-6) in the middle of a
// request to a cheaper one (claude-haiku-4-5), and a request with
// fallbacks may be served by another model: usage.iterations lists each
// step with the model that ran it, and each is billed at its model's
// price. Priced at the model asked for, an advisor step of 40,000 input
// and 1,800 output tokens beside 10,000 and 2,000 of the executor's was
// charged $0.069 where the upstream billed $0.265 (Haiku's price for
// Opus's tokens: a fifth of it). Each step is priced at its model, in an
// answer and in a stream, and the rest of the report at the model asked
// for.
func TestUsageAtkStepsOfOtherModels(t *testing.T) {
	e := estimatorWith(t, Config{})
	haiku, opus := e.resolve("claude-haiku-4-5").price, e.resolve("claude-opus-4-6").price
	const iterations = `"iterations":[` +
		`{"type":"message","model":"claude-haiku-4-5-20251001","input_tokens":6000,"output_tokens":300},` +
		`{"type":"advisor_message","model":"claude-opus-4-6","input_tokens":40000,"output_tokens":1800},` +
		`{"type":"message","model":"claude-haiku-4-5-20251001","input_tokens":4000,"output_tokens":1700}]`
	want := haiku.Cost(Usage{InputTokens: 10000, OutputTokens: 2000}) + opus.Cost(Usage{InputTokens: 40000, OutputTokens: 1800})
	check := func(t *testing.T, u Usage) {
		t.Helper()
		if got := e.Cost("claude-haiku-4-5", u); got != want {
			t.Errorf("charged $%.6f; the upstream billed $%.6f (Haiku's executor steps, Opus's advisor step)", float64(got)/1e9, float64(want)/1e9)
		}
		if u.InputTokens != 50000 || u.OutputTokens != 3800 {
			t.Errorf("counted %d input and %d output tokens, want 50,000 and 3,800 (the limits count them)", u.InputTokens, u.OutputTokens)
		}
	}
	eachIterationsReport(t, e, "claude-haiku-4-5", 10000, 2000, iterations, check)
	t.Run("a fallback model served", func(t *testing.T) {
		u, err := ParseUsage(AnthropicMessages, []byte(`{"model":"claude-haiku-4-5","usage":{"input_tokens":3000,"output_tokens":900,"iterations":[`+
			`{"type":"message","model":"claude-haiku-4-5","input_tokens":3000,"output_tokens":20},`+
			`{"type":"fallback_message","model":"claude-opus-4-6","input_tokens":3000,"output_tokens":900}]}}`))
		if err != nil {
			t.Fatal(err)
		}
		want := haiku.Cost(Usage{InputTokens: 3000, OutputTokens: 20}) + opus.Cost(Usage{InputTokens: 3000, OutputTokens: 900})
		if got := e.Cost("claude-haiku-4-5", u); got != want {
			t.Errorf("charged $%.6f; the upstream billed $%.6f", float64(got)/1e9, float64(want)/1e9)
		}
	})
	t.Run("the report beyond the steps", func(t *testing.T) {
		// Counts above the steps' sum, and web searches, are the model
		// asked for's.
		u, err := ParseUsage(AnthropicMessages, []byte(`{"usage":{"input_tokens":9000,"output_tokens":500,"server_tool_use":{"web_search_requests":2},"iterations":[`+
			`{"type":"advisor_message","model":"claude-opus-4-6","input_tokens":1000,"output_tokens":100}]}}`))
		if err != nil {
			t.Fatal(err)
		}
		want := opus.Cost(Usage{InputTokens: 1000, OutputTokens: 100}) + haiku.Cost(Usage{InputTokens: 8000, OutputTokens: 400, WebSearchRequests: 2})
		if got := e.Cost("claude-haiku-4-5", u); got != want {
			t.Errorf("charged $%.6f, want $%.6f", float64(got)/1e9, float64(want)/1e9)
		}
	})
	t.Run("steps of too many models", func(t *testing.T) {
		var steps []string
		for i := range maxStepModels + 1 {
			steps = append(steps, fmt.Sprintf(`{"type":"message","model":"m-%d","input_tokens":1,"output_tokens":1}`, i))
		}
		if _, err := ParseUsage(AnthropicMessages, []byte(`{"usage":{"input_tokens":9,"output_tokens":9,"iterations":[`+strings.Join(steps, ",")+`]}}`)); err == nil {
			t.Errorf("steps of %d models were read as a report", maxStepModels+1)
		}
	})
}

// TestEstimateAtkOtherModels: a request to claude-haiku-4-5 that names
// claude-opus-4-6 as its advisor, or among its fallbacks, may run Opus:
// reserved at Haiku's price alone, a tenant's budget was debited a fifth
// of what each such request may cost until it settled, so that requests
// in flight together could spend past it. The estimate reserves what
// each other model may bill at its price: the advisor's max_uses
// sub-inferences (each reading the prompt and writing its max_tokens),
// each fallback the whole request.
func TestEstimateAtkOtherModels(t *testing.T) {
	e := estimatorWith(t, Config{})
	haiku, opus := e.resolve("claude-haiku-4-5").price, e.resolve("claude-opus-4-6").price
	const msgs = `"messages":[{"role":"user","content":"Plan the migration of the billing service to the new ledger."}]`
	base, err := e.Estimate(AnthropicMessages, []byte(`{"model":"claude-haiku-4-5","max_tokens":1000,`+msgs+`}`))
	if err != nil {
		t.Fatal(err)
	}
	in := base.Usage.InputTokens
	for _, c := range []struct {
		name, extra string
		tools       bool // the extra member is a tool list: its definitions count as input
		opus        Usage
	}{
		{"advisor", `"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6","max_uses":2,"max_tokens":1500}]`, true, Usage{}},
		{"advisor without limits", `"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}]`, true, Usage{}},
		{"advisor spelled otherwise", `"tools":[{"type":"\u0061dvisor_20260301","name":"advisor","model":"claude-\u006fpus-4-6","max_uses":2,"max_tokens":1500}]`, true, Usage{}},
		{"fallbacks", `"fallbacks":[{"model":"claude-opus-4-6","max_tokens":800},{"model":"claude-opus-4-6"}]`, false, Usage{InputTokens: 2 * in, OutputTokens: 1800}},
	} {
		t.Run(c.name, func(t *testing.T) {
			est, err := e.Estimate(AnthropicMessages, []byte(`{"model":"claude-haiku-4-5","max_tokens":1000,`+c.extra+`,`+msgs+`}`))
			if err != nil {
				t.Fatal(err)
			}
			want := c.opus
			if c.tools {
				// The prompt with the tool list, read by each call.
				uses, out := int64(2), int64(1500)
				if c.name == "advisor without limits" {
					uses, out = defaultAdvisorUses, defaultAdvisorOutput
				}
				prompt := est.Usage.InputTokens / (1 + uses)
				want = Usage{InputTokens: uses * prompt, OutputTokens: uses * out}
			}
			floor := haiku.Cost(Usage{InputTokens: in, OutputTokens: 1000}) + opus.Cost(want)
			if est.Cost < floor {
				t.Errorf("reserved $%.6f; Opus alone may bill $%.6f of it (%d input, %d output tokens)",
					float64(est.Cost)/1e9, float64(opus.Cost(want))/1e9, want.InputTokens, want.OutputTokens)
			}
			if est.Usage.InputTokens < in+want.InputTokens || est.Usage.OutputTokens < 1000+want.OutputTokens {
				t.Errorf("reserved %d input and %d output tokens, want at least %d and %d", est.Usage.InputTokens, est.Usage.OutputTokens, in+want.InputTokens, 1000+want.OutputTokens)
			}
		})
	}
	for _, bad := range []string{
		`"fallbacks":"opus"`,
		`"fallbacks":[{"max_tokens":800}]`,
		`"fallbacks":[{"model":"claude-opus-4-6","model":"claude-3-haiku"}]`,
		`"fallbacks":[{"model":"a"},{"model":"b"},{"model":"c"},{"model":"d"},{"model":"e"},{"model":"f"},{"model":"g"},{"model":"h"},{"model":"i"}]`,
		`"tools":[{"type":"advisor_20260301","name":"advisor","model":"opus\u0000"}]`,
	} {
		if _, err := e.Estimate(AnthropicMessages, []byte(`{"model":"claude-haiku-4-5","max_tokens":1000,`+bad+`,`+msgs+`}`)); err == nil {
			t.Errorf("%s: estimated, want the request refused", bad)
		}
	}
}

// TestEstimateAtkDefaultFallbacks: "fallbacks":"default" lets the model's
// own fallbacks, which the request does not name, serve it: any model may
// run the whole request. It reserved nothing beyond Haiku's own price,
// so that a request Opus served (a whole request at five times the
// price) was reserved a sixth of what it may cost. The unnamed model is
// reserved as a model the price table does not know is: the whole
// request once more, at the default price, under the name
// DefaultFallbacks (which the policies and the limits keyed by model see).
// An advisor of a model the table does not know is likewise priced at the
// default price.
func TestEstimateAtkDefaultFallbacks(t *testing.T) {
	e := estimatorWith(t, Config{})
	const msgs = `"messages":[{"role":"user","content":"Plan the migration of the billing service to the new ledger."}]`
	base, err := e.Estimate(AnthropicMessages, []byte(`{"model":"claude-haiku-4-5","max_tokens":1000,`+msgs+`}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, known := e.Price("default"); known {
		t.Fatal(`the price table knows a model named "default"`)
	}
	whole := Usage{InputTokens: base.Usage.InputTokens, OutputTokens: 1000}
	for _, c := range []struct{ name, extra, model string }{
		{"default fallbacks", `"fallbacks":"default"`, "default"}, // DefaultFallbacks
		{"an unknown fallback", `"fallbacks":[{"model":"claude-ultra-9"}]`, "claude-ultra-9"},
	} {
		t.Run(c.name, func(t *testing.T) {
			est, err := e.Estimate(AnthropicMessages, []byte(`{"model":"claude-haiku-4-5","max_tokens":1000,`+c.extra+`,`+msgs+`}`))
			if err != nil {
				t.Fatal(err)
			}
			floor := base.Cost + e.defaultPrice.Cost(whole)
			if est.Cost < floor {
				t.Errorf("reserved $%.6f; the unnamed model may bill $%.6f more than Haiku's $%.6f (the whole request at the default price)",
					float64(est.Cost)/1e9, float64(e.defaultPrice.Cost(whole))/1e9, float64(base.Cost)/1e9)
			}
			if ms := est.Usage.Steps.Models(); len(ms) != 1 || ms[0] != c.model {
				t.Errorf("other models %q, want [%s]", ms, c.model)
			}
		})
	}
}
