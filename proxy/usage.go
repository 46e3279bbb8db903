package proxy

import (
	"net/http"
	"time"

	"github.com/costgate/costgate/admin"
	"github.com/costgate/costgate/ledger"
)

// serveUsage is GET /v1/costgate/usage: the calling tenant's own spend and
// limits, never another's.
func (s *Server) serveUsage(w http.ResponseWriter, r *http.Request) {
	c := s.gate.Identify(apiKey(r))
	if c == nil {
		writeError(w, r.URL.Path, http.StatusUnauthorized, apiError{Type: "authentication_error", Code: "invalid_api_key", Message: "missing or unknown API key"})
		return
	}
	var spends []admin.SpendJSON
	for _, p := range []string{"day", "month"} {
		sp, err := admin.Spend(r.Context(), s.ledger, ledger.SpendQuery{Tenant: c.Tenant, Period: p})
		if err != nil {
			admin.WriteErr(w, err)
			return
		}
		spends = append(spends, sp)
	}
	type limitJSON struct {
		Name      string `json:"name"`
		Unit      string `json:"unit"`
		Capacity  int64  `json:"capacity"`
		Remaining int64  `json:"remaining"`
		ResetS    int64  `json:"reset_seconds"`
	}
	states, err := s.gate.CallerLimits(r.Context(), c)
	if err != nil {
		admin.WriteErr(w, err)
		return
	}
	limits := []limitJSON{}
	for _, l := range states {
		limits = append(limits, limitJSON{Name: l.Name, Unit: l.Unit, Capacity: l.Capacity,
			Remaining: l.Remaining, ResetS: int64(l.ResetAfter / time.Second)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": c.Tenant, "plan": c.Plan, "spend": spends, "limits": limits})
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) { admin.WriteJSON(w, status, v) }
