package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestExpiryAtkOutputReservedInPart: a reservation the caller neither
// settles nor releases is charged at its expiry, when nobody reported its
// answer. Under output_reserve: 10, a request reserved from a body holds a
// tenth of its output limit; its expiry charged that tenth, so that a
// caller whose answer came late (the client's Transport settles after
// the TTL, 410) or who never settled paid for 100 output tokens of an
// answer that may have run to 1,000, on every limit and on the bill. The
// proxy charges a request whose answer never came at its whole output
// limit, and so did an expiry under a learned quantile (output_reserve:
// pNN). What must hold: an expired reservation is charged at its whole
// output limit, on the limits and in the ledger, with a memory store and
// with Redis.
func TestExpiryAtkOutputReservedInPart(t *testing.T) {
	const body = `{"model":"gpt-4o-mini","max_tokens":1000,"messages":[{"role":"user","content":"write at length"}]}`
	const limits = `
costs: {output_reserve: 10}
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000, period: 24h}`
	stores := []struct{ name, extra string }{
		{"memory", ""},
		{"redis", fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}", redistest.New(t).URL)},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			g := openAcmeWith(t, st.extra+limits, Options{expireEvery: -1})
			ctx := context.Background()
			c := g.Identify("cg-acme")
			est, err := g.Estimator().Estimate(costmodel.ChatCompletions, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if est.OutputCap != 1000 || est.Usage.OutputTokens >= est.OutputCap {
				t.Fatalf("the estimate reserves %d of %d output tokens; the attack needs a part", est.Usage.OutputTokens, est.OutputCap)
			}
			full := est.Usage
			full.OutputTokens = est.OutputCap
			want := g.Estimator().Cost(est.Model, full)
			res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/v1/costgate/reserve", Estimate: est, Requests: 1, Open: true})
			if res == nil {
				t.Fatalf("refused: %+v", d)
			}
			if d, ok := res.Record(ctx); !ok {
				t.Fatal(d)
			}
			_, exp := res.Hold(time.Minute)
			g.expireHolds(exp.Add(time.Second))
			if err := g.ledger.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			e, ok, err := g.ledger.Lookup(ctx, res.ID())
			if err != nil || !ok || e.Status != ledger.StatusExpired {
				t.Fatalf("the expired reservation's entry: %+v %v %v", e, ok, err)
			}
			if e.Actual.OutputTokens != est.OutputCap || e.ActualCost != want {
				t.Errorf("expired: charged %d output tokens, %v; want its output limit, %d tokens, %v (reserved: %d, %v)",
					e.Actual.OutputTokens, e.ActualCost, est.OutputCap, want, est.Usage.OutputTokens, est.Cost)
			}
			probe, d := g.Reserve(ctx, &Request{Caller: c, Route: "/x", States: true, Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
			if probe != nil {
				probe.Cancel(ctx)
			}
			if used := full.InputTokens + full.OutputTokens; len(d.Limits) != 1 || d.Limits[0].Remaining != 1000000-used-1 {
				t.Errorf("tpm %+v; want %d tokens used, the prompt and the output limit", d.Limits, used)
			}
		})
	}
}
