package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// stepsMsgs is the prompt of the steps attacks' requests.
const stepsMsgs = `"messages":[{"role":"user","content":"Plan the migration of the billing service."}]`

// stepsGate opens a gate of tenant acme with limit, keyed by model, on
// the in-memory store (redisURL "") or on Redis, with a reservations
// secret, so that two gates on one Redis are two replicas.
func stepsGate(t *testing.T, redisURL, dataDir, limit string) *gate.Gate {
	t.Helper()
	store := ""
	if redisURL != "" {
		store = fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}\n", redisURL)
	}
	return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
%sreservations: {secret: 0123456789abcdef0123}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - %s
`, dataDir, store, limit))
}

// haikuReserved opens a gate with a per-model limit of full tokens an
// hour (stepsGate) and reserves on it a Haiku request of max_tokens 1000
// whose body carries extra (its tools or fallbacks): the gate, the
// caller and the reservation, which must be admitted.
func haikuReserved(t *testing.T, redisURL string, full int64, extra string) (*gate.Gate, *gate.Caller, *gate.Reservation) {
	t.Helper()
	g := stepsGate(t, redisURL, t.TempDir(), fmt.Sprintf("{name: per-model, dimensions: [tenant, model], unit: tokens, rate: %d, period: 1h, algorithm: fixed_window}", full))
	cl := g.Identify("cg-acme")
	est := estimateBody(t, cl, `{"model":"claude-haiku-4-5","max_tokens":1000,`+extra+`,`+stepsMsgs+`}`)
	res, d := g.Reserve(context.Background(), &gate.Request{Caller: cl, Route: "/v1/messages", Estimate: est})
	if res == nil {
		t.Fatalf("refused: %+v", d)
	}
	return g, cl, res
}

// onEachGateStore runs f on the in-memory store and on a private Redis.
func onEachGateStore(t *testing.T, f func(t *testing.T, redisURL string)) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			url := ""
			if store == "redis" {
				url = redistest.New(t).URL
			}
			f(t, url)
		})
	}
}

// estimateBody is the estimate of an Anthropic Messages body with the
// gate's estimator.
func estimateBody(t *testing.T, c *gate.Caller, body string) costmodel.Estimate {
	t.Helper()
	est, err := c.Estimator().Estimate(costmodel.AnthropicMessages, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return est
}

// remaining is what limit name has left under key.
func remaining(t *testing.T, g *gate.Gate, name, key string) int64 {
	t.Helper()
	infos, err := g.Limits(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == name && in.State != nil {
			return in.State.Remaining
		}
	}
	t.Fatalf("no limit %s", name)
	return 0
}

// TestStepsAtkModelLimitOfAnotherModel: a limit keyed by model holds
// acme's use of each model (here a tiny allowance of claude-opus-4-6,
// spent). acme asks claude-haiku-4-5 instead, with Anthropic's advisor
// tool naming Opus, or with Opus among its fallbacks: the upstream runs
// Opus for it. The limit was debited for Haiku's key alone, and Opus ran
// past its spent allowance, in every unit. A limit keyed by model has an
// item for each model a request may run, in the same all-or-nothing
// debit: the spent Opus key refuses it (429, naming Opus), and nothing
// is debited. An advisor of a model the price table does not know, and
// "default" fallbacks (the model's own, unnamed), are limited under
// their names, as a request for an unknown model is.
func TestStepsAtkModelLimitOfAnotherModel(t *testing.T) {
	ctx := context.Background()
	for _, u := range []struct {
		unit, rate string
		spent      costmodel.Estimate // a direct request that spends the allowance
	}{
		{"requests", "1", costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 10}, Cost: 1}},
		{"tokens", "100000", costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 100000}, Cost: 1}},
		{"usd", "10", costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 10}, Cost: 10_000_000_000}},
	} {
		t.Run(u.unit, func(t *testing.T) {
			onEachGateStore(t, func(t *testing.T, url string) {
				g := stepsGate(t, url, t.TempDir(), fmt.Sprintf("{name: per-model, dimensions: [tenant, model], unit: %s, %s: %s, period: 1h, algorithm: fixed_window}", u.unit, rateField(u.unit), u.rate))
				c := g.Identify("cg-acme")
				for _, c2 := range []struct{ name, other, body string }{
					{"an opus advisor", "claude-opus-4-6", `{"model":"claude-haiku-4-5","max_tokens":1000,"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}],` + stepsMsgs + `}`},
					{"an opus advisor by its dated name", "claude-opus-4-6", `{"model":"claude-haiku-4-5","max_tokens":1000,"tools":[{"type":"advisor_20260301","name":"advisor","model":"Claude-Opus-4-6"}],` + stepsMsgs + `}`},
					{"opus among the fallbacks", "claude-opus-4-6", `{"model":"claude-haiku-4-5","max_tokens":1000,"fallbacks":[{"model":"claude-sonnet-4-5"},{"model":"claude-opus-4-6"}],` + stepsMsgs + `}`},
					{"an unknown advisor", "claude-ultra-9", `{"model":"claude-haiku-4-5","max_tokens":1000,"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-ultra-9"}],` + stepsMsgs + `}`},
					{"default fallbacks", "default", `{"model":"claude-haiku-4-5","max_tokens":1000,"fallbacks":"default",` + stepsMsgs + `}`},
				} {
					t.Run(c2.name, func(t *testing.T) {
						// The other model's allowance, spent by a request of its
						// own (unless a case before spent it).
						key := "{acme}:tenant=acme:model=" + c2.other
						if remaining(t, g, "per-model", key) > 0 {
							spend := u.spent
							spend.Model = c2.other
							res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/messages", Estimate: spend})
							if res == nil {
								t.Fatalf("the direct request was refused: %+v", d)
							}
							res.Settle(ctx, gate.Charge{Usage: spend.Usage, Cost: spend.Cost, HTTPStatus: 200})
						}
						if left := remaining(t, g, "per-model", key); left > 0 {
							t.Fatalf("%s has %d left after the request that spends it", key, left)
						}
						est := estimateBody(t, c, c2.body)
						res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/messages", Estimate: est})
						if res != nil {
							res.Cancel(ctx)
							t.Fatalf("admitted: %s ran past its spent limit per-model (%s)", c2.other, u.unit)
						}
						if d.Status != http.StatusTooManyRequests || d.Error.Code != "per-model" || !strings.Contains(d.Error.Message, c2.other) {
							t.Errorf("refused with %d %s %q, want 429 per-model naming %s", d.Status, d.Error.Code, d.Error.Message, c2.other)
						}
						haiku := "{acme}:tenant=acme:model=claude-haiku-4-5"
						if left, full := remaining(t, g, "per-model", haiku), mustRate(t, u.rate, u.unit); left != full {
							t.Errorf("the refused request debited Haiku's key: %d left of %d", left, full)
						}
					})
				}
			})
		})
	}
}

// rateField is the name of a limit's rate in unit.
func rateField(unit string) string {
	if unit == "usd" {
		return "rate_usd"
	}
	return "rate"
}

// mustRate is rate in the unit's counting (nano-dollars for usd).
func mustRate(t *testing.T, rate, unit string) int64 {
	t.Helper()
	if unit == "usd" {
		n, err := costmodel.ParseUSD(rate)
		if err != nil {
			t.Fatal(err)
		}
		return int64(n)
	}
	var n int64
	fmt.Sscan(rate, &n)
	return n
}

// stepsAnswer is an Anthropic answer to a Haiku request whose advisor
// ran Opus: 40,000 input and 1,800 output tokens of 50,000 and 3,800.
const stepsAnswer = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5-20251001","content":[{"type":"text","text":"Done."}],"stop_reason":"end_turn","usage":{"input_tokens":10000,"output_tokens":2000,"iterations":[` +
	`{"type":"message","model":"claude-haiku-4-5-20251001","input_tokens":6000,"output_tokens":300},` +
	`{"type":"advisor_message","model":"claude-opus-4-6","input_tokens":40000,"output_tokens":1800},` +
	`{"type":"message","model":"claude-haiku-4-5-20251001","input_tokens":4000,"output_tokens":1700}]}}`

// TestStepsAtkAdvisorTokensChargedToItsModel: a limit keyed by model
// that counts tokens is settled with what each model ran. A Haiku
// request whose Opus advisor read 40,000 tokens and wrote 1,800 left
// acme's Opus allowance untouched: the limit was charged on Haiku's key
// alone. Opus's key is charged its steps (41,800 tokens); Haiku's the
// whole request, as without an advisor (53,800); a fallback that did not
// run gets its reservation back; an answer that names no step's model
// charges the other model all of it, at most its reservation.
func TestStepsAtkAdvisorTokensChargedToItsModel(t *testing.T) {
	ctx := context.Background()
	const full = 1_000_000
	answer, err := costmodel.ParseUsage(costmodel.AnthropicMessages, []byte(stepsAnswer))
	if err != nil {
		t.Fatal(err)
	}
	haikuOnly, err := costmodel.ParseUsage(costmodel.AnthropicMessages, []byte(`{"usage":{"input_tokens":3000,"output_tokens":100,"iterations":[{"type":"message","model":"claude-haiku-4-5","input_tokens":3000,"output_tokens":100}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	noSteps := costmodel.Usage{InputTokens: 900, OutputTokens: 100}
	const (
		haikuKey = "{acme}:tenant=acme:model=claude-haiku-4-5"
		opusKey  = "{acme}:tenant=acme:model=claude-opus-4-6"
	)
	for _, c := range []struct {
		name, extra string
		usage       costmodel.Usage
		opus        int64 // Opus's key charged
	}{
		{"the advisor ran", `"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}]`, answer, 41_800},
		{"the fallback did not run", `"fallbacks":[{"model":"claude-opus-4-6"}]`, haikuOnly, 0},
		{"the answer names no step", `"tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}]`, noSteps, 1_000},
	} {
		t.Run(c.name, func(t *testing.T) {
			onEachGateStore(t, func(t *testing.T, url string) {
				g, cl, res := haikuReserved(t, url, full, c.extra)
				if d, ok := res.Record(ctx); !ok {
					t.Fatal(d)
				}
				res.Settle(ctx, gate.Charge{Usage: c.usage, Cost: cl.Estimator().Cost("claude-haiku-4-5", c.usage), HTTPStatus: 200})
				if got := full - remaining(t, g, "per-model", opusKey); got != c.opus {
					t.Errorf("Opus's key was charged %d tokens, want %d", got, c.opus)
				}
				if got, want := full-remaining(t, g, "per-model", haikuKey), c.usage.TotalTokens(); got != want {
					t.Errorf("Haiku's key was charged %d tokens, want the whole request's %d", got, want)
				}
			})
		})
	}
}

// TestStepsAtkDefaultFallbacksChargedToDefault: "fallbacks":"default"
// lets the model's own fallbacks, which the request does not name, serve
// it; a limit keyed by model holds them under the model name "default".
// The answer names the model that served (claude-sonnet-4-5): no item is
// of that name, and "default"'s was refunded, so that the fallback's
// tokens counted on no other model's key. The item of "default" is
// charged the steps of the models the request did not name, and only
// those (an Opus advisor's stay Opus's).
func TestStepsAtkDefaultFallbacksChargedToDefault(t *testing.T) {
	ctx := context.Background()
	const full = 1_000_000
	for _, c := range []struct {
		name, extra, iterations string
		def, opus               int64
	}{
		{"a fallback served", `"fallbacks":"default"`,
			`{"type":"message","model":"claude-haiku-4-5","input_tokens":3000,"output_tokens":20},` +
				`{"type":"fallback_message","model":"claude-sonnet-4-5-20250929","input_tokens":3000,"output_tokens":900}`, 3_900, 0},
		{"beside an opus advisor", `"fallbacks":"default","tools":[{"type":"advisor_20260301","name":"advisor","model":"claude-opus-4-6"}]`,
			`{"type":"message","model":"claude-haiku-4-5","input_tokens":3000,"output_tokens":20},` +
				`{"type":"advisor_message","model":"claude-opus-4-6","input_tokens":4000,"output_tokens":500},` +
				`{"type":"fallback_message","model":"claude-sonnet-4-5","input_tokens":3000,"output_tokens":900}`, 3_900, 4_500},
	} {
		t.Run(c.name, func(t *testing.T) {
			onEachGateStore(t, func(t *testing.T, url string) {
				g, cl, res := haikuReserved(t, url, full, c.extra)
				u, err := costmodel.ParseUsage(costmodel.AnthropicMessages, []byte(`{"usage":{"input_tokens":1,"output_tokens":1,"iterations":[`+c.iterations+`]}}`))
				if err != nil {
					t.Fatal(err)
				}
				res.Settle(ctx, gate.Charge{Usage: u, Cost: cl.Estimator().Cost("claude-haiku-4-5", u), HTTPStatus: 200})
				if got := full - remaining(t, g, "per-model", "{acme}:tenant=acme:model=default"); got != c.def {
					t.Errorf("the default fallbacks' key was charged %d tokens, want the %d the unnamed fallback ran", got, c.def)
				}
				if got := full - remaining(t, g, "per-model", "{acme}:tenant=acme:model=claude-opus-4-6"); got != c.opus {
					t.Errorf("Opus's key was charged %d tokens, want %d", got, c.opus)
				}
			})
		})
	}
}

// TestStepsUnknownOtherModelsUnderTheKeyCap: an advisor naming a model
// the price table does not know is a value the tenant chose, as an
// unknown request model is: each makes a counter of a limit keyed by
// model, and store.max_keys_per_tenant (here 2) bounds them: the third
// new name is refused 429 (per-model, by store.max_keys_per_tenant), and
// writes nothing.
func TestStepsUnknownOtherModelsUnderTheKeyCap(t *testing.T) {
	ctx := context.Background()
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {max_keys_per_tenant: 2}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: per-model, dimensions: [tenant, model], unit: tokens, rate: 1000000, period: 1h, algorithm: fixed_window}
`, t.TempDir()))
	c := g.Identify("cg-acme")
	for i := range 3 {
		est := estimateBody(t, c, fmt.Sprintf(`{"model":"claude-haiku-4-5","max_tokens":1000,"tools":[{"type":"advisor_20260301","name":"advisor","model":"made-up-%d"}],`+stepsMsgs+`}`, i))
		res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/messages", Estimate: est})
		if i < 2 {
			if res == nil {
				t.Fatalf("request %d refused: %+v", i, d)
			}
			res.Settle(ctx, gate.Charge{Usage: est.Usage, Cost: est.Cost, HTTPStatus: 200})
			continue
		}
		if res != nil || d.Status != http.StatusTooManyRequests || d.Error.Code != "per-model" || d.Error.Policy != "store.max_keys_per_tenant" {
			t.Errorf("a third unknown advisor model: %+v, want 429 of per-model by store.max_keys_per_tenant", d)
		}
		if left := remaining(t, g, "per-model", "{acme}:tenant=acme:model=claude-haiku-4-5"); left != 1000000-2*est.Usage.TotalTokens() {
			t.Errorf("the refused request debited Haiku's key: %d left", left)
		}
	}
}
