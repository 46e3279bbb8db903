package admin

import (
	"context"
	"slices"
	"time"

	"github.com/costgate/costgate/dashboard"
	"github.com/costgate/costgate/telemetry"
)

// dashboardData fills the dashboard from the telemetry of this replica.
func (s *Plane) dashboardData(ctx context.Context) (dashboard.Data, error) {
	cfg := s.gate.Config()
	series := s.tel.Series()
	d := dashboard.Data{GeneratedAt: time.Now().UTC()}

	d.Store = dashboard.StoreHealth{Kind: "memory", Healthy: true, Breaker: string(telemetry.BreakerClosed)}
	if cfg.Store.Redis != "" {
		d.Store.Kind = "redis"
	}
	if b := s.gate.Breaker(); b != "" {
		d.Store.Breaker = b
	}
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	d.Store.Healthy = s.gate.Ready(pctx) == nil
	cancel()
	d.Store.FailOpenTotal = s.tel.FailOpenTotal()
	d.Replay = s.lastReplay.Load()
	modes, _ := s.gate.Leases()
	for _, l := range modes {
		lm := dashboard.LimitMode{Name: l.Name, Mode: l.Mode, Budget: l.Budget, Keys: len(l.Keys)}
		for _, k := range l.Keys {
			lm.Leases += k.Leases
			lm.Unspent += k.Unspent
		}
		d.Limits = append(d.Limits, lm)
	}
	if rs := s.gate.Regions(); len(rs) > 0 {
		d.Region = &dashboard.RegionState{Region: rs[0].Region, Regions: rs[0].Regions, LastOK: rs[0].LastOK, LastError: rs[0].LastError}
	}
	if s.control != nil {
		// The database down leaves the table empty, not the dashboard.
		bctx, cancel := context.WithTimeout(ctx, time.Second)
		if rows, err := s.control.BudgetRows(bctx, 200); err == nil {
			d.Budgets = rows
		}
		cancel()
	}

	minute := func(i int) time.Time { return series.Start.Add(time.Duration(i) * time.Minute) }
	for tenant, pts := range series.SpendNanoUSD {
		ts := dashboard.TenantSeries{Tenant: tenant}
		for i, v := range pts {
			ts.Points = append(ts.Points, dashboard.Point{T: minute(i), NanoUSD: v})
		}
		d.Spend = append(d.Spend, ts)
	}

	byPolicy := map[string]*dashboard.PolicyDecisions{}
	var order []string
	row := func(name string) *dashboard.PolicyDecisions {
		pd := byPolicy[name]
		if pd == nil {
			pd = &dashboard.PolicyDecisions{Policy: name}
			byPolicy[name] = pd
			order = append(order, name)
		}
		return pd
	}
	hard := map[string][]int64{} // per minute, by row
	for _, ds := range series.Decisions {
		pd := row(ds.Policy)
		var total int64
		for _, c := range ds.Counts {
			total += c
		}
		switch ds.Outcome {
		case "allow":
			pd.Allow += total
		case "soft":
			pd.Soft += total
		case "shadow":
			pd.Shadow += total
		case "hard":
			pd.Hard += total
			hard[ds.Policy] = ds.Counts
		}
	}
	// A request a limit refused, no policy deciding, is the series' policy
	// "none": it is shown under its limit's name instead.
	refused := s.gate.Refusals().Counts(series.Start, len(series.Requests))
	limits := make([]string, 0, len(refused))
	for l := range refused {
		limits = append(limits, l)
	}
	slices.Sort(limits)
	for _, l := range limits {
		none := hard[telemetry.None]
		counts := refused[l]
		var total int64
		for i, c := range counts {
			if i < len(none) {
				// The series and this count take their minute a moment
				// apart: the "none" row never goes below zero.
				c = min(c, none[i])
				none[i] -= c
				counts[i] = c
			}
			total += c
		}
		if total == 0 {
			continue
		}
		if pd := byPolicy[telemetry.None]; pd != nil {
			pd.Hard -= total
		}
		name := "limit " + l
		row(name).Hard += total
		hard[name] = counts
	}
	if pd := byPolicy[telemetry.None]; pd != nil && pd.Allow+pd.Soft+pd.Shadow+pd.Hard == 0 {
		delete(byPolicy, telemetry.None)
		order = slices.DeleteFunc(order, func(p string) bool { return p == telemetry.None })
	}
	for name, counts := range hard {
		pd := byPolicy[name]
		if pd == nil || pd.Hard == 0 {
			continue
		}
		for i, c := range counts {
			pd.Points = append(pd.Points, dashboard.CountPoint{T: minute(i), Count: c})
		}
	}
	shadow := s.tel.Shadow()
	for _, sc := range shadow {
		name := sc.Policy
		if name == "" {
			name = "limit " + sc.Limit
		}
		pd := row(name)
		if sc.Policy == "" {
			// Shadow limits are not in the policy series; show them here.
			pd.Shadow += sc.WouldBlockRecent
		}
		for _, t := range sc.Tenants {
			share := 0.0
			if t.RequestsRecent > 0 {
				share = float64(t.WouldBlockRecent) / float64(t.RequestsRecent)
			}
			d.Shadow = append(d.Shadow, dashboard.ShadowCount{Policy: sc.Policy, Limit: sc.Limit, Tenant: t.Tenant,
				WouldBlock: t.WouldBlockRecent, Share: min(share, 1)})
		}
	}
	for _, p := range order {
		d.Decisions = append(d.Decisions, *byPolicy[p])
	}
	for _, t := range s.tel.TopThrottled(20) {
		d.TopThrottled = append(d.TopThrottled, dashboard.Throttled{Key: t.Key, Limit: t.Limit, Tenant: t.Tenant, Count: t.Count})
	}
	return d, nil
}
