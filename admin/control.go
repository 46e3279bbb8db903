package admin

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/costgate/costgate/control"
)

// The control plane's routes: tenants, teams, users and keys, their
// budgets, the audit log and the alerts (see package control).

//go:embed openapi.json
var openapiJSON []byte

// kinds are the control plane's collections, by their path segment.
var kinds = map[string]control.Kind{
	"tenants": control.KindTenant, "teams": control.KindTeam, "users": control.KindUser, "keys": control.KindKey,
}

func (s *Plane) controlRoutes(auth *http.ServeMux) {
	auth.HandleFunc("GET /admin/v1/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openapiJSON)
	})
	for seg, kind := range kinds {
		auth.HandleFunc("POST /admin/v1/"+seg, s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
			s.controlCreate(w, r, c, kind)
		}))
		auth.HandleFunc("GET /admin/v1/"+seg, s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
			s.controlList(w, r, c, kind)
		}))
		auth.HandleFunc("GET /admin/v1/"+seg+"/{id}", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
			s.controlGet(w, r, c, kind)
		}))
		auth.HandleFunc("PATCH /admin/v1/"+seg+"/{id}", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
			var p control.Patch
			if !decode(w, r, &p) {
				return
			}
			e, err := c.Update(r.Context(), actor(r), kind, r.PathValue("id"), p)
			s.changed(w, r, c, http.StatusOK, e, err)
		}))
		auth.HandleFunc("POST /admin/v1/"+seg+"/{id}/budgets/{budget}/reset", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
			if !decode(w, r, &struct{}{}) {
				return
			}
			e, err := c.ResetBudget(r.Context(), actor(r), kind, r.PathValue("id"), r.PathValue("budget"))
			s.changed(w, r, c, http.StatusOK, e, err)
		}))
		auth.HandleFunc("POST /admin/v1/"+seg+"/{id}/budgets/{budget}/raise", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
			var body struct {
				AmountUSD string     `json:"amount_usd"`
				Until     *time.Time `json:"until"`
				For       string     `json:"for"`
			}
			if !decode(w, r, &body) {
				return
			}
			until, err := raiseUntil(body.Until, body.For)
			if err != nil {
				writeControlErr(w, err)
				return
			}
			e, err := c.RaiseBudget(r.Context(), actor(r), kind, r.PathValue("id"), r.PathValue("budget"), body.AmountUSD, until)
			s.changed(w, r, c, http.StatusOK, e, err)
		}))
	}
	auth.HandleFunc("DELETE /admin/v1/keys/{id}", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
		e, err := c.Revoke(r.Context(), actor(r), r.PathValue("id"))
		s.changed(w, r, c, http.StatusOK, e, err)
	}))
	auth.HandleFunc("POST /admin/v1/keys/{id}/rotate", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
		var body struct {
			Grace string `json:"grace"`
		}
		if !decode(w, r, &body) {
			return
		}
		grace := time.Hour
		if body.Grace != "" {
			var err error
			if grace, err = time.ParseDuration(body.Grace); err != nil {
				writeAdminError(w, http.StatusBadRequest, fmt.Sprintf("grace %q: want a duration such as 1h", body.Grace))
				return
			}
		}
		e, secret, err := c.Rotate(r.Context(), actor(r), r.PathValue("id"), grace)
		if err != nil {
			writeControlErr(w, err)
			return
		}
		c.Refresh(r.Context())
		WriteJSON(w, http.StatusOK, keyCreated{Entity: e, Key: secret})
	}))
	auth.HandleFunc("GET /admin/v1/keys/{id}/levels", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
		e, err := c.Get(r.Context(), control.KindKey, r.PathValue("id"))
		if err != nil {
			writeControlErr(w, err)
			return
		}
		lv, err := c.KeyLevels(r.Context(), e)
		if err != nil {
			writeControlErr(w, err)
			return
		}
		WriteJSON(w, http.StatusOK, map[string]any{"key": e.ID, "tenant": e.Tenant, "team": e.Team, "user": e.User, "levels": lv})
	}))
	auth.HandleFunc("GET /admin/v1/audit", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
		q := r.URL.Query()
		limit, ok := pageSize(w, q.Get("limit"))
		if !ok {
			return
		}
		var before int64
		if v := q.Get("before"); v != "" {
			var err error
			if before, err = strconv.ParseInt(v, 10, 64); err != nil || before < 1 {
				writeAdminError(w, http.StatusBadRequest, "before must be an audit entry's id")
				return
			}
		}
		es, err := c.Audit(r.Context(), control.AuditQuery{Entity: q.Get("entity"), Tenant: q.Get("tenant"), Before: before, Limit: limit})
		if err != nil {
			writeControlErr(w, err)
			return
		}
		out := map[string]any{"audit": es}
		if len(es) == limit {
			out["next"] = strconv.FormatInt(es[len(es)-1].ID, 10)
		}
		WriteJSON(w, http.StatusOK, out)
	}))
	auth.HandleFunc("GET /admin/v1/alerts", s.withControl(func(w http.ResponseWriter, r *http.Request, c *control.Plane) {
		limit, ok := pageSize(w, r.URL.Query().Get("limit"))
		if !ok {
			return
		}
		ds, err := c.Alerts(r.Context(), limit)
		if err != nil {
			writeControlErr(w, err)
			return
		}
		WriteJSON(w, http.StatusOK, map[string]any{"alerts": ds})
	}))
}

// withControl answers 404 when the control plane is off.
func (s *Plane) withControl(h func(http.ResponseWriter, *http.Request, *control.Plane)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.control == nil {
			writeAdminError(w, http.StatusNotFound, "the control plane is off (control.disabled)")
			return
		}
		h(w, r, s.control)
	}
}

// createBody is what a create accepts; which fields apply depends on the
// kind (a key has no name, a tenant no team).
type createBody struct {
	Name      string            `json:"name"`
	Tenant    string            `json:"tenant"`
	Team      string            `json:"team"`
	User      string            `json:"user"`
	Plan      string            `json:"plan"`
	Budgets   []control.Budget  `json:"budgets"`
	Limits    []control.Limit   `json:"limits"`
	Models    []string          `json:"models"`
	Routes    []string          `json:"routes"`
	Metadata  map[string]string `json:"metadata"`
	ExpiresAt *time.Time        `json:"expires_at"`
}

// keyCreated is a key with its secret, shown this once.
type keyCreated struct {
	*control.Entity
	Key string `json:"key"`
}

func (s *Plane) controlCreate(w http.ResponseWriter, r *http.Request, c *control.Plane, kind control.Kind) {
	var b createBody
	if !decode(w, r, &b) {
		return
	}
	e := &control.Entity{Kind: kind, Name: b.Name, Tenant: b.Tenant, Team: b.Team, User: b.User, Plan: b.Plan,
		Budgets: b.Budgets, Limits: b.Limits, Models: b.Models, Routes: b.Routes, Metadata: b.Metadata, ExpiresAt: b.ExpiresAt}
	var (
		err    error
		secret string
	)
	switch kind {
	case control.KindTenant:
		if b.Team != "" || b.User != "" {
			writeAdminError(w, http.StatusBadRequest, "a tenant has no team or user")
			return
		}
		e, err = c.CreateTenant(r.Context(), actor(r), e)
	case control.KindTeam, control.KindUser:
		e, err = c.CreateMember(r.Context(), actor(r), e)
	case control.KindKey:
		e, secret, err = c.CreateKey(r.Context(), actor(r), e)
	}
	if err != nil {
		writeControlErr(w, err)
		return
	}
	c.Refresh(r.Context())
	w.Header().Set("Location", "/admin/v1/"+string(kind)+"s/"+e.ID)
	if kind == control.KindKey {
		WriteJSON(w, http.StatusCreated, keyCreated{Entity: e, Key: secret})
		return
	}
	WriteJSON(w, http.StatusCreated, e)
}

// changed answers a change: the entity, after this replica has loaded it.
func (s *Plane) changed(w http.ResponseWriter, r *http.Request, c *control.Plane, status int, e *control.Entity, err error) {
	if err != nil {
		writeControlErr(w, err)
		return
	}
	c.Refresh(r.Context())
	WriteJSON(w, status, e)
}

func (s *Plane) controlGet(w http.ResponseWriter, r *http.Request, c *control.Plane, kind control.Kind) {
	e, err := c.Get(r.Context(), kind, r.PathValue("id"))
	if err != nil {
		writeControlErr(w, err)
		return
	}
	out := map[string]any{}
	b, _ := json.Marshal(e)
	_ = json.Unmarshal(b, &out)
	if kind == control.KindKey {
		lv, err := c.KeyLevels(r.Context(), e)
		if err == nil {
			out["levels"] = lv
		}
	} else if e.Source == "api" {
		lv, err := c.EntityLevels(r.Context(), e)
		if err == nil {
			out["state"] = lv
		}
	}
	WriteJSON(w, http.StatusOK, out)
}

func (s *Plane) controlList(w http.ResponseWriter, r *http.Request, c *control.Plane, kind control.Kind) {
	q := r.URL.Query()
	limit, ok := pageSize(w, q.Get("limit"))
	if !ok {
		return
	}
	for k := range q {
		switch k {
		case "limit", "after", "tenant", "team", "user":
		default:
			writeAdminError(w, http.StatusBadRequest, fmt.Sprintf("unknown filter %q (want tenant, team, user, after, limit)", k))
			return
		}
	}
	if kind != control.KindKey && (q.Get("team") != "" || q.Get("user") != "") {
		writeAdminError(w, http.StatusBadRequest, "team and user filter keys only")
		return
	}
	if (q.Get("team") != "" || q.Get("user") != "") && q.Get("tenant") == "" {
		// A team's or user's name is unique within its tenant only: the
		// keys of every tenant's team "ops" are not one team's keys (to
		// revoke them, say).
		writeAdminError(w, http.StatusBadRequest, "team and user are names within a tenant: give tenant too")
		return
	}
	es, err := c.List(r.Context(), control.Query{Kind: kind, Tenant: q.Get("tenant"), Team: q.Get("team"), User: q.Get("user"), After: q.Get("after"), Limit: limit})
	if err != nil {
		writeControlErr(w, err)
		return
	}
	out := map[string]any{}
	if len(es) == limit {
		out["next"] = es[len(es)-1].ID
	}
	if kind == control.KindTenant && q.Get("after") == "" {
		// The config file's tenants, read-only, head the first page.
		var cfgTenants []*control.Entity
		for _, t := range c.ConfigTenants() {
			if q.Get("tenant") == "" || q.Get("tenant") == t.Name {
				cfgTenants = append(cfgTenants, t)
			}
		}
		es = append(cfgTenants, es...)
	}
	out[string(kind)+"s"] = es
	WriteJSON(w, http.StatusOK, out)
}

func pageSize(w http.ResponseWriter, v string) (int, bool) {
	if v == "" {
		return 100, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		writeAdminError(w, http.StatusBadRequest, "limit must be a whole number from 1 to 1000")
		return 0, false
	}
	return n, true
}

func raiseUntil(until *time.Time, dur string) (time.Time, error) {
	switch {
	case until != nil && dur != "":
		return time.Time{}, fmt.Errorf("%w: give until or for, not both", control.ErrInvalid)
	case until != nil:
		return *until, nil
	case dur != "":
		d, err := time.ParseDuration(dur)
		if err != nil || d <= 0 {
			return time.Time{}, fmt.Errorf("%w: for %q: want a positive duration such as 24h", control.ErrInvalid, dur)
		}
		return time.Now().Add(d), nil
	}
	return time.Time{}, fmt.Errorf("%w: until (RFC 3339) or for (a duration) is required", control.ErrInvalid)
}

// maxControlBody bounds a control-plane request's body.
const maxControlBody = 1 << 20

// decode reads a JSON body into v: unknown fields, trailing data and
// bodies over 1 MiB are 400. An empty body is an empty object.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxControlBody+1))
	if err != nil {
		writeAdminError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return false
	}
	if len(b) > maxControlBody {
		writeAdminError(w, http.StatusRequestEntityTooLarge, "the body is over 1 MiB")
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeAdminError(w, http.StatusBadRequest, "invalid JSON body: "+strings.TrimPrefix(err.Error(), "json: "))
		return false
	}
	if dec.More() {
		writeAdminError(w, http.StatusBadRequest, "invalid JSON body: data after the object")
		return false
	}
	return true
}

// writeControlErr answers a control-plane error: 400 invalid, 404 not
// found, 409 conflict or read-only, 503 when the database is down.
func writeControlErr(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, control.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, control.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, control.ErrConflict), errors.Is(err, control.ErrReadOnly):
		status = http.StatusConflict
	case control.IsStoreDown(err), errors.Is(err, context.DeadlineExceeded):
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
		err = errors.New("the control plane's database is unavailable; the data plane keeps serving from each replica's last copy")
	}
	writeAdminError(w, status, err.Error())
}

type actorKey struct{}

// actor is who makes a change, for the audit log: the token's role, and
// the Costgate-Actor header a caller names itself with (the CLI sends the
// user's login).
func actor(r *http.Request) string {
	role, _ := r.Context().Value(actorKey{}).(string)
	if role == "" {
		role = "admin"
	}
	if who := r.Header.Get("Costgate-Actor"); who != "" {
		if len(who) > 128 {
			who = who[:128]
		}
		return role + ":" + strings.Map(func(c rune) rune {
			if c < 0x20 || c == 0x7f {
				return -1
			}
			return c
		}, who)
	}
	return role
}
