package gate_test

import (
	"context"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
)

// BenchmarkLearned times the gate's request path, Reserve then Settle of
// one chat request, under output_reserve 100 and under output_reserve:
// p95 with a warm key (lookup, reservation and exposure at Reserve, the
// sketch's update at Settle): the difference is what the learned estimate
// costs a request.
//
//	go test -run XXX -bench Learned -benchmem ./gate/
func BenchmarkLearned(b *testing.B) {
	for _, reserve := range []string{"100", "p95"} {
		b.Run("output_reserve="+reserve, func(b *testing.B) {
			g := benchGate(b, reserve)
			c := g.Identify("cg-acme")
			est, err := c.Estimator().Estimate(costmodel.ChatCompletions, []byte(`{"model":"m1","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			u := costmodel.Usage{InputTokens: est.Usage.InputTokens, OutputTokens: 200}
			charge := gate.Charge{Usage: u, Cost: c.Estimator().Cost("m1", u), HTTPStatus: 200}
			for range 100 { // warm the key
				res, _ := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: est})
				res.Settle(ctx, charge)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: est})
					if res == nil {
						b.Errorf("refused: %+v", d)
						return
					}
					res.Settle(ctx, charge)
				}
			})
		})
	}
}

// benchGate is a gate with no limit and no policy: what is timed is the
// pipeline and the learned estimate.
func benchGate(b *testing.B, reserve string) *gate.Gate {
	b.Helper()
	return openYAML(b, `
admin_token: t
data_dir: `+b.TempDir()+`
costs:
  output_reserve: `+reserve+`
  learned: {min_samples: 20, interval: 1h}
  prices: {m1: {input: "1.00", output: "10.00", max_output_tokens: 4096}}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
`)
}

func mustParse(tb testing.TB, yaml string) *config.Config {
	tb.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}
