// Package weighted enforces cost-weighted rate limits: every debit carries an
// integer cost in the limit's unit (requests, tokens, nano-dollars), and one
// debit checks every limit a request falls under and takes its cost from all
// of them or from none.
//
// A Store keeps the limits' state. Memory keeps it in process (a single
// node); Redis keeps it in Redis, one script call per debit (or per batch
// of concurrent requests), and on Redis Cluster follows the protocol
// described on Redis. Both make the same decisions from the same state and
// time.
//
// Costs are reservations: Debit takes an estimate under a reservation id,
// Settle later replaces it by the actual cost (charging the extra, refunding
// the unused, clamped so that no limit goes above full or below empty; a
// token bucket or GCRA owes up to one capacity beyond empty), and
// Cancel returns it. Both are idempotent per id for SettleTTL.
//
// A concurrency limit holds a reservation's units until it is settled or
// cancelled, or until its lease, the limit's Period, expires. Renew
// extends the leases of a reservation to a Period from now, so that a
// holder that runs longer than the Period (a long LLM stream) keeps its
// units while it renews at least once a Period, and the units of one that
// stops (a crashed replica) return a Period after its last renewal. A
// renewal holds again the units of a reservation not ended that the store
// no longer holds (a lease renewed late, a Redis that lost its data), so
// that the holders still running count again from their next renewal.
//
// Leased is a Store over another that spends the allowance of leased
// limits (Limit.Lease) in process, from slices it takes from the inner
// store, and states what that can over-admit.
//
// Six algorithms are available (see Algorithm); Limit documents what rate,
// period and burst mean for each. A fixed window may also count in UTC
// calendar months (Limit.Calendar), for budgets such as $500 a month per
// tenant: its window starts at 00:00 UTC on the 1st and ends at 00:00 UTC
// on the 1st of the next month.
//
// A store can lose the state it keeps (a Redis restarted empty, flushed,
// or failed over to a replica that lags). With generations on
// (RedisConfig.Generations, MemoryConfig.Generations) each hash tag of the
// items' keys carries a marker of its state's life, checked by the debit
// itself: a Debit or Peek on a tag whose state was lost applies nothing
// and returns a *StaleError (ErrStale) until Restore (see Restorer) has
// raised the tag's counters to what the caller counted (a ledger's spend)
// and written a fresh marker. The usual loop of a caller:
//
//	res, err := store.Debit(ctx, id, items)
//	var se *weighted.StaleError
//	if errors.As(err, &se) {
//		// tagItems: every budget under se.Tags; counted: the ledger's spend of each.
//		if err = store.(weighted.Restorer).Restore(ctx, tagItems, counted); err == nil {
//			res, err = store.Debit(ctx, id, items)
//		}
//	}
//
// Errors are of three kinds: the request's (a *CostError, ErrDuplicateItem,
// ErrInvalidCost, an invalid limit, ErrUnreadable), the state's (ErrStale) and load
// shedding (ErrOverloaded), none of which says the store is down; and the
// store's own failures, for which IsStoreFailure is true: count only
// those against a circuit breaker.
//
// Time is the store's clock: MemoryConfig.Now for Memory, the server's TIME
// for Redis. A clock that steps back never gives more room: a meter or
// window is read at its own time (its last write, or the window it counts
// in) until the clock passes it again, and a state back to empty forgets
// its time; a sliding log or concurrency limit counts every entry still
// held whose time is in the window (or whose lease is unexpired) at the
// clock's time.
//
// A month window's state is kept apart from a period's: a limit switched
// between a Period and a Calendar starts from an empty window, and either
// way the old state expires with its window.
//
// A limit whose rate, period or burst changes reads the state written
// before the change: a count above a smaller capacity simply fills the
// limit, a meter's debt is rescaled to the new period, and a fixed or
// sliding window, which keeps the period it was counted with, is carried
// into the new period's windows: it counts in the latest window of the
// new period that ends no later than one longer period (old or new) after
// the carried window's start, and the debits made while it counts join
// it. So a limit never denies for more than one longer period after its
// last window started (a sliding window's count then weighs as the
// previous window's for one new period more), and no window holds more
// than the capacity.
//
// A key's state is kept, though, only as long as the limit that last
// wrote it needs it: until the state would be empty under that limit
// (Redis: the key's TTL, which adds up to a minute; Memory: until a sweep
// drops the key, a minute or more later). After that the key may read as
// empty under the new limit. So a change that makes the state last longer
// (a longer period, or a meter's lower rate) counts what was spent before
// it until the old limit would have refilled it or ended its window, not
// for as long as the new one would: 10 spent on a token bucket of 10 per
// 100ms just before it becomes 10 per hour are counted against the hour
// for 100ms at least, and then possibly no more; the limit still never
// holds more than its capacity. A change that makes the state last less
// long (10 per hour to 10 per second) keeps it as described above. A debit
// admitted under the new limit writes the key's expiry for it.
package weighted

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Store keeps limit state and takes decisions on it. Implementations are safe
// for concurrent use.
//
// A decision is a Result; a failure of the store (Redis unreachable) is an
// error and never a denial. A cost above a limit's capacity is a *CostError
// (matching ErrCostExceedsCapacity), never a denial.
type Store interface {
	// Debit checks every item and, when all fit, debits every item's cost;
	// otherwise it changes nothing. id is the reservation id (the request
	// id) that Settle and Cancel name later.
	Debit(ctx context.Context, id string, items []Item) (Result, error)
	// Settle ends reservation id, whose Debit was admitted: items are as
	// they were debited, in the same order (Cost is the reserved cost), and
	// actual holds the actual cost of each. The difference is charged or
	// refunded, clamped so that no limit goes above full or below empty,
	// except a token bucket or GCRA, which owes a charge beyond empty up
	// to one more capacity (later debits wait until it is paid back at the
	// limit's rate);
	// a window refunds only into the window that was debited; concurrency
	// units are released. Settling an id again, or after Cancel, changes
	// nothing for SettleTTL.
	Settle(ctx context.Context, id string, items []Item, actual []int64) error
	// Cancel returns the whole reservation id, as Settle with actual costs
	// of zero.
	Cancel(ctx context.Context, id string, items []Item) error
	// Renew extends the leases of reservation id, whose Debit was
	// admitted and which still runs: items are as they were debited (Cost
	// is the reserved cost). Each Concurrency item gets its lease moved
	// to expire one Period from now (a lease that already expires later
	// is left alone); other items are ignored. An item whose units are no
	// longer held (its lease expired, or the store lost its state: a
	// Redis flushed, restarted empty or failed over) is held again, past
	// its capacity if need be, so that a running holder counts whatever
	// the store lost, and debits are refused until the holds drop below
	// the capacity. A reservation settled or cancelled stays so for
	// SettleTTL (or until the store loses its state), also when a Renew
	// races its Settle or Cancel: Renew then changes nothing and returns
	// no error. The caller stops renewing a reservation before it ends it.
	Renew(ctx context.Context, id string, items []Item) error
	// Peek reports, without changing anything, whether each item's cost
	// would fit now; Remaining is the state before any debit.
	Peek(ctx context.Context, items []Item) (Result, error)
	// Reset empties the items' limits for their keys.
	Reset(ctx context.Context, items []Item) error
}

// FinalRecordTTL is how long a store keeps the reservation record of a
// debit whose items are all Final (see Item.Final); lib.lua's
// FINAL_RECORD_MS says the same for Redis.
const FinalRecordTTL = 10 * time.Second

// final reports whether every item is Final.
func final(items []Item) bool {
	for i := range items {
		if !items[i].Final {
			return false
		}
	}
	return true
}

// DefaultSettleTTL is how long a store remembers a settled or cancelled
// reservation id when its config leaves SettleTTL zero.
const DefaultSettleTTL = 10 * time.Minute

var (
	errNoID       = errors.New("weighted: empty reservation id")
	errActualSize = errors.New("weighted: settle needs one actual cost per item")
	errNegative   = fmt.Errorf("%w: negative actual cost", ErrInvalidCost)
)

// checkSettle validates the arguments of Settle.
func checkSettle(id string, items []Item, actual []int64) error {
	if id == "" {
		return errNoID
	}
	if len(actual) != len(items) {
		return errActualSize
	}
	for _, a := range actual {
		if a < 0 {
			return errNegative
		}
	}
	return nil
}

// leases appends to buf the items whose debit holds a lease that Renew
// extends: concurrency items of a positive cost. It returns items itself
// when they all are.
func leases(items []Item, buf []Item) []Item {
	n := 0
	for i := range items {
		if items[i].Limit.Algorithm == Concurrency && items[i].Cost > 0 {
			n++
		}
	}
	if n == len(items) {
		return items
	}
	for i := range items {
		if items[i].Limit.Algorithm == Concurrency && items[i].Cost > 0 {
			buf = append(buf, items[i])
		}
	}
	return buf
}

// actualCost returns item i's actual cost (0 when actual is nil, for Cancel),
// clamped to its reserved cost plus its capacity: a larger charge could not
// change the outcome, which is clamped to the capacity anyway.
func actualCost(items []Item, ss []spec, actual []int64, i int) int64 {
	if actual == nil {
		return 0
	}
	return min(actual[i], items[i].Cost+ss[i].cap)
}
