package telemetry

// Top throttled keys are counted with Space-Saving (Metwally, Agrawal and
// El Abbadi, 2005). A summary keeps at most k counters. A key already counted
// is incremented; a new key takes a free counter, or, when all k are in use,
// replaces the key with the smallest count c and starts at c+1, remembering c
// as its possible overcount. So each counter's count is an upper bound on its
// key's true count and count-err a lower bound; err is at most the smallest
// count, which is at most N/k for N events in the summary. Every key whose
// true count exceeds N/k is guaranteed to hold a counter.
//
// Counts age by tumbling windows: two summaries, the current window and the
// previous one. When a window ends the current summary becomes the previous
// one and a fresh summary starts (both are emptied if more than a window went
// by with no event). A query merges the two: for each key, the upper bound is
// the sum of its per-summary upper bounds (a key missing from a full summary
// may have had up to that summary's smallest count; a key missing from a
// summary that never filled was never seen in it), and the lower bound is
// the sum of the lower bounds. The result covers the last one to two windows,
// and the error of any reported count is at most N/k for the N events in
// those windows.

import (
	"container/heap"
	"sort"
	"strings"
	"sync"
	"time"
)

// Throttled is one key in the top-throttled report: a limit key whose
// requests its limit refused (Decision outcome "hard").
type Throttled struct {
	Key    string `json:"key"`    // the limit key, as the limiter built it
	Limit  string `json:"limit"`  // the limit's name
	Tenant string `json:"tenant"` // the tenant of the last throttled request on this key
	// Count is an upper bound on the number of throttled decisions for the key
	// in the report's window; the true count is in [Count-MaxError, Count].
	Count    int64 `json:"count"`
	MaxError int64 `json:"max_error"`
}

type topKey struct{ limit, key string }

type topCounter struct {
	k      topKey
	tenant string
	count  int64
	err    int64
	idx    int // position in the heap
}

// spaceSaving is one Space-Saving summary: a min-heap of counters by count
// and an index from key to counter. It is not safe for concurrent use.
type spaceSaving struct {
	cap   int
	heap  counterHeap
	index map[topKey]*topCounter
}

func newSpaceSaving(capacity int) *spaceSaving {
	return &spaceSaving{cap: capacity, index: make(map[topKey]*topCounter, capacity)}
}

func (s *spaceSaving) add(k topKey, tenant string) {
	if c, ok := s.index[k]; ok {
		c.count++
		if c.tenant != tenant {
			c.tenant = strings.Clone(tenant)
		}
		heap.Fix(&s.heap, c.idx)
		return
	}
	k = topKey{k.limit, strings.Clone(k.key)} // limit is already interned
	if len(s.heap) < s.cap {
		c := &topCounter{k: k, tenant: strings.Clone(tenant), count: 1}
		heap.Push(&s.heap, c)
		s.index[k] = c
		return
	}
	c := s.heap[0]
	delete(s.index, c.k)
	c.k, c.tenant = k, strings.Clone(tenant)
	c.err = c.count
	c.count++
	s.index[k] = c
	heap.Fix(&s.heap, 0)
}

// full reports whether every counter is in use, which is when a key missing
// from the summary may still have occurred (up to min times).
func (s *spaceSaving) full() bool { return len(s.heap) >= s.cap }

func (s *spaceSaving) min() int64 {
	if len(s.heap) == 0 {
		return 0
	}
	return s.heap[0].count
}

func (s *spaceSaving) reset() {
	s.heap = s.heap[:0]
	clear(s.index)
}

type counterHeap []*topCounter

func (h counterHeap) Len() int           { return len(h) }
func (h counterHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h counterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *counterHeap) Push(x any) {
	c := x.(*topCounter)
	c.idx = len(*h)
	*h = append(*h, c)
}
func (h *counterHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// topK is the windowed pair of summaries. It is safe for concurrent use.
type topK struct {
	window time.Duration
	mu     sync.Mutex
	start  time.Time // start of the current window
	cur    *spaceSaving
	prev   *spaceSaving
}

func newTopK(capacity int, window time.Duration) *topK {
	return &topK{window: window, cur: newSpaceSaving(capacity), prev: newSpaceSaving(capacity)}
}

// rotate moves the windows forward to now. Called with mu held.
func (t *topK) rotate(now time.Time) {
	if t.start.IsZero() {
		t.start = now.Truncate(t.window)
		return
	}
	elapsed := now.Sub(t.start)
	switch {
	case elapsed < t.window:
		return
	case elapsed < 2*t.window:
		t.prev, t.cur = t.cur, t.prev
		t.cur.reset()
	default:
		t.prev.reset()
		t.cur.reset()
	}
	t.start = now.Truncate(t.window)
}

// MaxKeyLen is the length at which top-throttled keys are cut, to bound the
// summary's memory whatever the limit keys hold.
const MaxKeyLen = 256

// add counts one throttled decision. limit must be an interned label value
// (it is kept without copying); key and tenant are copied when kept.
func (t *topK) add(now time.Time, limit, key, tenant string) {
	if len(key) > MaxKeyLen {
		key = key[:MaxKeyLen]
	}
	t.mu.Lock()
	t.rotate(now)
	t.cur.add(topKey{limit, key}, tenant)
	t.mu.Unlock()
}

// top returns up to n keys by descending count (ties by limit, then key).
func (t *topK) top(now time.Time, n int) []Throttled {
	if n <= 0 {
		return []Throttled{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	type bounds struct {
		tenant string
		hi, lo int64
		inCur  bool
		inPrev bool
	}
	merged := make(map[topKey]*bounds, len(t.cur.heap)+len(t.prev.heap))
	for _, c := range t.prev.heap {
		merged[c.k] = &bounds{tenant: c.tenant, hi: c.count, lo: c.count - c.err, inPrev: true}
	}
	for _, c := range t.cur.heap {
		b, ok := merged[c.k]
		if !ok {
			b = &bounds{}
			merged[c.k] = b
		}
		b.tenant = c.tenant
		b.hi += c.count
		b.lo += c.count - c.err
		b.inCur = true
	}
	out := make([]Throttled, 0, len(merged))
	for k, b := range merged {
		if !b.inPrev && t.prev.full() {
			b.hi += t.prev.min()
		}
		if !b.inCur && t.cur.full() {
			b.hi += t.cur.min()
		}
		out = append(out, Throttled{Key: k.key, Limit: k.limit, Tenant: b.tenant, Count: b.hi, MaxError: b.hi - b.lo})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		if out[i].Limit != out[j].Limit {
			return out[i].Limit < out[j].Limit
		}
		return out[i].Key < out[j].Key
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
