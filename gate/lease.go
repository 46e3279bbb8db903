package gate

// Lease renewal: a concurrency limit holds a request's units until the
// request settles, or until its lease (the limit's Period) expires. A
// stream that runs longer than the Period would lose its slot while still
// running, so the Server's renewer renews the reservation of every request
// that holds a concurrency item, every half of its shortest Period, from
// its debit until its settlement starts. One goroutine, owned by the
// Server, ticks and renews all the due reservations at once, each on a
// goroutine of its own, so that a Redis store batches them.

import (
	"context"
	"sync"
	"time"

	"github.com/costgate/costgate/weighted"
)

const (
	// renewTick is how often the renewer looks for due reservations while
	// it holds any; a renewal is late by at most this much.
	renewTick = 50 * time.Millisecond
	// minRenewEvery and maxRenewEvery bound how often one reservation is
	// renewed: every half of its shortest concurrency Period, clamped. A
	// Period under 2 × (minRenewEvery + renewTick) may expire before its
	// renewal.
	minRenewEvery = 100 * time.Millisecond
	maxRenewEvery = time.Second
)

// renewer renews the leases of the requests registered with it. Its
// methods are safe for concurrent use; start starts its goroutine, and
// close stops it, cancels the renewals under way and waits for them.
type renewer struct {
	g      *Gate
	ctx    context.Context // the renewals'; cancelled by close
	cancel context.CancelFunc

	mu     sync.Mutex
	leases map[*Reservation]*lease
	closed bool

	wake chan struct{} // signalled when a lease is added to an empty set
	stop chan struct{}
	wg   sync.WaitGroup // the goroutine and its renewals
}

// lease is one registered request's renewal schedule. Guarded by
// renewer.mu.
type lease struct {
	every time.Duration
	next  time.Time
	busy  bool // a renewal runs: the next waits for it
}

func newRenewer(g *Gate) *renewer {
	ctx, cancel := context.WithCancel(context.Background())
	return &renewer{
		g: g, ctx: ctx, cancel: cancel,
		leases: map[*Reservation]*lease{}, wake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
}

// renewEvery returns how often a reservation of items is renewed, and
// false when none of them holds a lease.
func renewEvery(items []weighted.Item) (time.Duration, bool) {
	var shortest time.Duration
	for _, it := range items {
		if it.Limit.Algorithm == weighted.Concurrency && it.Cost > 0 && (shortest == 0 || it.Limit.Period < shortest) {
			shortest = it.Limit.Period
		}
	}
	if shortest == 0 {
		return 0, false
	}
	return min(max(shortest/2, minRenewEvery), maxRenewEvery), true
}

// add registers x, whose debit was admitted, when it holds a lease. x's
// items and store must not change while it is registered.
func (r *renewer) add(x *Reservation) {
	every, ok := renewEvery(x.items)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.leases[x] = &lease{every: every, next: time.Now().Add(every)}
	x.leased.Store(true)
	if len(r.leases) == 1 {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// remove stops renewing x; a renewal of x under way may still finish. It
// may be called more than once, and for a request never added, which costs
// nothing (most requests hold no lease). add runs on the request's
// goroutine; remove on it, or, for a held reservation, on the goroutine
// that ends it.
func (r *renewer) remove(x *Reservation) {
	if !x.leased.Load() || !x.leased.Swap(false) {
		return
	}
	r.mu.Lock()
	delete(r.leases, x)
	r.mu.Unlock()
}

// start starts the renewer's goroutine.
func (r *renewer) start() {
	r.wg.Go(r.run)
}

// close stops the renewer. It is safe to call more than once, and when
// start was not called.
func (r *renewer) close() error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		clear(r.leases)
		close(r.stop)
		r.cancel()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}

// run ticks while any lease is registered and starts the due renewals.
func (r *renewer) run() {
	tick := time.NewTimer(renewTick)
	defer tick.Stop()
	for {
		r.mu.Lock()
		idle := len(r.leases) == 0
		r.mu.Unlock()
		if idle {
			select {
			case <-r.stop:
				return
			case <-r.wake:
			}
		}
		tick.Reset(renewTick)
		select {
		case <-r.stop:
			return
		case now := <-tick.C:
			r.renewDue(now)
		}
	}
}

// renewTag renews at once every registered reservation whose store is st
// and which holds a concurrency item under hash tag tag, and waits for the
// renewals. A restore of tag after its store lost its state calls it, so
// that the holds of this replica's requests in flight, gone with the
// state, are back (see weighted.Store.Renew) before the call that found
// the tag stale is decided; the other replicas' come back at their next
// renewal, within half a Period (a second at most). A failed renewal is
// logged: the renewer's next one tries again.
func (r *renewer) renewTag(ctx context.Context, st weighted.Store, tag string) {
	var due []*Reservation
	r.mu.Lock()
	for x := range r.leases {
		if x.store() == st && holdsUnder(x.items, tag) {
			due = append(due, x)
		}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, x := range due {
		wg.Go(func() {
			if err := st.Renew(ctx, x.resID, x.items); err != nil {
				r.g.log.Debug("limiter renew after a restore failed", "request_id", x.req.ID, "err", err)
			}
		})
	}
	wg.Wait()
}

// holdsUnder reports whether items hold a concurrency lease under hash
// tag tag.
func holdsUnder(items []weighted.Item, tag string) bool {
	for _, it := range items {
		if it.Limit.Algorithm == weighted.Concurrency && it.Cost > 0 && weighted.HashTag(it.Key) == tag {
			return true
		}
	}
	return false
}

// renewDue starts a renewal, each on a goroutine of its own, of every
// reservation due at now whose last renewal has returned. A renewal that
// takes longer than its interval is cancelled.
func (r *renewer) renewDue(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for x, l := range r.leases {
		if l.busy || l.next.After(now) {
			continue
		}
		l.busy, l.next = true, now.Add(l.every)
		r.wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.ctx, l.every)
			err := x.store().Renew(ctx, x.resID, x.items)
			cancel()
			if err != nil {
				// guardedStore counts it among the store's failed ops.
				r.g.log.Debug("limiter renew failed", "request_id", x.req.ID, "err", err)
			} else {
				x.refreshKeys() // the store holds its counters from now
			}
			r.mu.Lock()
			l.busy = false
			r.mu.Unlock()
		})
	}
}
