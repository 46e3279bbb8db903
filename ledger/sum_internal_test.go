package ledger

import (
	"math"
	"testing"
)

// TestJoinHalves: joining the sums of the high and low 32-bit halves of
// values gives their exact sum while it fits an int64, and its bound
// otherwise.
func TestJoinHalves(t *testing.T) {
	halves := func(vs ...int64) (hi, lo int64) {
		for _, v := range vs {
			hi += v >> 32
			lo += v & 0xFFFFFFFF
		}
		return hi, lo
	}
	for name, c := range map[string]struct {
		vs   []int64
		want int64
	}{
		"none":        {nil, 0},
		"small":       {[]int64{1, 2, 3}, 6},
		"one max":     {[]int64{math.MaxInt64}, math.MaxInt64},
		"max and 0":   {[]int64{math.MaxInt64, 0}, math.MaxInt64},
		"max and 1":   {[]int64{math.MaxInt64, 1}, math.MaxInt64},
		"two max":     {[]int64{math.MaxInt64, math.MaxInt64}, math.MaxInt64},
		"max cost":    {[]int64{int64(MaxCost), int64(MaxCost), 5_000}, 2*int64(MaxCost) + 5_000},
		"negative":    {[]int64{-5, 3}, -2},
		"max minus":   {[]int64{math.MaxInt64, -math.MaxInt64}, 0},
		"two min":     {[]int64{math.MinInt64, math.MinInt64}, math.MinInt64},
		"low carries": {[]int64{0xFFFFFFFF, 0xFFFFFFFF, 2}, 2 * 0x100000000},
	} {
		if got := joinHalves(halves(c.vs...)); got != c.want {
			t.Errorf("%s: %d, want %d", name, got, c.want)
		}
	}
}
