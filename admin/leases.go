package admin

import (
	"net/http"
	"time"
)

// adminLeases serves GET /admin/v1/leases: every limit and budget with its
// mode (strict or leased), the leases this replica holds on its keys, and
// the store calls the leases saved.
func (s *Plane) adminLeases(w http.ResponseWriter, _ *http.Request) {
	type keyJSON struct {
		Key         string     `json:"key"`
		Leases      int        `json:"leases"`
		Unspent     int64      `json:"unspent"`
		Debt        int64      `json:"debt,omitempty"`
		RatePerSec  int64      `json:"rate_per_second"`
		SpentUntil  *time.Time `json:"spent_until,omitempty"`
		LastAcquire *time.Time `json:"last_acquire,omitempty"`
	}
	type limitJSON struct {
		Name        string    `json:"name"`
		Mode        string    `json:"mode"`
		Budget      bool      `json:"budget,omitempty"`
		MaxUnits    int64     `json:"max_units,omitempty"`
		TTLMs       int64     `json:"ttl_ms,omitempty"`
		Outstanding int       `json:"leases_outstanding"`
		Unspent     int64     `json:"unspent"`
		Keys        []keyJSON `json:"keys"`
	}
	limits, st := s.gate.Leases()
	out := make([]limitJSON, 0, len(limits))
	for _, l := range limits {
		lj := limitJSON{Name: l.Name, Mode: l.Mode, Budget: l.Budget, MaxUnits: l.MaxUnits, TTLMs: l.TTL.Milliseconds(), Keys: []keyJSON{}}
		for _, k := range l.Keys {
			kj := keyJSON{Key: k.Key, Leases: k.Leases, Unspent: k.Unspent, Debt: k.Debt, RatePerSec: k.RatePerSec}
			if !k.SpentUntil.IsZero() {
				kj.SpentUntil = &k.SpentUntil
			}
			if !k.LastAcquire.IsZero() {
				kj.LastAcquire = &k.LastAcquire
			}
			lj.Outstanding += k.Leases
			lj.Unspent += k.Unspent
			lj.Keys = append(lj.Keys, kj)
		}
		out = append(out, lj)
	}
	WriteJSON(w, http.StatusOK, map[string]any{
		"limits": out,
		"store": map[string]int64{"decided_in_process": st.Local, "refused_in_process": st.Refused,
			"leases_taken": st.Acquired, "leases_returned": st.Returned, "store_calls": st.Calls,
			"reservations_pending": st.Pending},
		"regions": s.gate.Regions(),
	})
}
