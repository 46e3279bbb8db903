package policies

import (
	"math/rand/v2"
)

var (
	randPlans   = []string{"free", "pro", "enterprise", "gold", ""}
	randModels  = []string{"gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-nano", "gpt-4.1-mini", "o3", "claude-sonnet-4-5", "claude-3-5-haiku-20241022", "claude-opus-4-1", "GPT-4O", " o3 ", "Gpt-4.1 ", ""}
	randRoutes  = []string{"chat", "search", "embeddings", "web"}
	randUps     = []string{"openai", "anthropic", "search", "brave"}
	randScopes  = []string{"tenant", "user", "key"}
	randPeriods = []string{"day", "month"}
	randLimits  = []string{"per_ip", "tpm", "rpm", "usd_day"}
	randUnits   = []string{"tokens", "requests", "usd", "input_tokens"}
)

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

// randInt returns mostly small values, sometimes boundary and huge ones, so
// that thresholds, overflow and negative numbers are all reached.
func randInt(r *rand.Rand, scale int64) int64 {
	switch r.IntN(12) {
	case 0:
		return 0
	case 1:
		return -r.Int64N(scale + 1)
	case 2:
		return 1<<62 + r.Int64N(1<<61)
	case 3:
		return 92233720368547758 + r.Int64N(100) // *100 overflows int64
	default:
		return r.Int64N(scale + 1)
	}
}

// randomInput returns an input that hits every branch of the example
// policies with useful probability.
func randomInput(r *rand.Rand) *Input {
	in := &Input{
		Caller: Caller{
			Tenant: pick(r, []string{"acme", "globex", ""}),
			User:   pick(r, []string{"u1", "u2", ""}),
			KeyID:  "k" + string(rune('0'+r.IntN(10))),
			Plan:   pick(r, randPlans),
			IP:     pick(r, []string{"198.51.100.7", "203.0.113.9", "10.1.2.3", "2001:db8::1", "::ffff:10.0.0.1", "198.51.100.0/25", "not-an-ip", ""}),
			Region: pick(r, []string{"eu", "us", ""}),
		},
		Request: Request{
			Route:           pick(r, randRoutes),
			Upstream:        pick(r, randUps),
			Model:           pick(r, randModels),
			Stream:          r.IntN(2) == 0,
			MaxOutputTokens: pick(r, []int64{0, 256, 1024, 1025, 4096, 8192, 9000, 40000}),
			Page:            pick(r, []int64{0, 1, 5, 6, 7, 24, 25, 26, 99, 100, 101, 5000}),
		},
		Estimate: Estimate{
			InputTokens:    randInt(r, 5000),
			OutputTokens:   randInt(r, 5000),
			CostNanoUSD:    randInt(r, 50_000_000),
			OutputBasis:    pick(r, []string{"learned", "limit", ""}),
			OutputQuantile: pick(r, []string{"", "p95", "p99", "p50"}),
			OutputSamples:  pick(r, []int64{0, 1, 99, 100, 101, 5000}),
		},
		Time: Time{Unix: 1764500000 + r.Int64N(86400*30), Hour: r.IntN(24), Weekday: r.IntN(7)},
	}
	for range r.IntN(4) {
		limit := randInt(r, 100_000)
		in.Limits = append(in.Limits, Limit{
			Name:         pick(r, randLimits),
			Unit:         pick(r, randUnits),
			Limit:        limit,
			Remaining:    r.Int64N(max(limit, 1)+1) - r.Int64N(2),
			ResetSeconds: r.Int64N(3600),
		})
	}
	for range r.IntN(4) {
		budget := randInt(r, 100_000_000_000)
		spent := budget * int64(r.IntN(120)) / 100
		if r.IntN(5) == 0 {
			spent = randInt(r, 100_000_000_000)
		}
		in.Spend = append(in.Spend, Spend{
			Scope:         pick(r, randScopes),
			Period:        pick(r, randPeriods),
			SpentNanoUSD:  spent,
			BudgetNanoUSD: budget,
		})
	}
	return in
}
