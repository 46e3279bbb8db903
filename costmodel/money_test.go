package costmodel_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// FuzzAppendUSD holds AppendUSD, String's text, to the fmt form it
// replaced: "-" for a negative amount, "$", the dollars, nine decimals.
func FuzzAppendUSD(f *testing.F) {
	for _, n := range []int64{0, 1, 999_999_999, 1_000_000_000, 15_000, -1, -1_000_000_001, 1<<63 - 1, -1 << 63} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		sign, u := "", uint64(n)
		if n < 0 {
			sign, u = "-", uint64(-n)
		}
		want := fmt.Sprintf("%s$%d.%09d", sign, u/uint64(costmodel.Dollar), u%uint64(costmodel.Dollar))
		if got := costmodel.NanoUSD(n).String(); got != want {
			t.Errorf("NanoUSD(%d).String() = %q; want %q", n, got, want)
		}
		if got := string(costmodel.NanoUSD(n).AppendUSD([]byte("x"))); got != "x"+want {
			t.Errorf("AppendUSD(%d) = %q; want %q", n, got, "x"+want)
		}
	})
}

// TestMulSat: a product past int64 saturates, on either side of the
// boundary, and an amount or count that is not positive gives 0.
func TestMulSat(t *testing.T) {
	for _, tc := range []struct{ a, n, want int64 }{
		{3, 4, 12},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 / 2, 2, math.MaxInt64 - 1},
		{math.MaxInt64/2 + 1, 2, math.MaxInt64},
		{1 << 32, 1 << 32, math.MaxInt64},
		{0, 5, 0}, {5, 0, 0}, {-5, 3, 0}, {5, -3, 0},
	} {
		if got := costmodel.MulSat(tc.a, tc.n); got != tc.want {
			t.Errorf("MulSat(%d, %d) = %d, want %d", tc.a, tc.n, got, tc.want)
		}
	}
	if got := costmodel.MulSat(costmodel.NanoUSD(7), 3); got != 21 {
		t.Errorf("MulSat of NanoUSD = %d, want 21", got)
	}
}
