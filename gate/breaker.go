package gate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// errBreakerOpen is what a guarded store answers, at once, while its
// breaker is open.
var errBreakerOpen = errors.New("gate: limiter store circuit breaker is open")

// breaker is a circuit breaker around the limiter store. Closed, it lets
// every call through and counts consecutive failures; at Failures in a row
// it opens. Open, it refuses calls for Cooldown, then half-opens: one probe
// call goes through at a time, and the first success closes it while a
// failure opens it again. It is safe for concurrent use.
type breaker struct {
	failures int           // consecutive failures that open it
	cooldown time.Duration // how long it stays open before a probe
	now      func() time.Time

	mu       sync.Mutex
	state    telemetry.BreakerState
	streak   int
	openedAt time.Time
	probing  bool
	closes   atomic.Uint64 // times it closed again after it had opened
}

// recoveries is how many outages have ended: the store failure that follows
// one starts a new outage.
func (b *breaker) recoveries() uint64 { return b.closes.Load() }

func newBreaker(failures int, cooldown time.Duration, now func() time.Time) *breaker {
	return &breaker{failures: failures, cooldown: cooldown, now: now, state: telemetry.BreakerClosed}
}

// allow tells whether a call may go to the store; a true answer must be
// followed by done with the call's error.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case telemetry.BreakerOpen:
		if b.now().Sub(b.openedAt) < b.cooldown {
			return false
		}
		b.state, b.probing = telemetry.BreakerHalfOpen, true
		return true
	case telemetry.BreakerHalfOpen:
		if b.probing {
			return false
		}
		b.probing = true
		return true
	}
	return true
}

func (b *breaker) done(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		if b.state != telemetry.BreakerClosed {
			b.closes.Add(1)
		}
		b.state, b.streak, b.probing = telemetry.BreakerClosed, 0, false
		return
	}
	b.streak++
	if b.state == telemetry.BreakerHalfOpen || b.streak >= b.failures {
		b.state, b.openedAt, b.probing = telemetry.BreakerOpen, b.now(), false
	}
}

// ready tells whether a call now would be let through, without letting
// one through.
func (b *breaker) ready() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case telemetry.BreakerOpen:
		return b.now().Sub(b.openedAt) >= b.cooldown
	case telemetry.BreakerHalfOpen:
		return !b.probing
	}
	return true
}

// closedOrIdle tells whether the breaker is closed, or open for at least
// its cooldown and wait more without a probe since: background calls
// (see Gate.catchUpLoop) leave the probe of a breaker that just cooled
// down to a request, which would otherwise find it taken and go to the
// fallback, and probe themselves only on a replica no request came to.
func (b *breaker) closedOrIdle(wait time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case telemetry.BreakerOpen:
		return b.now().Sub(b.openedAt) >= b.cooldown+wait
	case telemetry.BreakerHalfOpen:
		return false
	}
	return true
}

// abstain ends a call allow let through that the store did not answer
// and that did not fail: a half-open breaker lets its next probe through,
// and a closed one keeps its run of failures.
func (b *breaker) abstain() {
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// State is the breaker's current state.
func (b *breaker) State() telemetry.BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// guardedStore bounds every call to the store by a timeout and puts the
// breaker in front of it, so that a dead store costs a request at most the
// timeout, and nothing once the breaker has opened.
type guardedStore struct {
	store    weighted.Store
	restorer weighted.Restorer // the same store
	breaker  *breaker
	timeout  time.Duration
	// bounded tells that the store bounds each Debit and Settle itself
	// (weighted.Redis: QueueTimeout, then CallTimeout), so that timeout
	// is not set on them: a context with a deadline is a timer started and
	// stopped per call, some 4% of the RLS server's CPU per decision.
	bounded bool
	tel     interface {
		StoreOp(op telemetry.StoreOp, d time.Duration, err error)
	}
}

var (
	_ weighted.Store          = (*guardedStore)(nil)
	_ weighted.Restorer       = (*guardedStore)(nil)
	_ weighted.StagedRestorer = (*guardedStore)(nil)
	_ weighted.LeaseStore     = (*guardedStore)(nil)

	_ weighted.StatesDebiter = (*guardedStore)(nil)
)

func (g *guardedStore) call(ctx context.Context, op telemetry.StoreOp, f func(context.Context) error) error {
	if !g.breaker.allow() {
		return errBreakerOpen
	}
	// The store bounds the wait for a batch and the Redis call itself
	// (QueueTimeout, CallTimeout); this bound only backs them up, where
	// the store does not bound the call (bounded) or ctx ends later.
	cancel := context.CancelFunc(nil)
	if !g.bounded || op != telemetry.StoreDebit && op != telemetry.StoreSettle {
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > g.timeout {
			ctx, cancel = context.WithTimeout(ctx, g.timeout)
		}
	}
	start := time.Now()
	err := f(ctx)
	if cancel != nil {
		cancel()
	}
	if errors.Is(err, weighted.ErrUnclaimable) {
		g.breaker.abstain() // no call was made: it tells nothing of the store
		return err
	}
	g.tel.StoreOp(op, time.Since(start), err)
	// Only a failing store counts against its health: an allow-list of
	// transport errors, Redis errors and unanswered calls. Only an answer
	// counts for it: a decision or a store that must first be restored. A
	// decision error found before any call (a cost larger than a limit, an
	// invalid cost), a busy queue or a caller that left tell nothing of
	// the store: they neither close a half-open breaker nor end a run of
	// failures. A request whose keys the store could not read
	// (weighted.ErrUnreadable: one tenant's spoiled key) was answered:
	// it counts for the store's health, never against it.
	switch {
	case weighted.IsStoreFailure(err):
		g.breaker.done(err)
	case err == nil, errors.Is(err, weighted.ErrStale), errors.Is(err, weighted.ErrUnreadable):
		g.breaker.done(nil)
	default:
		g.breaker.abstain()
	}
	return err
}

// Restore restores the items' tags (see weighted.Restorer).
func (g *guardedStore) Restore(ctx context.Context, items []weighted.Item, counted []int64) error {
	return g.call(ctx, telemetry.StoreRestore, func(ctx context.Context) error { return g.restorer.Restore(ctx, items, counted) })
}

// RestoreCounters restores the items' counters, not their tags (see
// weighted.Restorer).
func (g *guardedStore) RestoreCounters(ctx context.Context, items []weighted.Item, counted []int64) error {
	return g.call(ctx, telemetry.StoreRestore, func(ctx context.Context) error { return g.restorer.RestoreCounters(ctx, items, counted) })
}

// RestoreStage restores the items' counters as one call of a restore made
// in several (see weighted.StagedRestorer); over a store that is none, as
// RestoreCounters, and the last call as Restore.
func (g *guardedStore) RestoreStage(ctx context.Context, items []weighted.Item, counted []int64, s weighted.Stage) error {
	return g.call(ctx, telemetry.StoreRestore, func(ctx context.Context) error {
		switch sr, ok := g.restorer.(weighted.StagedRestorer); {
		case ok:
			return sr.RestoreStage(ctx, items, counted, s)
		case s.Last:
			return g.restorer.Restore(ctx, items, counted)
		}
		return g.restorer.RestoreCounters(ctx, items, counted)
	})
}

func (g *guardedStore) Debit(ctx context.Context, id string, items []weighted.Item) (res weighted.Result, err error) {
	err = g.call(ctx, telemetry.StoreDebit, func(ctx context.Context) error {
		res, err = g.store.Debit(ctx, id, items)
		return err
	})
	return res, err
}

// DebitInto is Debit, with the result's item states in states where the
// store can keep them there (see weighted.StatesDebiter).
func (g *guardedStore) DebitInto(ctx context.Context, id string, items []weighted.Item, states []weighted.ItemState) (res weighted.Result, err error) {
	sd, ok := g.store.(weighted.StatesDebiter)
	if !ok {
		return g.Debit(ctx, id, items)
	}
	err = g.call(ctx, telemetry.StoreDebit, func(ctx context.Context) error {
		res, err = sd.DebitInto(ctx, id, items, states)
		return err
	})
	return res, err
}

// Lease takes or reports a lease (see weighted.LeaseStore), counted as a
// debit; the store must be a weighted.LeaseStore.
func (g *guardedStore) Lease(ctx context.Context, it weighted.Item, c weighted.LeaseCall) (st weighted.ItemState, err error) {
	ls, ok := g.store.(weighted.LeaseStore)
	if !ok {
		return weighted.ItemState{}, fmt.Errorf("gate: %T keeps no leases", g.store)
	}
	err = g.call(ctx, telemetry.StoreDebit, func(ctx context.Context) error {
		st, err = ls.Lease(ctx, it, c)
		return err
	})
	return st, err
}

func (g *guardedStore) Settle(ctx context.Context, id string, items []weighted.Item, actual []int64) error {
	return g.call(ctx, telemetry.StoreSettle, func(ctx context.Context) error { return g.store.Settle(ctx, id, items, actual) })
}

// SettleClaimed settles and claims in one call (see weighted.Claimer),
// counted as a settle; ErrUnclaimable when the store cannot.
func (g *guardedStore) SettleClaimed(ctx context.Context, id string, items []weighted.Item, actual []int64, c weighted.Claim) (won bool, prior string, err error) {
	err = g.call(ctx, telemetry.StoreSettle, func(ctx context.Context) error {
		won, prior, err = weighted.SettleClaimed(ctx, g.store, id, items, actual, c)
		return err
	})
	return won, prior, err
}

func (g *guardedStore) Cancel(ctx context.Context, id string, items []weighted.Item) error {
	return g.call(ctx, telemetry.StoreCancel, func(ctx context.Context) error { return g.store.Cancel(ctx, id, items) })
}

func (g *guardedStore) Renew(ctx context.Context, id string, items []weighted.Item) error {
	return g.call(ctx, telemetry.StoreRenew, func(ctx context.Context) error { return g.store.Renew(ctx, id, items) })
}

func (g *guardedStore) Peek(ctx context.Context, items []weighted.Item) (res weighted.Result, err error) {
	err = g.call(ctx, telemetry.StorePeek, func(ctx context.Context) error {
		res, err = g.store.Peek(ctx, items)
		return err
	})
	return res, err
}

func (g *guardedStore) Reset(ctx context.Context, items []weighted.Item) error {
	return g.call(ctx, telemetry.StoreReset, func(ctx context.Context) error { return g.store.Reset(ctx, items) })
}

// fallbackItems scales items down to the local fallback budget: each
// limit divided by the number of replicas expected to share it, so that
// the replicas together admit about what the limit allows while the store
// is out. Capacity never drops below one unit.
func fallbackItems(items []weighted.Item, replicas int64) []weighted.Item {
	out := make([]weighted.Item, len(items))
	for i, it := range items {
		l := it.Limit
		l.Rate = max(l.Rate/replicas, 1)
		if l.Burst > 0 {
			l.Burst = max(l.Burst/replicas, 1)
		}
		it.Limit = l
		out[i] = it
	}
	return out
}
