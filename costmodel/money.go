package costmodel

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// NanoUSD is an amount of money in billionths of a US dollar. Money in
// costgate is always an integer: prices, estimates, ledger entries and budgets
// are NanoUSD, never floats. An int64 holds about ±9.2 billion dollars.
type NanoUSD int64

// Dollar is one US dollar.
const Dollar NanoUSD = 1_000_000_000

// String formats n as dollars with nine decimals, for example "$0.000123000".
func (n NanoUSD) String() string {
	var buf [32]byte
	return string(n.AppendUSD(buf[:0]))
}

// AppendUSD appends n.String() to b, without allocating.
func (n NanoUSD) AppendUSD(b []byte) []byte {
	u := uint64(n)
	if n < 0 {
		b = append(b, '-')
		u = uint64(-n) // correct for MinInt64 too, as uint64 arithmetic wraps
	}
	b = strconv.AppendUint(append(b, '$'), u/uint64(Dollar), 10)
	frac := u % uint64(Dollar)
	var d [10]byte
	d[0] = '.'
	for i := 9; i > 0; i-- {
		d[i] = byte('0' + frac%10)
		frac /= 10
	}
	return append(b, d[:]...)
}

// ErrBadAmount reports a money amount that ParseUSD cannot read exactly.
var ErrBadAmount = errors.New("costmodel: bad dollar amount")

// ParseUSD reads a decimal dollar amount such as "2.50", "$0.15" or
// "0.000000075" exactly. More than nine decimals, or an amount that does not
// fit in NanoUSD, is an error: money is never rounded silently.
func ParseUSD(s string) (NanoUSD, error) {
	orig := s
	s = strings.TrimSpace(s)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	s = strings.TrimPrefix(s, "$")
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" {
		return 0, fmt.Errorf("%w: %q", ErrBadAmount, orig)
	}
	if len(frac) > 9 {
		return 0, fmt.Errorf("%w: %q has more than nine decimals", ErrBadAmount, orig)
	}
	var w, f uint64
	var err error
	if whole != "" {
		if w, err = strconv.ParseUint(whole, 10, 64); err != nil {
			return 0, fmt.Errorf("%w: %q", ErrBadAmount, orig)
		}
	}
	if frac != "" {
		if f, err = strconv.ParseUint(frac+strings.Repeat("0", 9-len(frac)), 10, 64); err != nil {
			return 0, fmt.Errorf("%w: %q", ErrBadAmount, orig)
		}
	}
	if w > uint64(math.MaxInt64/int64(Dollar))-1 {
		return 0, fmt.Errorf("%w: %q is too large", ErrBadAmount, orig)
	}
	n := NanoUSD(w)*Dollar + NanoUSD(f)
	if neg {
		n = -n
	}
	return n, nil
}

// UnmarshalYAML reads an amount written in dollars, as a YAML string or
// number ("2.50", 0.15, "$0.000075"), exactly; see ParseUSD. Configuration
// files write money in dollars, never in nano-dollars.
func (n *NanoUSD) UnmarshalYAML(value *yaml.Node) error {
	if value.Kind != yaml.ScalarNode {
		return fmt.Errorf("%w: line %d: want a dollar amount", ErrBadAmount, value.Line)
	}
	v, err := ParseUSD(value.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", value.Line, err)
	}
	*n = v
	return nil
}

// mulDivCeil returns ceil(a*b/d) for a, b >= 0 and d > 0, saturating at
// math.MaxInt64 instead of overflowing.
func mulDivCeil(a, b, d int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(d))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// addSat adds non-negative amounts, saturating at math.MaxInt64.
func addSat(a, b int64) int64 { return AddSat(a, b) }

// MulSat multiplies an amount by a count, both not negative, saturating
// at math.MaxInt64; 0 when either is not positive.
func MulSat[T ~int64](a T, n int64) T {
	if a <= 0 || n <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(n))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return T(lo)
}

// AddSat adds amounts that are not negative (costs, units, tokens),
// saturating at math.MaxInt64, which a cost that overflows reads as.
func AddSat[T ~int64](a, b T) T {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}
