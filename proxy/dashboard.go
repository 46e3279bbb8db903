package proxy

import (
	"context"
	"time"

	"github.com/costgate/costgate/dashboard"
	"github.com/costgate/costgate/telemetry"
)

// dashboardData fills the dashboard from the telemetry of this replica.
func (s *Server) dashboardData(ctx context.Context) (dashboard.Data, error) {
	st := s.state.Load()
	series := s.tel.Series()
	d := dashboard.Data{GeneratedAt: time.Now().UTC()}

	d.Store = dashboard.StoreHealth{Kind: "memory", Healthy: true, Breaker: string(telemetry.BreakerClosed)}
	if st.cfg.Store.Redis != "" {
		d.Store.Kind = "redis"
	}
	if s.breaker != nil {
		d.Store.Breaker = string(s.breaker.State())
	}
	if s.ping != nil {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		d.Store.Healthy = s.ping(pctx) == nil
		cancel()
	}
	d.Store.FailOpenTotal = s.tel.FailOpenTotal()

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
	for _, ds := range series.Decisions {
		pd := byPolicy[ds.Policy]
		if pd == nil {
			pd = &dashboard.PolicyDecisions{Policy: ds.Policy}
			byPolicy[ds.Policy] = pd
			order = append(order, ds.Policy)
		}
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
			for i, c := range ds.Counts {
				pd.Points = append(pd.Points, dashboard.CountPoint{T: minute(i), Count: c})
			}
		}
	}
	shadow := s.tel.Shadow()
	for _, sc := range shadow {
		name := sc.Policy
		if name == "" {
			name = "limit " + sc.Limit
		}
		pd := byPolicy[name]
		if pd == nil {
			pd = &dashboard.PolicyDecisions{Policy: name}
			byPolicy[name] = pd
			order = append(order, name)
		}
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
