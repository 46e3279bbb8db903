package sketch

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// exact is the q-quantile of sorted values as Quantile defines it: the
// smallest value that at least ⌈q·n⌉ values are at most.
func exact(sorted []int64, q float64) int64 {
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = max(min(rank, len(sorted)), 1)
	return sorted[rank-1]
}

func within(got, want int64) bool {
	bound := int64(math.Ceil(RelativeError * float64(want)))
	d := got - want
	return -bound <= d && d <= bound
}

func TestQuantilesWithinStatedError(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name string
		gen  func() int64
	}{
		{"log-normal outputs", func() int64 { return int64(math.Exp(5.5 + 1.0*rng.NormFloat64())) }},
		{"uniform 0..4096", func() int64 { return rng.Int64N(4097) }},
		{"constant", func() int64 { return 256 }},
		{"pareto tail", func() int64 { return int64(10 / math.Pow(1-rng.Float64(), 1/1.2)) }},
		{"mostly zero", func() int64 {
			if rng.IntN(10) < 8 {
				return 0
			}
			return rng.Int64N(100)
		}},
		{"beyond MaxValue", func() int64 { return MaxValue + rng.Int64N(1000) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, n := range []int{1, 7, 100, 10_000} {
				var s Sketch
				vals := make([]int64, n)
				for i := range vals {
					vals[i] = c.gen()
					s.Add(vals[i])
					vals[i] = min(max(vals[i], 0), MaxValue)
				}
				slices.Sort(vals)
				if s.Count() != uint64(n) {
					t.Fatalf("count %d, want %d", s.Count(), n)
				}
				for _, q := range []float64{0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1} {
					got, want := s.Quantile(q), exact(vals, q)
					if !within(got, want) {
						t.Errorf("n=%d q=%v: got %d, exact %d: beyond %v relative error", n, q, got, want, RelativeError)
					}
				}
			}
		})
	}
}

func TestMergeIsTheUnion(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var a, b, all Sketch
	for i := range 5000 {
		v := int64(math.Exp(4 + 1.5*rng.NormFloat64()))
		if i%3 == 0 {
			a.Add(v)
		} else {
			b.Add(v)
		}
		all.Add(v)
	}
	ab, ba := a.Clone(), b.Clone()
	ab.Merge(&b)
	ba.Merge(&a)
	for _, m := range []*Sketch{ab, ba} {
		if m.Count() != all.Count() {
			t.Fatalf("merged count %d, want %d", m.Count(), all.Count())
		}
		type bucket struct {
			i int
			n uint64
		}
		var got, want []bucket
		m.Each(func(i int, n uint64) { got = append(got, bucket{i, n}) })
		all.Each(func(i int, n uint64) { want = append(want, bucket{i, n}) })
		if !slices.Equal(got, want) {
			t.Fatalf("merged buckets differ from the union's")
		}
	}
	if a.Count()+b.Count() != all.Count() {
		t.Fatal("Merge changed its argument")
	}
}

func TestAddBucketRejectsWhatNoSketchHolds(t *testing.T) {
	var s Sketch
	for _, i := range []int{ZeroBucket - 1, MaxIndex + 1, math.MinInt, math.MaxInt} {
		if err := s.AddBucket(i, 1); !errors.Is(err, ErrBucket) {
			t.Errorf("AddBucket(%d): %v, want ErrBucket", i, err)
		}
	}
	if s.Count() != 0 {
		t.Fatalf("rejected buckets counted: %d", s.Count())
	}
	// Counts saturate: a stored count near 2^64 cannot wrap the total.
	if err := s.AddBucket(10, math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	if err := s.AddBucket(ZeroBucket, 5); err != nil {
		t.Fatal(err)
	}
	if s.Count() != math.MaxUint64 {
		t.Fatalf("count %d, want saturated", s.Count())
	}
	if got := s.Quantile(0.99); got != int64(math.Ceil(Value(10))) {
		t.Fatalf("q99 of a saturated sketch: %d", got)
	}
}

func TestBounded(t *testing.T) {
	var s Sketch
	for v := int64(0); v <= MaxValue; v = v*2 + 1 {
		s.Add(v)
		s.Add(-v)
	}
	s.Add(math.MaxInt64)
	s.Add(math.MinInt64)
	if len(s.counts) > MaxIndex+1 {
		t.Fatalf("%d buckets, more than MaxIndex+1 = %d", len(s.counts), MaxIndex+1)
	}
	t.Logf("MaxIndex %d: %d buckets at most", MaxIndex, MaxIndex+2)
	if MaxIndex > 1100 {
		t.Fatalf("MaxIndex %d: more buckets than the package documents", MaxIndex)
	}
	if got := s.Quantile(1); !within(got, MaxValue) {
		t.Fatalf("max %d, want about %d", got, MaxValue)
	}
	if got := s.Quantile(0.0001); got != 0 {
		t.Fatalf("min %d, want 0", got)
	}
	var empty Sketch
	if empty.Quantile(0.95) != 0 {
		t.Fatal("an empty sketch's quantile is not 0")
	}
}

func BenchmarkAdd(b *testing.B) {
	var s Sketch
	vals := make([]int64, 1024)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range vals {
		vals[i] = int64(math.Exp(5.5 + rng.NormFloat64()))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Add(vals[i&1023])
	}
}

func BenchmarkQuantile(b *testing.B) {
	var s Sketch
	rng := rand.New(rand.NewPCG(7, 8))
	for range 100_000 {
		s.Add(int64(math.Exp(5.5 + rng.NormFloat64())))
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Quantile(0.95)
	}
}
