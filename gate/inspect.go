package gate

import (
	"context"
	"time"

	"github.com/costgate/costgate/weighted"
)

// LimitInfo is a configured limit or budget as the admin plane shows it,
// with its state under one key when one was asked for.
type LimitInfo struct {
	Name      string
	Algorithm string
	Unit      string
	Rate      int64
	Window    time.Duration
	Capacity  int64
	Dimension string
	Budget    bool
	Shadow    bool
	// State is the limit's state under the key asked for; nil when no key
	// was given.
	State *LimitState
}

// Limits lists the active configuration's limits and budgets, each with
// its state under key (as top-throttled and the logs name keys, such as
// "{acme}:tenant=acme") when key is not empty. It changes nothing.
func (g *Gate) Limits(ctx context.Context, key string) ([]LimitInfo, error) {
	st := g.state.Load()
	now := time.Now()
	out := make([]LimitInfo, 0, len(st.limits))
	for _, l := range st.limits {
		out = append(out, LimitInfo{Name: l.limit.Name, Algorithm: l.limit.Algorithm.String(), Unit: l.unit, Rate: l.limit.Rate,
			Window: l.window(now), Capacity: l.limit.Capacity(), Dimension: l.dimension, Budget: l.budget, Shadow: l.shadow})
	}
	if key == "" || len(st.limits) == 0 {
		return out, nil
	}
	items := make([]weighted.Item, 0, len(st.limits))
	for _, l := range st.limits {
		items = append(items, weighted.Item{Limit: l.limit, Key: key})
	}
	res, err := g.store.Peek(ctx, items)
	if err != nil {
		return nil, err
	}
	for i := range out {
		if i < len(res.Items) {
			it := res.Items[i]
			out[i].State = &LimitState{Name: out[i].Name, Unit: out[i].Unit, Dimension: out[i].Dimension, Key: key,
				Allowed: it.Allowed, Capacity: it.Capacity, Remaining: it.Remaining, Window: out[i].Window, ResetAfter: it.ResetAfter}
		}
	}
	return out, nil
}

// CallerLimits is the state of every limit and budget of c's plan that
// has one state per caller (keyed by tenant, user or key alone); limits
// keyed by request attributes (model, route, ip) have none. It changes
// nothing.
func (g *Gate) CallerLimits(ctx context.Context, c *Caller) ([]LimitState, error) {
	var (
		items []weighted.Item
		ls    []*compiledLimit
	)
	for _, l := range c.st.limits {
		if !l.appliesTo(c.Plan) || !l.callerScoped() {
			continue
		}
		items = append(items, weighted.Item{Limit: l.limit, Key: l.callerKey(c)})
		ls = append(ls, l)
	}
	items, ls = c.levelItems(time.Now(), items, ls)
	out := []LimitState{}
	if len(items) == 0 {
		return out, nil
	}
	res, err := g.store.Peek(ctx, items)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for i, l := range ls {
		it := res.Items[i]
		out = append(out, LimitState{Name: l.limit.Name, Unit: l.unit, Dimension: l.dimension, Key: items[i].Key,
			Allowed: it.Allowed, Capacity: it.Capacity, Remaining: it.Remaining, Window: l.window(now),
			ResetAfter: it.ResetAfter, Budget: l.budget, Shadow: l.shadow})
	}
	return out, nil
}

// Breaker is the state of the limiter store's circuit breaker; empty for
// the in-memory store, which has none.
func (g *Gate) Breaker() string {
	if g.breaker == nil {
		return ""
	}
	return string(g.breaker.State())
}
