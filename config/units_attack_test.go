package config

import (
	"math"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestUnitsAtkTokensSaturate: a limit in tokens counts a request's input
// and output tokens together, saturating at math.MaxInt64 as costmodel's
// sums do. Before, two counts whose sum passed the bound wrapped to a
// negative cost, which the limiter rejects as no cost at all: the gate
// then took the request to the local fallback, which rejected it too, and
// answered 503 limiter_unavailable (the rate limit service's UNAVAILABLE,
// which Envoy lets through), and a settlement of that usage charged
// nothing. (The proxy refuses such an estimate before the gate.)
func TestUnitsAtkTokensSaturate(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    costmodel.Usage
		want int64
	}{
		{"small", costmodel.Usage{InputTokens: 3, OutputTokens: 4}, 7},
		{"both at the bound", costmodel.Usage{InputTokens: math.MaxInt64, OutputTokens: math.MaxInt64}, math.MaxInt64},
		{"sum past the bound", costmodel.Usage{InputTokens: math.MaxInt64 - 1, OutputTokens: 2}, math.MaxInt64},
	} {
		if got := Units["tokens"](tc.u, 0); got != tc.want {
			t.Errorf("%s: %d tokens, want %d", tc.name, got, tc.want)
		}
	}
}
