package gate

// Tables shared by every tenant (the settlements the store failed, the
// in-memory records of upstream objects) keep their entries in one queue
// per tenant, oldest first. When such a table is full, the oldest entry
// of its longest queue goes: a tenant that fills it evicts its own
// entries, never the fewer of another.

import "container/heap"

// queues keeps values in one queue per key, oldest first, at most max
// values in all: past it the oldest value of the longest queue is
// dropped. It is not safe for concurrent use.
type queues[T any] struct {
	max   int
	byKey map[string]*queue[T]
	most  longest[T] // the queues, longest first (a heap)
	n     int        // values kept, over all the queues
	// dropped, when set, is told of every value dropped to stay within
	// max (not of those take returns).
	dropped func(key string, v T)
}

// queue is one key's values, oldest first.
type queue[T any] struct {
	key string
	vs  []T
	at  int // index in queues.most
}

func newQueues[T any](max int) *queues[T] {
	return &queues[T]{max: max, byKey: map[string]*queue[T]{}}
}

// add appends v to key's queue, then drops the oldest value of the
// longest queue while there are more than max.
func (t *queues[T]) add(key string, v T) {
	q := t.byKey[key]
	if q == nil {
		q = &queue[T]{key: key}
		t.byKey[key] = q
		heap.Push(&t.most, q)
	}
	q.vs = append(q.vs, v)
	t.n++
	heap.Fix(&t.most, q.at)
	for t.n > t.max {
		t.dropOldest(t.most[0])
	}
}

func (t *queues[T]) dropOldest(q *queue[T]) {
	v := q.vs[0]
	var zero T
	q.vs[0] = zero
	q.vs = q.vs[1:]
	t.n--
	if len(q.vs) == 0 {
		heap.Remove(&t.most, q.at)
		delete(t.byKey, q.key)
	} else {
		heap.Fix(&t.most, q.at)
	}
	if t.dropped != nil {
		t.dropped(q.key, v)
	}
}

// take removes and returns key's values, oldest first.
func (t *queues[T]) take(key string) []T {
	q := t.byKey[key]
	if q == nil {
		return nil
	}
	heap.Remove(&t.most, q.at)
	delete(t.byKey, key)
	t.n -= len(q.vs)
	return q.vs
}

// longest is a max-heap of queues by length (container/heap).
type longest[T any] []*queue[T]

func (h longest[T]) Len() int           { return len(h) }
func (h longest[T]) Less(i, j int) bool { return len(h[i].vs) > len(h[j].vs) }
func (h longest[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}

func (h *longest[T]) Push(x any) {
	q := x.(*queue[T])
	q.at = len(*h)
	*h = append(*h, q)
}

func (h *longest[T]) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return q
}
