package costmodel_test

import (
	"fmt"
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
