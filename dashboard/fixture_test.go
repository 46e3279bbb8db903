package dashboard

import (
	"fmt"
	"strings"
	"time"
)

// sampleNow is the end of the sample window: a fixed instant, so that the
// page's minute labels and the expected numbers do not depend on the clock.
var sampleNow = time.Date(2026, 11, 30, 10, 45, 30, 0, time.UTC)

// The keys and rows the tests look for on the page.
const (
	topKey        = "tenant:globex|ip:203.0.113.77"
	markupKey     = `tenant:initech|user:<img src=x id=injected>`
	shadowPolicy  = "costgate.policies.ip_abuse"
	shadowLimit   = "per-ip-requests"
	shadowTenant  = "globex"
	shadowShare   = 0.40
	shadowBlocked = int64(5_312)
)

// sampleData is a realistic hour: three tenants, one of which (globex)
// ramps up in the last twenty minutes and is the one the shadow IP-abuse
// policy would block 40% of; initech spends little and not every minute.
func sampleData(now time.Time) Data {
	end := now.Truncate(time.Minute)
	minute := func(i int) time.Time { return end.Add(time.Duration(i-59) * time.Minute) }
	var acme, globex, initech []Point
	var plansHard, abuseHard []CountPoint
	for i := range 60 {
		// acme: steady, $0.15 to $0.22 a minute.
		acme = append(acme, Point{T: minute(i), NanoUSD: 150_000_000 + int64((i*37)%71)*1_000_000 + 123})
		// globex: $0.05 a minute, then a ramp to about $0.9 a minute.
		g := int64(50_000_000 + (i%5)*3_000_000)
		if i >= 40 {
			g += int64(i-39) * 42_000_000
		}
		globex = append(globex, Point{T: minute(i), NanoUSD: g})
		// initech: a few tenths of a cent, in two minutes out of three.
		if i%3 != 0 {
			initech = append(initech, Point{T: minute(i), NanoUSD: 3_500_000 + int64(i)*10_001})
		}
		if i >= 40 {
			plansHard = append(plansHard, CountPoint{T: minute(i), Count: int64(i-39) * 3})
		}
		if i%7 == 0 {
			abuseHard = append(abuseHard, CountPoint{T: minute(i), Count: 1})
		}
	}
	return Data{
		GeneratedAt: now,
		Store:       StoreHealth{Kind: "redis", Healthy: true, Breaker: "half_open", FailOpenTotal: 1_742},
		Spend: []TenantSeries{
			{Tenant: "acme", Points: acme},
			{Tenant: "globex", Points: globex},
			{Tenant: "initech", Points: initech},
		},
		Decisions: []PolicyDecisions{
			{Policy: "costgate.policies.plans", Allow: 48_210, Soft: 1_320, Hard: sumCounts(plansHard), Points: plansHard},
			{Policy: "costgate.policies.budget", Allow: 49_105, Soft: 611, Hard: 38,
				Points: []CountPoint{{T: minute(58), Count: 20}, {T: minute(59), Count: 18}}},
			{Policy: "costgate.policies.search_pagination", Allow: 3_120, Hard: sumCounts(abuseHard), Points: abuseHard},
			{Policy: shadowPolicy, Allow: 44_969, Shadow: 5_312 + 41},
		},
		TopThrottled: []Throttled{
			{Key: "tenant:acme|model:gpt-4o", Limit: "pro-tokens", Tenant: "acme", Count: 211},
			{Key: topKey, Limit: "free-requests", Tenant: "globex", Count: 1_204},
			{Key: "tenant:globex|ip:198.51.100.4", Limit: "free-requests", Tenant: "globex", Count: 366},
			{Key: markupKey, Limit: "free-tokens", Tenant: "initech", Count: 12},
		},
		Shadow: []ShadowCount{
			{Policy: shadowPolicy, Limit: shadowLimit, Tenant: "acme", WouldBlock: 41, Share: 0.0016},
			{Policy: shadowPolicy, Limit: shadowLimit, Tenant: shadowTenant, WouldBlock: shadowBlocked, Share: shadowShare},
		},
		Limits: []LimitMode{
			{Name: "free-requests", Mode: "strict"},
			{Name: "global-tokens", Mode: "leased", Keys: 2, Leases: 3, Unspent: 4_200},
			{Name: "daily", Mode: "strict", Budget: true},
		},
		Region: &RegionState{Region: "eu", Regions: []string{"eu", "us"}, LastOK: now.Add(-5 * time.Second), LastError: "dial tcp: connection refused"},
		Replay: &ReplaySummary{
			At: now.Add(-10 * time.Minute), Files: []string{"plans.rego"}, Since: "24h",
			Replayed: 12_480, Changed: 312, ChangedNanoUSD: 4_210_000_000,
			Transitions: []ReplayCount{{Name: "allow->hard", Count: 300, NanoUSD: 4_000_000_000}, {Name: "soft->hard", Count: 12, NanoUSD: 210_000_000}},
			Policies:    []ReplayCount{{Name: "costgate.policies.plans", Count: 312, NanoUSD: 4_210_000_000}},
			Tenants:     []ReplayCount{{Name: shadowTenant, Count: 312, NanoUSD: 4_210_000_000}},
		},
	}
}

func sumCounts(ps []CountPoint) int64 {
	var n int64
	for _, p := range ps {
		n += p.Count
	}
	return n
}

func sumSpend(ps []Point) int64 {
	var n int64
	for _, p := range ps {
		n += p.NanoUSD
	}
	return n
}

// formatMoney is the reference for the page's choice of precision: cents
// from a dollar up (and for zero), four decimals from a cent, six from a
// micro-dollar, all nine below.
func formatMoney(n int64) string {
	a := n
	if a < 0 {
		a = -a
	}
	switch {
	case a == 0 || a >= 1_000_000_000:
		return formatUSD(n, 2)
	case a >= 10_000_000:
		return formatUSD(n, 4)
	case a >= 1_000:
		return formatUSD(n, 6)
	}
	return formatUSD(n, 9)
}

// formatUSD is the reference for the page's money format: n nano-dollars as
// dollars with the given number of decimals, rounded half away from zero, in
// integer arithmetic, with thousands separators.
func formatUSD(n int64, decimals int) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	unit := int64(1)
	for range 9 - decimals {
		unit *= 10
	}
	n = (n + unit/2) / unit
	scale := int64(1)
	for range decimals {
		scale *= 10
	}
	whole := fmt.Sprint(n / scale)
	var b strings.Builder
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	s := "$" + b.String()
	if decimals > 0 {
		s += fmt.Sprintf(".%0*d", decimals, n%scale)
	}
	if n == 0 {
		sign = ""
	}
	return sign + s
}
