package gate

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/costgate/costgate/weighted"
)

// leased puts the limits with a lease policy (config lease:) on leases
// taken from st: a replica spends them in process and asks Redis for the
// next one only when they run low (see weighted.Leased for the bound).
// Strict limits go to st as before. The leases are returned at Close,
// before the Redis client closes.
func (g *Gate) leased(st store) store {
	l := weighted.NewLeased(st, weighted.LeasedConfig{})
	g.leases = l
	g.closers = append(g.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return l.Close(ctx)
	})
	return l
}

// LimitLeases is a configured limit's consistency mode (or a rate limit
// service descriptor's) and the leases this replica holds on its keys.
type LimitLeases struct {
	Name   string
	Mode   string // "leased" or "strict"
	Budget bool
	// MaxUnits is the most units of one key a replica holds unspent; TTL
	// a lease's life. Zero for a strict limit.
	MaxUnits int64
	TTL      time.Duration
	// Keys are the keys this replica holds leases on or knows spent.
	Keys []weighted.LeaseInfo
}

// Leases lists every limit and budget of the active configuration, then
// the rate limit service's descriptor limits, with its mode and this
// replica's leases, and the store's lease counts (zero on the in-memory
// store, which takes no leases).
func (g *Gate) Leases() ([]LimitLeases, weighted.LeaseStats) {
	st := g.state.Load()
	out := make([]LimitLeases, 0, len(st.limits))
	byName := map[string]int{}
	add := func(name string, budget bool, p weighted.Lease) {
		ll := LimitLeases{Name: name, Mode: "strict", Budget: budget, Keys: []weighted.LeaseInfo{}}
		if p.On() && g.leases != nil { // the in-memory store takes no leases
			ll.Mode, ll.MaxUnits, ll.TTL = "leased", p.Max, p.Life()
		}
		byName[name] = len(out)
		out = append(out, ll)
	}
	for _, l := range st.limits {
		add(l.limit.Name, l.budget, l.limit.Lease)
	}
	for _, r := range st.cfg.RLS.Limits() { // the rate limit service's
		w, _ := r.Weighted() // valid: the configuration is
		add(r.Name, false, w.Lease)
	}
	if g.leases == nil {
		return out, weighted.LeaseStats{}
	}
	for _, k := range g.leases.Leases() {
		if i, ok := byName[k.Limit]; ok {
			out[i].Keys = append(out[i].Keys, k)
		}
	}
	for i := range out {
		slices.SortFunc(out[i].Keys, func(a, b weighted.LeaseInfo) int { return strings.Compare(a.Key, b.Key) })
	}
	return out, g.leases.Stats()
}

// Regions is the last reconciliation of this region's caps of the global
// budgets; empty when the config names no regions.
func (g *Gate) Regions() []RegionInfo {
	if g.regions == nil {
		return []RegionInfo{}
	}
	return []RegionInfo{g.regions.Info()}
}
