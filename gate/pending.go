package gate

import (
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
// the most is dropped (see queues; its budgets still catch up from the
// ledger).
const maxPending = 1 << 16

// unsettled keeps a settlement the store failed, to be made again before
// the store's next call on its tenants.
func (g *Gate) unsettled(id string, items []weighted.Item, actual []int64) {
	p := pendingSettle{id: id, items: slices.Clone(items), actual: slices.Clone(actual)}
	g.pendingMu.Lock()
	if g.pending == nil {
		g.pending = newQueues[pendingSettle](maxPending)
	}
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

// takePending removes and returns the settlements kept for tag, oldest
// first.
func (g *Gate) takePending(tag string) []pendingSettle {
	g.pendingMu.Lock()
	defer g.pendingMu.Unlock()
	if g.pending == nil {
		return nil
	}
	return g.pending.take(tag)
}
