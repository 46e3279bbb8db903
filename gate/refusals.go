package gate

import (
	"sync"
	"time"

	"github.com/costgate/costgate/telemetry"
)

// Refusals counts, per minute of the last hour, the requests each limit
// or budget refused when no policy decided: the dashboard shows them under
// the limit's name ("limit free-requests") rather than under the policy
// "none" that the telemetry series files them under. Its zero value is
// ready; it is safe for concurrent use.
type Refusals struct {
	mu      sync.Mutex
	minutes map[int64]map[string]int64 // Unix minute -> limit name -> refusals
}

// record counts d, the decision of a request, when blocked (the limit that
// refused it) decided it without a policy.
func (r *Refusals) record(d telemetry.Decision, blocked *compiledLimit) {
	if blocked == nil || d.Shadow || d.Outcome != "hard" || d.Policy != "" {
		return
	}
	r.add(time.Now(), blocked.limit.Name)
}

func (r *Refusals) add(now time.Time, limit string) {
	m := now.Unix() / 60
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.minutes == nil {
		r.minutes = map[int64]map[string]int64{}
	}
	byLimit := r.minutes[m]
	if byLimit == nil {
		byLimit = map[string]int64{}
		r.minutes[m] = byLimit
		for old := range r.minutes {
			if old <= m-telemetry.SeriesMinutes {
				delete(r.minutes, old)
			}
		}
	}
	byLimit[limit]++
}

// Counts returns the refusals of each limit in the n minutes from start.
func (r *Refusals) Counts(start time.Time, n int) map[string][]int64 {
	first := start.Unix() / 60
	out := map[string][]int64{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for m, byLimit := range r.minutes {
		i := m - first
		if i < 0 || i >= int64(n) {
			continue
		}
		for limit, c := range byLimit {
			if out[limit] == nil {
				out[limit] = make([]int64, n)
			}
			out[limit][i] += c
		}
	}
	return out
}
