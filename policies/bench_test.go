package policies

import (
	"context"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
)

// benchInputs is a fixed, varied mix of realistic requests: every plan,
// budgets at every threshold, search pages, per-IP limits; amounts are below
// 10^12 (a thousand dollars in nano-dollars), so no arithmetic overflows 64
// bits.
func benchInputs(n int) []*Input {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]*Input, n)
	for i := range out {
		out[i] = tame(r, randomInput(r))
	}
	return out
}

func tame(r *rand.Rand, in *Input) *Input {
	fix := func(x *int64) {
		if *x > 1e12 || *x < -1e12 {
			*x = r.Int64N(1_000_000)
		}
	}
	if net.ParseIP(in.Caller.IP) == nil && in.Caller.IP != "" {
		in.Caller.IP = "203.0.113.9" // the proxy sends addresses, not garbage
	}
	fix(&in.Estimate.InputTokens)
	fix(&in.Estimate.OutputTokens)
	fix(&in.Estimate.CostNanoUSD)
	for i := range in.Limits {
		fix(&in.Limits[i].Limit)
		fix(&in.Limits[i].Remaining)
	}
	for i := range in.Spend {
		fix(&in.Spend[i].SpentNanoUSD)
		fix(&in.Spend[i].BudgetNanoUSD)
	}
	return in
}

// latencies collects per-decision times across RunParallel goroutines and
// reports their median and 99th percentile.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(ds []time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, ds...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B) {
	if len(l.all) == 0 {
		return
	}
	slices.Sort(l.all)
	b.ReportMetric(float64(l.all[len(l.all)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(l.all[len(l.all)*99/100].Nanoseconds()), "p99-ns")
}

// runDecisions runs decide on the inputs in parallel, timing each call.
func runDecisions(b *testing.B, ins []*Input, decide func(*Input) error) {
	var lat latencies
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ds := make([]time.Duration, 0, 1024)
		i := 0
		for pb.Next() {
			start := time.Now()
			if err := decide(ins[i%len(ins)]); err != nil {
				b.Error(err)
				return
			}
			ds = append(ds, time.Since(start))
			i++
		}
		lat.add(ds)
	})
	b.StopTimer()
	lat.report(b)
}

// BenchmarkDecide compares, on the example policies and the same inputs:
//   - rego.Eval: the plain way, one prepared query per policy rule,
//     rego.EvalInput with the Input struct;
//   - rego.Eval/ast-input: the same with the input converted to an ast.Value
//     by hand (what Set.Decide falls back to);
//   - Set.Decide: the fast path.
func BenchmarkDecide(b *testing.B) {
	for _, dir := range []string{"../examples/policies", "../examples/quickstart/policies"} {
		s := mustLoad(b, dirFS(dir))
		ins := benchInputs(512)
		ctx := context.Background()
		name := "examples"
		if dir != "../examples/policies" {
			name = "quickstart"
		}
		b.Run(name+"/rego.Eval", func(b *testing.B) {
			runDecisions(b, ins, func(in *Input) error {
				for _, p := range s.policies {
					for _, r := range p.rules {
						rs, err := r.query.Eval(ctx, rego.EvalInput(in))
						if err != nil {
							return err
						}
						if len(rs) > 0 {
							if _, err := decodeVerdict(rs[0].Expressions[0].Value); err != nil {
								return err
							}
						}
					}
				}
				return nil
			})
		})
		b.Run(name+"/rego.Eval-ast-input", func(b *testing.B) {
			runDecisions(b, ins, func(in *Input) error {
				_, err := s.DecideRego(ctx, in)
				return err
			})
		})
		b.Run(name+"/Set.Decide", func(b *testing.B) {
			runDecisions(b, ins, func(in *Input) error {
				_, err := s.Decide(ctx, in)
				return err
			})
		})
	}
}

// TestDecideAllocations holds the fast path to the budget of 100
// allocations per decision for the example policies.
func TestDecideAllocations(t *testing.T) {
	s := mustLoad(t, dirFS("../examples/policies"))
	ins := benchInputs(512)
	ctx := context.Background()
	i := 0
	avg := testing.AllocsPerRun(2048, func() {
		if _, err := s.Decide(ctx, ins[i%len(ins)]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	t.Logf("%.1f allocations per decision", avg)
	if avg > 100 {
		t.Fatalf("%.1f allocations per decision, want at most 100", avg)
	}
}
