// Package sketch is a bounded, mergeable quantile sketch of non-negative
// integers (token counts) with a relative error bound, after DDSketch
// (Masson, Rim and Lee, VLDB 2019).
//
// The idea: values are counted in buckets whose bounds grow geometrically,
// bucket i holding the values v with γ^(i-1) < v ≤ γ^i, where
// γ = (1+α)/(1-α). Any value of bucket i is within a relative distance α of
// the bucket's representative 2γ^i/(γ+1), so a quantile read from the
// bucket counts is within α of the exact one, however the values are
// distributed. Two sketches merge exactly by adding their counts, in any
// order and from any number of replicas, which is what lets costgate merge
// them through Redis with HINCRBY.
//
// With α = 1% and values clamped to 0..MaxValue there are at most
// MaxIndex+2 = 1,042 buckets (the zero bucket and 0..MaxIndex): a Sketch
// never holds more than 8,336 bytes of counts, and one of output lengths
// that span two orders of magnitude holds ⌈ln 100 / ln γ⌉ = 231 buckets.
package sketch

import (
	"errors"
	"fmt"
	"math"
)

// RelativeError is α: for the exact q-quantile x of the values added (the
// smallest value at least ⌈q·n⌉ of the n values are at most), Quantile
// returns a value within ⌈α·x⌉ of x.
const RelativeError = 0.01

// MaxValue is the largest value a Sketch tells apart: larger values are
// counted as MaxValue.
const MaxValue = 1 << 30

// ZeroBucket is the index of the bucket of the value 0.
const ZeroBucket = -1

var (
	gamma    = (1 + RelativeError) / (1 - RelativeError)
	logGamma = math.Log(gamma)
	// MaxIndex is the index of the bucket of MaxValue, the highest.
	MaxIndex = Index(MaxValue)
)

// Index is the bucket of value v, clamped to 0..MaxValue: ZeroBucket for
// 0, else ⌈log_γ v⌉.
func Index(v int64) int {
	switch {
	case v <= 0:
		return ZeroBucket
	case v > MaxValue:
		v = MaxValue
	}
	return int(math.Ceil(math.Log(float64(v)) / logGamma))
}

// Value is the representative value of bucket i, 2γ^i/(γ+1), within α of
// every value the bucket holds; 0 for ZeroBucket.
func Value(i int) float64 {
	if i <= ZeroBucket {
		return 0
	}
	return 2 * math.Pow(gamma, float64(i)) / (gamma + 1)
}

// ErrBucket is the error of a bucket index or count that no Sketch holds.
var ErrBucket = errors.New("sketch: bucket out of range")

// Sketch counts values in buckets. The zero value is an empty sketch ready
// to use. A Sketch is not safe for concurrent use.
type Sketch struct {
	zero   uint64
	offset int      // the index of counts[0]
	counts []uint64 // dense from offset, len ≤ MaxIndex+1
	n      uint64
}

// Add counts v once: a negative v as 0, one above MaxValue as MaxValue.
func (s *Sketch) Add(v int64) { s.add(Index(v), 1) }

// AddBucket adds n to bucket i (ZeroBucket or 0..MaxIndex), as a merge
// from a stored sketch does; an index out of range is ErrBucket and
// changes nothing. Counts saturate at the largest uint64.
func (s *Sketch) AddBucket(i int, n uint64) error {
	if i < ZeroBucket || i > MaxIndex {
		return fmt.Errorf("%w: index %d not in %d..%d", ErrBucket, i, ZeroBucket, MaxIndex)
	}
	s.add(i, n)
	return nil
}

func (s *Sketch) add(i int, n uint64) {
	if n == 0 {
		return
	}
	s.n = addSat(s.n, n)
	if i == ZeroBucket {
		s.zero = addSat(s.zero, n)
		return
	}
	switch {
	case len(s.counts) == 0:
		s.offset = i
		s.counts = append(s.counts[:0], 0)
	case i < s.offset:
		grown := make([]uint64, len(s.counts)+s.offset-i, cap(s.counts)+s.offset-i)
		copy(grown[s.offset-i:], s.counts)
		s.counts, s.offset = grown, i
	case i >= s.offset+len(s.counts):
		s.counts = append(s.counts, make([]uint64, i-s.offset-len(s.counts)+1)...)
	}
	s.counts[i-s.offset] = addSat(s.counts[i-s.offset], n)
}

// Merge adds o's counts to s.
func (s *Sketch) Merge(o *Sketch) {
	s.add(ZeroBucket, o.zero)
	for j, c := range o.counts {
		s.add(o.offset+j, c)
	}
}

// Clone returns a copy of s that shares nothing with it.
func (s *Sketch) Clone() *Sketch {
	c := *s
	c.counts = append([]uint64(nil), s.counts...)
	return &c
}

// Reset empties s, keeping its storage.
func (s *Sketch) Reset() {
	s.zero, s.n, s.offset = 0, 0, 0
	s.counts = s.counts[:0]
}

// Count is the number of values added.
func (s *Sketch) Count() uint64 { return s.n }

// Each calls f with every non-empty bucket, the zero bucket first, then
// in increasing order of index.
func (s *Sketch) Each(f func(i int, n uint64)) {
	if s.zero > 0 {
		f(ZeroBucket, s.zero)
	}
	for j, c := range s.counts {
		if c > 0 {
			f(s.offset+j, c)
		}
	}
}

// Quantile returns the q-quantile (0 < q ≤ 1) of the values added, rounded
// up to an integer, within ⌈RelativeError·x⌉ of the exact quantile x; 0
// for an empty sketch. A q outside (0, 1] is clamped into it.
func (s *Sketch) Quantile(q float64) int64 {
	if s.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(s.n)))
	rank = max(min(rank, s.n), 1)
	if rank > s.n/2 {
		// A high quantile is nearer the top: count down the n-rank
		// values above it.
		above := s.n - rank
		var seen uint64
		for j := len(s.counts) - 1; j >= 0; j-- {
			seen = addSat(seen, s.counts[j])
			if seen > above {
				return int64(math.Ceil(Value(s.offset + j)))
			}
		}
		return 0
	}
	seen := s.zero
	if seen >= rank {
		return 0
	}
	for j, c := range s.counts {
		seen = addSat(seen, c)
		if seen >= rank {
			return int64(math.Ceil(Value(s.offset + j)))
		}
	}
	return int64(math.Ceil(Value(s.offset + len(s.counts) - 1)))
}

func addSat(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}
