package gate

// Settlements the limiter store failed, kept to be made again before the
// store's next call on their tenants (see freshStore.catchUp). The table
// is shared by every tenant and bounded; when it is full, the oldest
// settlement of the tenant (hash tag) that holds the most goes, so that a
// tenant that fills it evicts its own settlements, never the few of
// another.

import (
	"container/heap"
	"slices"

	"github.com/costgate/costgate/weighted"
)

// pendingSettle is a settlement the store failed.
type pendingSettle struct {
	id     string
	items  []weighted.Item
	actual []int64
}

// maxPending bounds the settlements kept to be made again, counted once
// per hash tag they touch; past it the oldest of the hash tag that holds
// the most is dropped (its budgets still catch up from the ledger).
const maxPending = 1 << 16

// pendingTable is the settlements kept, by hash tag, at most maxPending
// in all. Its zero value is empty. It is not safe for concurrent use
// (Gate.pendingMu guards it).
type pendingTable struct {
	byTag map[string]*pendingList
	// most orders the lists by length, longest first (a heap): the one
	// that gives up its oldest settlement when the table is full.
	most pendingHeap
	n    int // settlements kept, over all the lists
}

// pendingList is one hash tag's settlements, oldest first.
type pendingList struct {
	tag string
	ps  []pendingSettle
	at  int // index in pendingTable.most
}

// add keeps p for tag, then drops the oldest settlement of the longest
// list while the table holds more than maxPending.
func (t *pendingTable) add(tag string, p pendingSettle) {
	l := t.byTag[tag]
	if l == nil {
		if t.byTag == nil {
			t.byTag = map[string]*pendingList{}
		}
		l = &pendingList{tag: tag}
		t.byTag[tag] = l
		heap.Push(&t.most, l)
	}
	l.ps = append(l.ps, p)
	t.n++
	heap.Fix(&t.most, l.at)
	for t.n > maxPending {
		top := t.most[0]
		top.ps[0] = pendingSettle{}
		top.ps = top.ps[1:]
		t.n--
		if len(top.ps) == 0 {
			heap.Pop(&t.most)
			delete(t.byTag, top.tag)
		} else {
			heap.Fix(&t.most, 0)
		}
	}
}

// take removes and returns tag's settlements, oldest first.
func (t *pendingTable) take(tag string) []pendingSettle {
	l := t.byTag[tag]
	if l == nil {
		return nil
	}
	heap.Remove(&t.most, l.at)
	delete(t.byTag, tag)
	t.n -= len(l.ps)
	return l.ps
}

// pendingHeap is a max-heap of lists by length (container/heap).
type pendingHeap []*pendingList

func (h pendingHeap) Len() int           { return len(h) }
func (h pendingHeap) Less(i, j int) bool { return len(h[i].ps) > len(h[j].ps) }
func (h pendingHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}
func (h *pendingHeap) Push(x any) {
	l := x.(*pendingList)
	l.at = len(*h)
	*h = append(*h, l)
}
func (h *pendingHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return l
}

// unsettled keeps a settlement the store failed, to be made again before
// the store's next call on its tenants.
func (g *Gate) unsettled(id string, items []weighted.Item, actual []int64) {
	p := pendingSettle{id: id, items: slices.Clone(items), actual: slices.Clone(actual)}
	g.pendingMu.Lock()
	for i, it := range items {
		tag := weighted.HashTag(it.Key)
		if slices.ContainsFunc(items[:i], func(o weighted.Item) bool { return weighted.HashTag(o.Key) == tag }) {
			continue
		}
		g.pending.add(tag, p)
	}
	g.pendingMu.Unlock()
	g.markBehind(items)
}

// takePending removes and returns the settlements kept for tag.
func (g *Gate) takePending(tag string) []pendingSettle {
	g.pendingMu.Lock()
	defer g.pendingMu.Unlock()
	return g.pending.take(tag)
}
