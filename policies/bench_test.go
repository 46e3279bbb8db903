package policies

import (
	"context"
	"math/rand/v2"
	"testing"
)

// benchInputs is a fixed, varied mix of requests: every plan, budgets at
// every threshold, search pages, per-IP limits.
func benchInputs(n int) []*Input {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]*Input, n)
	for i := range out {
		out[i] = randomInput(r)
	}
	return out
}

func BenchmarkDecideRego(b *testing.B) {
	s := mustLoad(b, dirFS("../examples/policies"))
	ins := benchInputs(256)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.decideRego(ctx, ins[i%len(ins)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
