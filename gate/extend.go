package gate

// Extensions: a stream admitted on a reservation smaller than what it may
// produce (output_reserve below 100) debits its output in increments as it
// runs (the proxy's stream guard). Each increment is a debit of its own in
// the limiter, under the reservation's id and a sequence number, of the
// increment's cost on every limit and budget of the reservation that counts
// output (tokens, output tokens, dollars), all or nothing. Settle then
// shares the actual cost of each limit among the reservation and its
// extensions, in the order they were debited (each up to what it holds,
// the last one the rest), so that the limits are charged the actual cost
// exactly once, as without extensions.
//
// Not extended: limits in requests or input tokens (an increment of output
// does not change them), concurrency limits (they count what is in
// flight, not what is spent), shadow limits and a front door's extra
// limits; their reservation settles as it always does.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// extensions are the increments debited beyond a reservation.
type extensions struct {
	usage costmodel.Usage   // the extra usage debited, in all
	cost  costmodel.NanoUSD // its price, at the reservation's model
	debts []extension
}

// extension is one increment's debit.
type extension struct {
	id    string
	store weighted.Store // the limiter store, or the fallback while it is out
	items []weighted.Item
	index []int // the reservation item each of items extends
}

// Extend debits extra usage (an increment of output beyond what the
// reservation holds) on every limit and budget of the reservation that
// counts it, all or nothing. It returns the refusal, with the limit or
// budget that refused, when one has no room; Settle then charges the
// actual usage relative to what was reserved and extended. A limiter store
// that fails is answered by the limits' posture, as a debit is: a
// fail-closed limit refuses (503), the others are debited on the local
// fallback budgets. A recorded reservation's ledger entry takes the
// increment in its estimate (ledger.Extend) before the limits are
// debited, so that the death of the process between the two recovers the
// entry at no less than the limits count. Extend is for the goroutine
// that owns the reservation, before it settles.
func (r *Reservation) Extend(ctx context.Context, extra costmodel.Usage) (Decision, bool) {
	if r.ended {
		return refusal(telemetry.OutcomeHard, http.StatusConflict, Error{Type: "invalid_request_error", Code: "reservation_ended",
			Message: "the reservation has ended"}), false
	}
	x := r.ext
	if x == nil {
		x = &extensions{}
	}
	model := r.req.Estimate.Model
	base := addUsage(r.req.Estimate.Usage, x.usage)
	total := addUsage(base, extra)
	cost := max(r.st.est.Cost(model, total)-r.st.est.Cost(model, base), 0)

	e := extension{id: r.resID + ":x" + strconv.Itoa(len(x.debts)+1), store: r.store()}
	for i, l := range r.limits {
		if !l.extends() || l.model != "" || i >= len(r.items) {
			continue // another model's item: the increment is the request's model's output
		}
		c := l.costOf(0, extra, cost)
		if c <= 0 {
			continue
		}
		it := r.items[i]
		it.Cost = c
		e.items = append(e.items, it)
		e.index = append(e.index, i)
	}
	if r.recorded && cost > 0 {
		// The ledger's estimate follows what the limits are debited, and
		// takes the increment before they do: a crash after the debit
		// recovers the stream at the output it was let through, and
		// budgets restored from the ledger count it, not only its first
		// reservation. An increment then refused leaves the estimate
		// raised until the settlement, which bills the actual usage.
		r.raiseEstimate(ctx, total, costmodel.AddSat(r.req.Estimate.Cost, x.cost+cost))
	}
	if len(e.items) > 0 {
		r.refreshKeys() // the debit writes the counters again
		res, err := e.store.Debit(ctx, e.id, e.items)
		if err != nil && !r.degraded && !errors.As(err, new(*weighted.CostError)) &&
			!errors.Is(err, weighted.ErrOverloaded) && !errors.Is(err, weighted.ErrStale) {
			if d, closed := r.extendFailClosed(e, err); closed {
				return d, false
			}
			for _, it := range e.items {
				r.g.tel.FailOpen(it.Limit.Name)
			}
			e.store = r.g.fallbackStore()
			e.items = fallbackItems(e.items, r.st.cfg.Store.FallbackReplicas)
			res, err = e.store.Debit(ctx, e.id, e.items)
		}
		var tooBig *weighted.CostError
		switch {
		case errors.As(err, &tooBig):
			return r.extendRefused(e.index[indexOf(e.items, tooBig.Limit)], 0, fmt.Sprintf(" (an increment of %d %s is more than it holds)", tooBig.Cost, r.limitFor(tooBig.Limit).unit)), false
		case err != nil:
			r.g.log.Warn("limiter extend failed", "request_id", r.req.ID, "err", err)
			d := refusal(telemetry.OutcomeHard, http.StatusServiceUnavailable, Error{
				Type: "service_unavailable", Code: "overloaded",
				Message: "costgate's limiter cannot debit the stream's next increment now",
			})
			d.RetryAfter, d.Undecided = 1, true
			return d, false
		case !res.Allowed:
			i := max(res.Decider, 0)
			return r.extendRefused(e.index[i], res.RetryAfter, ""), false
		}
		x.debts = append(x.debts, e)
	}
	x.usage, x.cost = addUsage(x.usage, extra), x.cost+cost
	r.ext = x
	return Decision{Outcome: telemetry.OutcomeAllow}, true
}

// raiseEstimate raises the recorded entry's estimate to usage, costing
// cost (ledger.Extend), so that a recovery of the entry, after the death
// of the process, finalizes it at that.
func (r *Reservation) raiseEstimate(ctx context.Context, usage costmodel.Usage, cost costmodel.NanoUSD) {
	le := r.entry(ledger.StatusReserved)
	le.Estimated, le.EstimatedCost = usage, cost
	if err := r.g.ledger.Extend(context.WithoutCancel(ctx), le); err != nil {
		r.g.log.Warn("ledger: the raised estimate could not be recorded", "request_id", r.req.ID, "err", err)
	}
}

// Extended is the usage debited by Extend beyond the reservation, and its
// price.
func (r *Reservation) Extended() (costmodel.Usage, costmodel.NanoUSD) {
	if r.ext == nil {
		return costmodel.Usage{}, 0
	}
	return r.ext.usage, r.ext.cost
}

// extends tells whether an increment of output is debited on the limit.
func (l *compiledLimit) extends() bool {
	return l.extra == 0 && !l.shadow && l.unit != "requests" && l.unit != "input_tokens" &&
		l.limit.Algorithm != weighted.Concurrency
}

func indexOf(items []weighted.Item, name string) int {
	for i, it := range items {
		if it.Limit.Name == name {
			return i
		}
	}
	return 0
}

// extendFailClosed is the refusal of the first fail-closed limit an
// increment debits, for a store that failed.
func (r *Reservation) extendFailClosed(e extension, err error) (Decision, bool) {
	if !errors.Is(err, errBreakerOpen) {
		r.g.log.Warn("limiter store failed", "request_id", r.req.ID, "err", err)
	}
	for _, i := range e.index {
		if l := r.limits[i]; l.failClosed {
			return l.storeDown(), true
		}
	}
	return Decision{}, false
}

// extendRefused is the refusal of an increment by the reservation's limit
// i: 402 budget_exceeded for a budget, else 429.
func (r *Reservation) extendRefused(i int, retry time.Duration, why string) Decision {
	l := r.limits[i]
	secs := retryAfterSeconds(retry)
	status, typ := http.StatusTooManyRequests, "rate_limit_exceeded"
	msg := fmt.Sprintf("limit %q is exhausted for this %s%s; the stream was stopped", l.limit.Name, l.dimension, why)
	if l.budget {
		status, typ = http.StatusPaymentRequired, "budget_exceeded"
		msg = fmt.Sprintf("budget %q is spent for this period%s; the stream was stopped", l.limit.Name, why)
	}
	r.g.log.Info("stream stopped", "request_id", r.req.ID, "tenant", r.req.Caller.Tenant, "route", r.req.Route,
		"model", r.req.Estimate.Model, "status", status, "limit", l.limit.Name, "dimension", l.dimension)
	d := refusal(telemetry.OutcomeHard, status, Error{Type: typ, Code: l.limit.Name, Message: msg, Policy: l.limit.Name,
		RetryAfterMS: retry.Milliseconds()})
	d.RetryAfter = secs
	return d
}

// settleExtended settles the reservation and its extensions with the
// actual cost of each of the reservation's items: each debit takes its
// share in the order they were made, up to what it holds, and the last
// debit holding an item takes the rest of it. What the debits made on
// the local fallback (a degraded reservation's, and the increments the
// store failed) spent is kept for the store's catch-up, as a degraded
// reservation's spend is (spentOnFallback).
func (r *Reservation) settleExtended(ctx context.Context, actual []int64) {
	left := append([]int64(nil), actual...)
	last := make([]int, len(r.items)) // 1 + the last extension holding item i; 0: the reservation
	for k, e := range r.ext.debts {
		for _, i := range e.index {
			last[i] = k + 1
		}
	}
	take := func(i, holder int, held int64) int64 {
		if last[i] == holder {
			v := left[i]
			left[i] = 0
			return v
		}
		v := min(left[i], held)
		left[i] -= v
		return v
	}
	main := make([]int64, len(r.items))
	for i := range r.items {
		main[i] = take(i, 0, r.items[i].Cost)
	}
	type call struct {
		store  weighted.Store
		id     string
		items  []weighted.Item
		actual []int64
	}
	calls := make([]call, 0, 1+len(r.ext.debts))
	var fallback []int64 // what the debits on the fallback spent, by the reservation's item
	if r.degraded {
		fallback = slices.Clone(main)
	}
	if !unchanged(r.items, main) {
		calls = append(calls, call{r.store(), r.resID, r.items, main})
	} else {
		r.g.endedAtEstimate(r.resID, r.items)
	}
	for k, e := range r.ext.debts {
		a := make([]int64, len(e.items))
		for j, i := range e.index {
			a[j] = take(i, k+1, e.items[j].Cost)
		}
		if e.store != weighted.Store(r.g.store) {
			if fallback == nil {
				fallback = make([]int64, len(r.items))
			}
			for j, i := range e.index {
				fallback[i] = costmodel.AddSat(fallback[i], a[j])
			}
		}
		if !unchanged(e.items, a) {
			calls = append(calls, call{e.store, e.id, e.items, a})
		} else {
			r.g.endedAtEstimate(e.id, e.items)
		}
	}
	// Concurrent calls share one script call on a Redis store (see
	// weighted's batching).
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() {
			if err := c.store.Settle(ctx, c.id, c.items, c.actual); err != nil {
				r.g.log.Warn("limiter settle failed", "request_id", r.req.ID, "id", c.id, "err", err)
				if c.store == weighted.Store(r.g.store) {
					// As a reservation's settlement (see settle); the
					// local fallback fails none.
					r.keepUnsettled(c.id, c.items, c.actual)
				}
			}
		})
	}
	wg.Wait()
	if fallback != nil {
		items := r.items // as the store has them
		if r.degraded {
			items = r.unscaled
		}
		r.g.spentOnFallback(r.resID, items, fallback)
	}
}

// cancelExtended returns every extension's debit.
func (r *Reservation) cancelExtended(ctx context.Context) {
	if r.ext == nil {
		return
	}
	for _, e := range r.ext.debts {
		if err := e.store.Cancel(ctx, e.id, e.items); err != nil {
			r.g.log.Warn("limiter cancel failed", "request_id", r.req.ID, "id", e.id, "err", err)
		}
	}
}

// addUsage is the sum of two usages' token counts.
func addUsage(a, b costmodel.Usage) costmodel.Usage {
	a.InputTokens += b.InputTokens
	a.OutputTokens += b.OutputTokens
	a.CachedInputTokens += b.CachedInputTokens
	a.CacheWriteTokens += b.CacheWriteTokens
	a.CacheWrite1hTokens += b.CacheWrite1hTokens
	a.ReasoningTokens += b.ReasoningTokens
	a.AudioInputTokens += b.AudioInputTokens
	a.AudioOutputTokens += b.AudioOutputTokens
	a.WebSearchRequests += b.WebSearchRequests
	a.FileSearchCalls += b.FileSearchCalls
	return a
}
