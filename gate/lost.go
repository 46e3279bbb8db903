package gate

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/costgate/costgate/weighted"
)

// A request debited before the store lost its data, and recorded in the
// ledger after the restore that the loss caused, is counted by neither:
// its debit went with the data, and the restore read the ledger without
// its entry (a policy's friction delay holds a request between the two
// for up to 30 s). So a freshStore logs the tags it restores after a
// loss (losses), a reservation notes where the log stood when its debit
// came back (Reservation.lossSeq), and Record, once the entry is in the
// ledger, charges the reservation's items of a tag restored since then
// again (rechargeLost). A restore that read the ledger after the entry
// was written counted it too: the request is then counted twice, which
// refuses early, never late. A stale answer to a call sent before a
// restore of its tag began, or while one ran, does not restore the tag
// again (see freshStore.restored, losses.mark), so a request debited
// after the loss's restore is not charged twice by a second, needless
// one.
//
// The other replicas on the same store and ledger hold requests so too.
// A restore after a loss asks them to flush their records before it reads
// the ledger (Gate.syncPeers), and the request names the tags it
// restores: each of them logs those tags as restored (peerRestored)
// before it flushes, so that its reservations debited before and
// recorded after are charged again as its own restore's are. Its stale
// answers to calls sent before then do not restore the tags again
// either. A request whose notes did not fit names none: every tag is
// then taken for restored (anyTag), which charges a replica's requests
// held at that moment twice, early, never late.

// anyTag, logged as a restore's tag, stands for every tag.
const anyTag = "\x00any"

// lossRing is how many restores a losses keeps: a reservation older than
// them takes every tag for restored.
const lossRing = 1024

// losses logs the tags a freshStore restored after it found them stale,
// each with a sequence number. It is safe for concurrent use; its zero
// value is empty.
type losses struct {
	seq     atomic.Uint32 // restores noted, modulo 2^32; read without the lock
	open    atomic.Int32  // the restores begun and not yet ended
	mu      sync.Mutex
	ring    [lossRing]string // the tag of restore n at n % lossRing
	running []uint32         // the numbers of the restores begun and not yet ended
}

// note logs a restore of tag. It is called before the restore reads the
// ledger, so that a reservation whose entry that read may have missed
// sees the restore once its entry is written.
func (l *losses) note(tag string) {
	l.mu.Lock()
	l.noteLocked(tag)
	l.mu.Unlock()
}

func (l *losses) noteLocked(tag string) uint32 {
	n := l.seq.Load() + 1
	l.ring[n%lossRing] = tag
	l.seq.Store(n)
	return n
}

// begin notes this replica's restore of tag (see note), running until
// end(n).
func (l *losses) begin(tag string) (n uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open.Add(1) // before the number: a mark that reads it sees the restore running
	n = l.noteLocked(tag)
	l.running = append(l.running, n)
	return n
}

// end ends restore n, which begin numbered.
func (l *losses) end(n uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.running, n); i >= 0 {
		l.running = slices.Delete(l.running, i, i+1)
	}
	l.open.Add(-1)
}

// mark is where the log stands for a call about to be sent: the restore
// before the first of this replica's restores still running, or the
// last. A call sent while a restore of its tag runs may reach the store
// before the restore writes its marker, and come back stale after the
// restore ended: its stale answer is the restore's loss, which must not
// restore the tag again (restoredSince(mark, tag) is true). Before, such
// a call, numbered after the running restore, restored the tag a second
// time, and each request debited between the two restores and recorded
// in the ledger after the second was charged twice (rechargeLost): with
// 200 racers on a limit of 50 a day, a fresh Redis admitted 49.
func (l *losses) mark() uint32 {
	n := l.seq.Load()
	if l.open.Load() == 0 {
		// Every restore running when n was read has ended since, its
		// marker written before this call is sent.
		return n
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n = l.seq.Load()
	if len(l.running) == 0 {
		return n
	}
	first := l.running[0]
	for _, r := range l.running[1:] {
		if n-r > n-first { // the oldest, modulo 2^32
			first = r
		}
	}
	return first - 1
}

// restoredSince tells whether tag was restored after restore seq: true
// too when it may have been (the ring no longer holds every restore since
// seq).
func (l *losses) restoredSince(seq uint32, tag string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.seq.Load()
	if n-seq > lossRing {
		return true
	}
	for i := seq; i != n; {
		i++
		if t := l.ring[i%lossRing]; t == tag || t == anyTag {
			return true
		}
	}
	return false
}

// lossNote is the note of tag that a restore after a loss sends the
// other replicas with its request to flush (see syncPeers): none from a
// store of this replica's own (the local fallback), whose loss is no
// other's.
func (f *freshStore) lossNote(tag string) []string {
	if f != f.g.store {
		return nil
	}
	return []string{tag}
}

// peerRestored logs the tags another replica restores after a loss of
// the store they share (see ledger.Config.OnPeerSync): "" stands for
// every tag.
func (g *Gate) peerRestored(tags []string) {
	for _, t := range tags {
		if t == "" {
			t = anyTag
		}
		g.store.lost.note(t)
	}
}

// noteDebit notes, for a debit the store just made, where its log of
// restores stands, and where the local fallback's does.
func (r *Reservation) noteDebit() {
	r.debited, r.lossSeq = true, r.g.store.lost.seq.Load()
	if fb := r.g.fallback.Load(); fb != nil {
		r.fbDebit, r.fbSeq = fb.freshStore, fb.lost.seq.Load()
	}
}

// rechargeLost charges again, once r's entry is in the ledger, what r
// debited on the tags the store restored since its debit (see losses):
// each item's cost, as a settlement of no reservation under an id of its
// own. A concurrency item is held again by its renewal instead. A charge
// the store fails is kept and made again before its next call on the
// tenant, as a failed settlement is.
func (r *Reservation) rechargeLost(ctx context.Context) {
	r.rechargeFallback(ctx)
	if !r.debited || r.degraded || r.g.store.lost.seq.Load() == r.lossSeq {
		return // the common case: no restore since the debit
	}
	var items []weighted.Item
	var actual []int64
	for _, it := range r.items {
		if it.Cost <= 0 || it.Limit.Algorithm == weighted.Concurrency || !r.g.store.lost.restoredSince(r.lossSeq, weighted.HashTag(it.Key)) {
			continue
		}
		actual = append(actual, it.Cost)
		it.Cost = 0
		items = append(items, it)
	}
	if len(items) == 0 {
		return
	}
	id := r.resID + ":lost"
	if err := r.g.store.Settle(context.WithoutCancel(ctx), id, items, actual); err != nil {
		r.g.log.Warn("a request debited before the store lost its data could not be charged again; kept to retry", "request_id", r.req.ID, "err", err)
		r.g.unsettled(id, items, actual)
	}
}

// refundsKept is actual, the settlement of items (a reservation's, and
// ext its extensions, if any) debited when the store's log of restores l
// stood at seq, with no refund on the counters of a tag restored since:
// each such item's actual cost is raised to what the reservation and its
// extensions hold of it. It is for a settlement that reaches the store
// after the reservation's ledger entry was billed (a front door's Bill
// before Settle; a settlement the store failed, billed at once and made
// again later): a restore that read the entry billed counted its actual
// cost, not its estimate, and a refund of the difference on the restored
// counter took it below what was spent. A token bucket or GCRA refunds
// whatever a settlement names (a window refunds only into the window
// its record says it was debited in, a record the loss took with it,
// unless a failover kept it): a tenant billed early on a $0.008 limit,
// settled after a FLUSHALL and its restore, was admitted $0.010. A
// restore that read the entry reserved, before it was billed, counted the
// estimate: the refund kept is counted twice then, which refuses early,
// never late. A reservation debited before no restore (seq is the log's
// last) changes nothing. A concurrency item is released as it is.
func refundsKept(l *losses, seq uint32, items []weighted.Item, ext *extensions, actual []int64) []int64 {
	if l.seq.Load() == seq {
		return actual
	}
	for i, it := range items {
		if i >= len(actual) || it.Limit.Algorithm == weighted.Concurrency || !l.restoredSince(seq, weighted.HashTag(it.Key)) {
			continue
		}
		held := it.Cost
		if ext != nil {
			for _, e := range ext.debts {
				for j, k := range e.index {
					if k == i {
						held += e.items[j].Cost
					}
				}
			}
		}
		actual[i] = max(actual[i], held)
	}
	return actual
}

// rechargeFallback charges on the local fallback, once r's entry is in
// the ledger, what r debited in the store on the tags the fallback
// restored since r's debit: the store went out while r was held between
// its debit and its entry (a friction delay), and the fallback, restored
// from the ledger, started without it. Each item's whole cost is charged,
// as the fallback counts this replica's own records whole. The store's
// counters keep r's debit: when the store is back, nothing of this is
// added to them. Before, a tenant with 7 of its 10 requests a day
// recorded and 3 held was admitted 3 more on the fallback once the 3
// were recorded: 13 of 10 (TestFallbackLossAtkHeldBeforeTheOutage).
func (r *Reservation) rechargeFallback(ctx context.Context) {
	if !r.debited || r.degraded {
		return
	}
	fb := r.g.fallback.Load()
	if fb == nil {
		return
	}
	seq := r.fbSeq
	if fb.freshStore != r.fbDebit {
		seq = 0 // a fallback made since the debit: each of its restores came after it
	}
	n := fb.lost.seq.Load()
	if n == seq {
		return // the common case: no outage, or no restore since the debit
	}
	var items []weighted.Item
	var actual []int64
	for _, it := range r.items {
		if it.Cost <= 0 || it.Limit.Algorithm == weighted.Concurrency || !fb.lost.restoredSince(seq, weighted.HashTag(it.Key)) {
			continue
		}
		actual = append(actual, it.Cost)
		it.Cost = 0
		items = append(items, it)
	}
	if len(items) == 0 {
		return
	}
	items = fallbackItems(items, r.st.cfg.Store.FallbackReplicas)
	if err := fb.store.Settle(context.WithoutCancel(ctx), r.resID+":lost-fallback", items, actual); err != nil {
		r.g.log.Warn("a request debited before the limiter store went out could not be charged on the local fallback", "request_id", r.req.ID, "err", err)
	}
}
