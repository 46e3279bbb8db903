package telemetry

import (
	"sort"
	"sync"
	"time"
)

// ShadowCount is what one shadow-mode limit or policy would have blocked:
// the decisions it would have turned into a refusal or friction while it was
// not enforced. Recent counts cover the last WindowSeconds (Config.Window,
// rounded up to whole minutes, the current minute included).
type ShadowCount struct {
	Policy           string         `json:"policy"`
	Limit            string         `json:"limit"`
	WouldBlock       int64          `json:"would_block"`        // since the Telemetry started
	WouldBlockRecent int64          `json:"would_block_recent"` // in the last window
	WindowSeconds    int64          `json:"window_seconds"`
	Tenants          []ShadowTenant `json:"tenants"` // by descending WouldBlock
}

// ShadowTenant is one tenant's share of a ShadowCount, beside the tenant's
// enforced request count over the same spans, so that a dashboard can show
// what fraction of the tenant's traffic the policy would block.
type ShadowTenant struct {
	Tenant           string `json:"tenant"`
	WouldBlock       int64  `json:"would_block"`
	WouldBlockRecent int64  `json:"would_block_recent"`
	Requests         int64  `json:"requests"`        // enforced decisions since start
	RequestsRecent   int64  `json:"requests_recent"` // enforced decisions in the window
}

// minuteRing counts events in one-minute buckets over the last len(buckets)
// minutes. It is not safe for concurrent use.
type minuteRing struct {
	minutes []int64
	counts  []int64
}

func newMinuteRing(n int) minuteRing {
	return minuteRing{minutes: make([]int64, n), counts: make([]int64, n)}
}

func (r *minuteRing) add(m int64, n int64) {
	i := m % int64(len(r.minutes))
	if r.minutes[i] != m {
		r.minutes[i], r.counts[i] = m, 0
	}
	r.counts[i] += n
}

func (r *minuteRing) sum(now int64) int64 {
	var s int64
	for i, m := range r.minutes {
		if m > now-int64(len(r.minutes)) && m <= now {
			s += r.counts[i]
		}
	}
	return s
}

type shadowKey struct{ policy, limit int }

type shadowCounts struct {
	total  int64
	recent minuteRing
}

type shadowEntry struct {
	shadowCounts
	tenants map[int]*shadowCounts
}

// shadowState is safe for concurrent use. Its size is bounded by the policy,
// limit and tenant label bounds.
type shadowState struct {
	minutes int
	mu      sync.Mutex
	entries map[shadowKey]*shadowEntry
}

func newShadowState(window time.Duration) *shadowState {
	minutes := int((window + time.Minute - 1) / time.Minute)
	return &shadowState{minutes: minutes, entries: map[shadowKey]*shadowEntry{}}
}

func (s *shadowState) add(now time.Time, policy, limit, tenant int) {
	m := unixMinute(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[shadowKey{policy, limit}]
	if e == nil {
		e = &shadowEntry{shadowCounts: shadowCounts{recent: newMinuteRing(s.minutes)}, tenants: map[int]*shadowCounts{}}
		s.entries[shadowKey{policy, limit}] = e
	}
	e.total++
	e.recent.add(m, 1)
	tc := e.tenants[tenant]
	if tc == nil {
		tc = &shadowCounts{recent: newMinuteRing(s.minutes)}
		e.tenants[tenant] = tc
	}
	tc.total++
	tc.recent.add(m, 1)
}

func (t *Telemetry) shadowSnapshot(now time.Time) []ShadowCount {
	s := t.shadow
	m := unixMinute(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ShadowCount, 0, len(s.entries))
	for k, e := range s.entries {
		sc := ShadowCount{
			Policy:           t.policies.name(k.policy),
			Limit:            t.limits.name(k.limit),
			WouldBlock:       e.total,
			WouldBlockRecent: e.recent.sum(m),
			WindowSeconds:    int64(s.minutes) * 60,
			Tenants:          make([]ShadowTenant, 0, len(e.tenants)),
		}
		for id, tc := range e.tenants {
			sc.Tenants = append(sc.Tenants, ShadowTenant{
				Tenant:           t.tenants.name(id),
				WouldBlock:       tc.total,
				WouldBlockRecent: tc.recent.sum(m),
				Requests:         t.tenantRequests[id].Load(),
				RequestsRecent:   t.series.tenantRequests(now, id, s.minutes),
			})
		}
		sort.Slice(sc.Tenants, func(i, j int) bool {
			a, b := sc.Tenants[i], sc.Tenants[j]
			if a.WouldBlock != b.WouldBlock {
				return a.WouldBlock > b.WouldBlock
			}
			return a.Tenant < b.Tenant
		})
		out = append(out, sc)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Policy != out[j].Policy {
			return out[i].Policy < out[j].Policy
		}
		return out[i].Limit < out[j].Limit
	})
	return out
}

func sortDecisionSeries(d []DecisionSeries) {
	sort.Slice(d, func(i, j int) bool {
		if d[i].Policy != d[j].Policy {
			return d[i].Policy < d[j].Policy
		}
		return seriesOutcomeID(d[i].Outcome) < seriesOutcomeID(d[j].Outcome)
	})
}
