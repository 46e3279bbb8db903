package gate_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// openExtendGate opens a gate whose limits count a stream's output in
// several ways: tokens, output tokens, requests and a dollar budget, on
// the store at redisURL (empty: memory).
func openExtendGate(t *testing.T, redisURL string) *gate.Gate {
	t.Helper()
	return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 2s, queue_timeout: 2s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: requests, dimensions: [tenant], unit: requests, rate: 100, period: 24h, algorithm: fixed_window}
  - {name: tokens, dimensions: [tenant], unit: tokens, rate: 5000, period: 24h, algorithm: fixed_window}
  - {name: output, dimensions: [tenant], unit: output_tokens, rate: 3000, period: 24h, algorithm: sliding_log}
  - {name: input, dimensions: [tenant], unit: input_tokens, rate: 3000, period: 24h, algorithm: fixed_window}
budgets:
  - {name: daily, scope: tenant, amount: "0.001"}
`, t.TempDir(), redisURL))
}

// used returns how much of each limit is spent, by name.
func used(t *testing.T, g *gate.Gate) map[string]int64 {
	t.Helper()
	_, d := g.Reserve(context.Background(), &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions", Check: true, States: true})
	out := map[string]int64{}
	for _, l := range d.Limits {
		out[l.Name] = l.Capacity - l.Remaining
	}
	return out
}

// TestExtendSettlesExactly: a reservation extended in increments, then
// settled, leaves every limit charged the actual usage, as a reservation
// of the whole would; a refused increment changes nothing and names its
// limit; a cancel returns the increments too. On both stores.
func TestExtendSettlesExactly(t *testing.T) {
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const model = "gpt-4o-mini"
	estimate := func(in, out int64) costmodel.Estimate {
		u := costmodel.Usage{InputTokens: in, OutputTokens: out}
		return costmodel.Estimate{Model: model, Stream: true, Usage: u, Cost: est.Cost(model, u)}
	}
	want := func(in, out int64) map[string]int64 {
		u := costmodel.Usage{InputTokens: in, OutputTokens: out}
		return map[string]int64{"requests": 1, "tokens": in + out, "output": out, "input": in, "daily": int64(est.Cost(model, u))}
	}
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			// Each case has a Redis of its own: the limits' keys are the same.
			open := func(t *testing.T) *gate.Gate {
				if store == "redis" {
					return openExtendGate(t, redistest.New(t).URL)
				}
				return openExtendGate(t, "")
			}
			ctx := context.Background()
			for _, c := range []struct {
				name    string
				actual  int64 // output tokens settled
				extends []int64
			}{
				{"within the last increment", 250, []int64{100, 100, 100}},
				{"past every increment", 400, []int64{100, 100}},
				{"inside the reservation", 5, []int64{100, 100}},
				{"exactly", 210, []int64{100, 100}},
				{"no increment", 40, nil},
			} {
				t.Run(c.name, func(t *testing.T) {
					g := open(t)
					res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions", Estimate: estimate(50, 10)})
					if res == nil {
						t.Fatalf("refused: %+v", d)
					}
					var total int64 = 10
					for _, n := range c.extends {
						if d, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: n}); !ok {
							t.Fatalf("increment refused: %+v", d)
						}
						total += n
					}
					if got, w := used(t, g), want(50, total); fmt.Sprint(got) != fmt.Sprint(w) {
						t.Fatalf("after the increments: %v, want %v", got, w)
					}
					u := costmodel.Usage{InputTokens: 50, OutputTokens: c.actual}
					res.Settle(ctx, gate.Charge{Usage: u, Cost: est.Cost(model, u), HTTPStatus: 200})
					if got, w := used(t, g), want(50, c.actual); fmt.Sprint(got) != fmt.Sprint(w) {
						t.Errorf("after settling %d output tokens: %v, want %v", c.actual, got, w)
					}
				})
			}

			t.Run("refused and cancelled", func(t *testing.T) {
				g := open(t)
				res, _ := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions", Estimate: estimate(50, 10)})
				if _, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: 1000}); !ok {
					t.Fatal("first increment refused")
				}
				before := used(t, g)
				// $0.001 holds about 1,650 output tokens: 1,000 more do not fit.
				d, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: 1000})
				if ok || d.Status != 402 || d.Error.Type != "budget_exceeded" || d.Error.Code != "daily" {
					t.Fatalf("want 402 budget_exceeded by daily, got %v %+v", ok, d.Error)
				}
				if after := used(t, g); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Errorf("a refused increment changed the limits: %v, was %v", after, before)
				}
				if u, _ := res.Extended(); u.OutputTokens != 1000 {
					t.Errorf("extended %d output tokens, want 1000", u.OutputTokens)
				}
				res.Cancel(ctx)
				if after := used(t, g); fmt.Sprint(after) != fmt.Sprint(map[string]int64{"requests": 0, "tokens": 0, "output": 0, "input": 0, "daily": 0}) {
					t.Errorf("after cancel: %v, want nothing held", after)
				}
				if _, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: 1}); ok {
					t.Error("an ended reservation was extended")
				}
			})
		})
	}
}

// TestExtendWhenTheStoreFails: an increment asked while Redis is down
// follows the limits' posture, as a debit does: fail-open limits are
// debited on the local fallback budget (and settled there), a fail-closed
// limit stops the stream with a 503 that names it.
func TestExtendWhenTheStoreFails(t *testing.T) {
	ctx := context.Background()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	u := costmodel.Usage{InputTokens: 50, OutputTokens: 10}
	estimate := costmodel.Estimate{Model: "gpt-4o-mini", Stream: true, Usage: u, Cost: est.Cost("gpt-4o-mini", u)}
	for _, c := range []struct {
		name, posture string
		want          int // the increment's status: 0 for debited
	}{
		{"fail open", "fail_open", 0},
		{"fail closed", "fail_closed", 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := redistest.New(t)
			// The store's timeout is long: the reservation's call must
			// succeed on a loaded machine (200 ms did not, once), and the
			// increment's fails at once on the stopped server's refused
			// connection.
			cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s, breaker_failures: 1}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: tokens, dimensions: [tenant], unit: tokens, rate: 5000, period: 24h, algorithm: fixed_window, on_store_failure: %s}
`, t.TempDir(), rs.URL, c.posture)))
			if err != nil {
				t.Fatal(err)
			}
			g, err := gate.Open(ctx, cfg, gate.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions", Estimate: estimate})
			if res == nil {
				t.Fatalf("refused: %+v", d)
			}
			rs.Stop(t)
			d, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: 100})
			switch {
			case c.want == 0 && !ok:
				t.Fatalf("a fail-open increment was refused: %+v", d.Error)
			case c.want != 0 && (ok || d.Status != c.want || d.Error.Code != "tokens"):
				t.Fatalf("want %d naming limit tokens, got %v %+v", c.want, ok, d.Error)
			}
			res.Settle(ctx, gate.Charge{Usage: costmodel.Usage{InputTokens: 50, OutputTokens: 80}, HTTPStatus: 200})
		})
	}
}
