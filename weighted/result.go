package weighted

import (
	"math/bits"
	"time"
)

// ItemState is the outcome of one item of a debit or peek.
type ItemState struct {
	// Allowed reports whether the item's cost fits its limit.
	Allowed bool
	// Remaining is how many units the limit could admit now: after the
	// debit for an admitted Debit, before it for a denied Debit and for
	// Peek. It is never negative.
	Remaining int64
	// Capacity is the limit's capacity (see Limit).
	Capacity int64
	// RetryAfter is, when the item is not allowed, how long until its cost
	// would fit if nothing else were debited meanwhile; 0 when allowed. For
	// Concurrency it is an upper bound: the time until enough leases expire.
	RetryAfter time.Duration
	// ResetAfter is how long until the limit is back to its full capacity
	// if nothing else is debited; 0 when it is full.
	ResetAfter time.Duration
}

// Result is the decision on a set of items, taken all or nothing.
type Result struct {
	// Allowed reports whether every item was allowed, and so debited.
	Allowed bool
	// Decider is the index of the item that decided: when denied, the
	// failing item with the longest RetryAfter; when allowed, the item with
	// the least remaining relative to its capacity. Ties go to the lower
	// index. It is -1 when there are no items.
	Decider int
	// Items holds the state of each item, in the order of the request.
	Items []ItemState
	// RetryAfter is the decider's RetryAfter: when denied, the longest wait
	// among the failing items; 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is the decider's ResetAfter.
	ResetAfter time.Duration
}

// decide fills Allowed, Decider, RetryAfter and ResetAfter from r.Items.
func (r *Result) decide() {
	r.Allowed, r.Decider, r.RetryAfter, r.ResetAfter = true, -1, 0, 0
	for i := range r.Items {
		if !r.Items[i].Allowed {
			r.Allowed = false
			break
		}
	}
	for i := range r.Items {
		it := &r.Items[i]
		if r.Decider < 0 {
			if r.Allowed || !it.Allowed {
				r.Decider = i
			}
			continue
		}
		d := &r.Items[r.Decider]
		if r.Allowed {
			if lessFull(it, d) {
				r.Decider = i
			}
		} else if !it.Allowed && it.RetryAfter > d.RetryAfter {
			r.Decider = i
		}
	}
	if r.Decider >= 0 {
		d := &r.Items[r.Decider]
		r.RetryAfter, r.ResetAfter = d.RetryAfter, d.ResetAfter
	}
}

// lessFull reports whether a has strictly less remaining relative to its
// capacity than b: a.Remaining/a.Capacity < b.Remaining/b.Capacity, compared
// exactly in 128 bits.
func lessFull(a, b *ItemState) bool {
	ah, al := bits.Mul64(uint64(a.Remaining), uint64(b.Capacity))
	bh, bl := bits.Mul64(uint64(b.Remaining), uint64(a.Capacity))
	return ah < bh || (ah == bh && al < bl)
}

// micros converts microseconds to a Duration.
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
