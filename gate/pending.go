package gate

import (
	"context"
	"slices"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/weighted"
)

// pendingSettle is a settlement the store failed, or, with unreserved,
// the spend of a request admitted on the local fallback, which the store
// never debited.
type pendingSettle struct {
	id         string
	items      []weighted.Item
	actual     []int64
	unreserved bool
	// debit is a reservation's settlement: lossSeq is where the store's
	// log of restores stood when it was debited (see losses), and a
	// refund on a tag restored since is not made (see refundsKept).
	debit   bool
	lossSeq uint32
}

// maxPending bounds the settlements kept to be made again, counted once
// per hash tag they touch; past it the oldest of the hash tag that holds
// the most is dropped (see queues; its budgets still catch up from the
// ledger).
const maxPending = 1 << 16

// unsettled keeps a settlement the store failed, to be made again before
// the store's next call on its tenants.
func (g *Gate) unsettled(id string, items []weighted.Item, actual []int64) {
	g.unsettledAs(pendingSettle{id: id, items: slices.Clone(items), actual: slices.Clone(actual)})
}

// unsettledAs keeps p, which owns its slices (see unsettled).
func (g *Gate) unsettledAs(p pendingSettle) {
	items := p.items
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

// spentOnFallback keeps what a request admitted on the local fallback
// spent (actual, on items as the store has them), to be added to the
// store's counters when it is back, before its next call on the request's
// tenants (see freshStore.catchUp). The catch-up's restore from the
// ledger alone raises a counter to what this replica knows: with the
// ledger's database out too, that leaves out every other replica's
// fallback admissions, and the replicas together admitted again what
// their fallbacks had spent. Each replica adding its own counts each
// admission once. A limit of concurrency holds nothing once settled, so
// it has nothing to add. The spend is kept per hash tag, each added
// apart: a tag's catch-up replays its own queue, and one spend kept in
// two queues would be added twice.
func (g *Gate) spentOnFallback(id string, items []weighted.Item, actual []int64) {
	done := make([]bool, len(items))
	for i := range items {
		if done[i] {
			continue
		}
		tag := weighted.HashTag(items[i].Key)
		var kept []weighted.Item
		var costs []int64
		for j := i; j < len(items); j++ {
			if done[j] || weighted.HashTag(items[j].Key) != tag {
				continue
			}
			done[j] = true
			if actual[j] > 0 && items[j].Limit.Algorithm != weighted.Concurrency {
				kept, costs = append(kept, items[j]), append(costs, actual[j])
			}
		}
		if len(kept) > 0 {
			g.unsettledAs(pendingSettle{id: id + "/fallback", items: kept, actual: costs, unreserved: true})
		}
	}
}

// replay makes a kept settlement on the store. Spend of the fallback
// (unreserved) is a debit of one unit of each limit, then its settlement
// at the actual costs, under an id of its own: the store owes it as it
// owes any settlement above its estimate. The debit writes, so that a
// store that refuses writes fails it (a debit of nothing would pass there
// and close the breaker, starting a new outage, and a new fallback burst,
// with each catch-up). A debit refused (a counter full) adds nothing.
func (f *freshStore) replay(ctx context.Context, p pendingSettle) error {
	if !p.unreserved {
		actual := p.actual
		if p.debit {
			actual = refundsKept(&f.g.store.lost, p.lossSeq, p.items, nil, slices.Clone(actual))
		}
		return f.store.Settle(ctx, p.id, p.items, actual)
	}
	one := slices.Clone(p.items)
	for i := range one {
		one[i].Cost = 1
	}
	res, err := f.store.Debit(ctx, p.id, one)
	if err != nil || !res.Allowed {
		return err
	}
	return f.store.Settle(ctx, p.id, one, p.actual)
}

// mergeSpent folds the fallback spend of ps (unreserved) on the same
// limits and keys into one, its actual costs summed (saturating), in the
// place of the first: spend is added, so a thousand admissions of an
// outage are one replay, two store calls, not two thousand, while the
// tenant's requests wait for the catch-up. Settlements the store failed
// stay as they are.
func mergeSpent(ps []pendingSettle) []pendingSettle {
	out := ps[:0]
	first := map[string]int{} // an items' identity: its index in out
	var key []byte
	for _, p := range ps {
		if !p.unreserved {
			out = append(out, p)
			continue
		}
		key = key[:0]
		for _, it := range p.items {
			key = append(append(append(key, it.Limit.Name...), 0), it.Key...)
			key = append(key, 0)
		}
		i, ok := first[string(key)]
		if !ok {
			first[string(key)] = len(out)
			out = append(out, p)
			continue
		}
		for j, c := range p.actual {
			out[i].actual[j] = costmodel.AddSat(out[i].actual[j], c)
		}
	}
	return out
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
