package admin

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/costgate/costgate/control"
	"github.com/costgate/costgate/replay"
)

// The policies' modes and their promotion: GET /admin/v1/policies, and
// POST /admin/v1/policies/{id}/promote/replay, .../promote and .../demote
// (see control.Plane.Promote).

func (s *Plane) policyRoutes(auth *http.ServeMux) {
	auth.HandleFunc("GET /admin/v1/policies", s.adminPolicies)
	auth.HandleFunc("POST /admin/v1/policies/{id}/promote/replay", s.withControl(s.promoteReplay))
	auth.HandleFunc("POST /admin/v1/policies/{id}/promote", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
		var body struct {
			ReplayID string `json:"replay_id"`
			Ack      string `json:"acknowledge_sha256"`
		}
		if !decode(w, r, &body) {
			return
		}
		pr, err := c.Promote(r.Context(), actor(r), r.PathValue("id"), body.ReplayID, body.Ack)
		if err != nil {
			writeControlErr(w, err)
			return
		}
		c.Refresh(r.Context())
		WriteJSON(w, http.StatusOK, map[string]any{"policy": pr.Policy, "mode": "enforce", "promotion": pr})
	}))
	auth.HandleFunc("POST /admin/v1/policies/{id}/demote", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
		var body struct {
			Reason string `json:"reason"`
		}
		if !decode(w, r, &body) {
			return
		}
		pr, err := c.Demote(r.Context(), actor(r), r.PathValue("id"), body.Reason)
		if err != nil {
			writeControlErr(w, err)
			return
		}
		c.Refresh(r.Context())
		WriteJSON(w, http.StatusOK, map[string]any{"policy": pr.Policy, "mode": "shadow", "demoted": pr})
	}))
}

// policyJSON is one policy as GET /admin/v1/policies shows it.
type policyJSON struct {
	ID    string   `json:"id"`
	Title string   `json:"title,omitempty"`
	Files []string `json:"files"`
	// Mode is "enforce" or "shadow", as this replica decides with it.
	Mode string `json:"mode"`
	// Declared is the mode its files declare.
	Declared     string             `json:"declared"`
	ShadowRule   bool               `json:"shadow_rule,omitempty"`
	SourceSHA256 string             `json:"source_sha256"`
	Promotion    *control.Promotion `json:"promotion,omitempty"`
	// Drifted: promoted for another source than the one loaded; the
	// policy stays in shadow.
	Drifted bool `json:"drifted,omitempty"`
}

func (s *Plane) adminPolicies(w http.ResponseWriter, _ *http.Request) {
	out := []policyJSON{}
	set := s.gate.Policies()
	proms := map[string]control.Promotion{}
	if s.control != nil {
		for _, pr := range s.control.Promotions() {
			proms[pr.Policy] = pr
		}
	}
	if set != nil {
		for _, p := range set.Policies() {
			pj := policyJSON{ID: p.ID, Title: p.Title, Files: p.Files, Mode: "enforce", Declared: "enforce",
				ShadowRule: p.ShadowRule, SourceSHA256: p.SourceSHA256}
			if p.Shadow || p.Promoted {
				pj.Declared = "shadow"
			}
			if p.Shadow {
				pj.Mode = "shadow"
			}
			if pr, ok := proms[p.ID]; ok {
				pj.Promotion = &pr
				pj.Drifted = pr.PolicySHA256 != p.SourceSHA256
			}
			out = append(out, pj)
		}
	}
	res := map[string]any{"policies": out}
	if set != nil {
		res["set_sha256"] = set.SourceSHA256()
	}
	WriteJSON(w, http.StatusOK, res)
}

// promoteReplay replays the captured traffic on the active policy set
// with the shadow policy {id} enforced, stores the report under a replay
// id with its SHA-256, and answers them.
func (s *Plane) promoteReplay(w http.ResponseWriter, r *http.Request, c *control.Plane) {
	var body struct {
		Since  string `json:"since"`
		Tenant string `json:"tenant"`
	}
	if !decode(w, r, &body) {
		return
	}
	var opts replay.Options
	if body.Since != "" {
		var err error
		if opts.Since, err = time.ParseDuration(body.Since); err != nil || opts.Since <= 0 {
			writeAdminError(w, http.StatusBadRequest, "since must be a positive duration, such as 24h")
			return
		}
	}
	opts.Tenant = body.Tenant
	id := r.PathValue("id")
	set := s.gate.Policies()
	if set == nil {
		writeAdminError(w, http.StatusNotFound, "no policy is configured")
		return
	}
	info, ok := set.Policy(id)
	switch {
	case !ok:
		writeAdminError(w, http.StatusNotFound, "no policy "+quote(id)+" is loaded")
		return
	case info.Promoted:
		writeAdminError(w, http.StatusConflict, "policy "+quote(id)+" is promoted already")
		return
	case !info.Shadow:
		writeAdminError(w, http.StatusConflict, "policy "+quote(id)+" is not a shadow policy: its files enforce it")
		return
	}
	cfg := s.gate.Config()
	if !cfg.Capture.Enabled {
		writeAdminError(w, http.StatusConflict, "capture is off on this replica: set capture.enabled to record traffic to replay")
		return
	}
	cand := set.Promote(map[string]string{id: info.SourceSHA256})
	rep, err := replay.RunSet(r.Context(), cand, cfg.CaptureDir(), opts)
	if replayFailed(w, err) {
		return
	}
	report, err := json.Marshal(rep)
	if err != nil {
		writeAdminError(w, http.StatusInternalServerError, err.Error())
		return
	}
	sum := control.Summary{Records: rep.Records, Replayed: rep.Replayed, Changed: rep.Changed,
		ChangedNanoUSD: int64(rep.ChangedCost), Transitions: map[string]int{}}
	for _, t := range rep.Transitions {
		sum.Transitions[t.Name()] = t.Count
	}
	doc := &control.ReplayDocument{Policy: id, PolicySHA256: info.SourceSHA256, SetSHA256: set.SourceSHA256(),
		Since: body.Since, Tenant: body.Tenant, At: time.Now().UTC(), Summary: sum, Report: report}
	pr, err := c.RecordReplay(r.Context(), actor(r), doc)
	if err != nil {
		writeControlErr(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, pr)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
