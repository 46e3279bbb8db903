package telemetry

// The dashboard's time series are 60 one-minute buckets in a ring indexed by
// the Unix minute modulo 60. Each bucket is an array of atomic counters laid
// out by label id (tenant id, policy id × outcome), so that recording is a
// few atomic adds and never allocates. A bucket whose stored minute is stale
// is zeroed by the first writer of the new minute, under a mutex. A writer
// more than an hour late (only possible with a clock that jumps) would add to
// the bucket that replaced its own; that is accepted.

import (
	"sync"
	"sync/atomic"
	"time"
)

// SeriesMinutes is the number of one-minute buckets in a Series.
const SeriesMinutes = 60

// Series is the last hour of activity in one-minute buckets, for the
// dashboard's charts. Every slice has SeriesMinutes entries, oldest first;
// entry i covers [Start+i minutes, Start+i+1 minutes), and the last entry is
// the current, still-filling minute. Tenants, policies and outcomes are the
// folded label values used on the metrics (see Config.MaxTenants and Other).
type Series struct {
	Start time.Time `json:"start"` // start of the oldest bucket, UTC, on a minute
	// Requests counts enforced decisions (Decision calls with Shadow false).
	Requests []int64 `json:"requests"`
	// RequestsByTenant and SpendNanoUSD are per tenant; only tenants with a
	// non-zero value in the hour appear. Spend is in nano-US-dollars, from
	// Usage.
	RequestsByTenant map[string][]int64 `json:"requests_by_tenant"`
	SpendNanoUSD     map[string][]int64 `json:"spend_nano_usd"`
	// Decisions has one entry per policy and outcome with a non-zero count in
	// the hour, ordered by policy then outcome (allow, soft, hard, other,
	// shadow).
	Decisions []DecisionSeries `json:"decisions"`
}

// DecisionSeries is the per-minute count of decisions by one policy with one
// outcome: "allow", "soft", "hard" (enforced decisions, "other" for an
// unknown outcome) or "shadow" (would-blocks of the policy in shadow mode,
// which are not requests).
type DecisionSeries struct {
	Policy  string  `json:"policy"`
	Outcome string  `json:"outcome"`
	Counts  []int64 `json:"counts"`
}

type seriesBucket struct {
	minute    atomic.Int64 // Unix minute this bucket holds; -1 when never used
	requests  atomic.Int64
	tenantReq []atomic.Int64 // by tenant id
	spend     []atomic.Int64 // by tenant id, nano-USD
	decisions []atomic.Int64 // by policy id*numSeriesOutcomes + outcome id
}

type series struct {
	mu      sync.Mutex // serialises bucket resets
	buckets [SeriesMinutes]seriesBucket
}

func newSeries(tenants, policies int) *series {
	s := &series{}
	for i := range s.buckets {
		b := &s.buckets[i]
		b.minute.Store(-1)
		b.tenantReq = make([]atomic.Int64, tenants)
		b.spend = make([]atomic.Int64, tenants)
		b.decisions = make([]atomic.Int64, policies*numSeriesOutcomes)
	}
	return s
}

func unixMinute(t time.Time) int64 { return t.Unix() / 60 }

// bucket returns the bucket for minute m, zeroing it first if it holds an
// older minute. It returns nil for a minute older than the bucket's (a write
// that arrives after its bucket was reused).
func (s *series) bucket(m int64) *seriesBucket {
	b := &s.buckets[m%SeriesMinutes]
	if got := b.minute.Load(); got == m {
		return b
	} else if got > m {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if got := b.minute.Load(); got == m {
		return b
	} else if got > m {
		return nil
	}
	b.requests.Store(0)
	for i := range b.tenantReq {
		b.tenantReq[i].Store(0)
		b.spend[i].Store(0)
	}
	for i := range b.decisions {
		b.decisions[i].Store(0)
	}
	b.minute.Store(m)
	return b
}

func (s *series) decision(now time.Time, tenant, policy, outcome int) {
	b := s.bucket(unixMinute(now))
	if b == nil {
		return
	}
	b.requests.Add(1)
	b.tenantReq[tenant].Add(1)
	b.decisions[policy*numSeriesOutcomes+outcome].Add(1)
}

// shadow counts a would-block of a shadow policy; it is not a request.
func (s *series) shadow(now time.Time, policy int) {
	b := s.bucket(unixMinute(now))
	if b == nil {
		return
	}
	b.decisions[policy*numSeriesOutcomes+seriesShadow].Add(1)
}

func (s *series) spendAdd(now time.Time, tenant int, nanoUSD int64) {
	b := s.bucket(unixMinute(now))
	if b == nil {
		return
	}
	b.spend[tenant].Add(nanoUSD)
}

// tenantRequests sums tenant's requests over the last minutes minutes
// (including the current one).
func (s *series) tenantRequests(now time.Time, tenant, minutes int) int64 {
	m := unixMinute(now)
	var sum int64
	for i := 0; i < minutes && i < SeriesMinutes; i++ {
		b := &s.buckets[(m-int64(i))%SeriesMinutes]
		if b.minute.Load() == m-int64(i) {
			sum += b.tenantReq[tenant].Load()
		}
	}
	return sum
}

// snapshot builds the Series ending at now's minute. Concurrent writes may or
// may not be included; each counter is read once.
func (s *series) snapshot(now time.Time, tenants, policies *labelSet) Series {
	last := unixMinute(now)
	first := last - SeriesMinutes + 1
	out := Series{
		Start:            time.Unix(first*60, 0).UTC(),
		Requests:         make([]int64, SeriesMinutes),
		RequestsByTenant: map[string][]int64{},
		SpendNanoUSD:     map[string][]int64{},
		Decisions:        []DecisionSeries{},
	}
	nt := len(s.buckets[0].tenantReq)
	nd := len(s.buckets[0].decisions)
	reqs := make([][]int64, nt)
	spend := make([][]int64, nt)
	decs := make([][]int64, nd)
	row := func(rows [][]int64, id int) []int64 {
		if rows[id] == nil {
			rows[id] = make([]int64, SeriesMinutes)
		}
		return rows[id]
	}
	for i := range SeriesMinutes {
		m := first + int64(i)
		b := &s.buckets[m%SeriesMinutes]
		if b.minute.Load() != m {
			continue
		}
		out.Requests[i] = b.requests.Load()
		for id := range nt {
			if v := b.tenantReq[id].Load(); v != 0 {
				row(reqs, id)[i] = v
			}
			if v := b.spend[id].Load(); v != 0 {
				row(spend, id)[i] = v
			}
		}
		for id := range nd {
			if v := b.decisions[id].Load(); v != 0 {
				row(decs, id)[i] = v
			}
		}
	}
	for id := range nt {
		if reqs[id] != nil {
			out.RequestsByTenant[tenants.name(id)] = reqs[id]
		}
		if spend[id] != nil {
			out.SpendNanoUSD[tenants.name(id)] = spend[id]
		}
	}
	for id := range nd {
		if decs[id] != nil {
			out.Decisions = append(out.Decisions, DecisionSeries{
				Policy:  policies.name(id / numSeriesOutcomes),
				Outcome: outcomeNames[id%numSeriesOutcomes],
				Counts:  decs[id],
			})
		}
	}
	sortDecisionSeries(out.Decisions)
	return out
}
