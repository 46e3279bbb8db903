package main

import (
	"math/bits"
	"time"
)

// A histogram counts latencies in log-linear buckets: values below 16 ns
// have a bucket each; above, every power of two is split in 16 buckets, so a
// bucket's upper bound is within 1/16 (6.25%) of any value in it. It has no
// allocation after its creation and is not safe for concurrent use: each
// load worker keeps its own and they are merged at the end.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	max    time.Duration
}

const (
	histSub     = 16 // buckets per power of two
	histBuckets = 64 * histSub
)

// histIndex is the bucket of d (negative durations count as 0).
func histIndex(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < histSub {
		return int(v)
	}
	e := bits.Len64(v) - 5 // v>>e is in [16, 32)
	return (e+1)*histSub + int(v>>e) - histSub
}

// histUpper is the largest duration in bucket i.
func histUpper(i int) time.Duration {
	if i < histSub {
		return time.Duration(i)
	}
	e := i/histSub - 1
	m := uint64(i%histSub + histSub)
	return time.Duration((m+1)<<e - 1)
}

func (h *histogram) record(d time.Duration) {
	h.counts[histIndex(d)]++
	h.n++
	if d > h.max {
		h.max = d
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile is the upper bound of the bucket holding the q-th quantile
// (0 < q <= 1), never more than the largest value recorded; 0 when empty.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(histUpper(i), h.max)
		}
	}
	return h.max
}
