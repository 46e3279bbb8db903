package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/control"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/dashboard"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/telemetry"
)

// Plane is the admin plane on a gate: health, readiness, metrics, the
// admin API and the dashboard. It is safe for concurrent use.
type Plane struct {
	gate   *gate.Gate
	tel    *telemetry.Telemetry
	ledger *ledger.Ledger
	reload func() error
	h      http.Handler
	// control is the control plane's; nil when it is off.
	control *control.Plane
	// lastReplay is the summary of the last replay run here, for the
	// dashboard.
	lastReplay atomic.Pointer[dashboard.ReplaySummary]
}

// Options are the admin plane's collaborators besides the gate.
type Options struct {
	// Reload reads and applies the configuration again, for POST
	// /admin/v1/reload; nil answers that a reload is not available.
	Reload func() error
	// Control is the control plane (tenants, teams, users, keys); nil
	// answers its routes 404.
	Control *control.Plane
}

// New returns the admin plane of g.
func New(g *gate.Gate, opts Options) *Plane {
	p := &Plane{gate: g, tel: g.Telemetry(), ledger: g.Ledger(), reload: opts.Reload, control: opts.Control}
	if p.reload == nil {
		p.reload = func() error { return errors.New("this server cannot reload its configuration") }
	}
	p.h = p.handler()
	return p
}

// ServeHTTP serves the admin listener.
func (s *Plane) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.h.ServeHTTP(w, r) }

// handler serves the admin plane. Everything but /healthz, /readyz and the
// dashboard's static page needs the admin token as a bearer token (the
// page asks for it and sends it with its data requests).
func (s *Plane) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.ready)
	auth := http.NewServeMux()
	auth.Handle("GET /metrics", s.tel.MetricsHandler())
	auth.HandleFunc("GET /admin/v1/tenants/{tenant}/spend", s.adminSpend)
	auth.HandleFunc("GET /admin/v1/ledger", s.adminLedger)
	auth.HandleFunc("GET /admin/v1/limits", s.adminLimits)
	auth.HandleFunc("GET /admin/v1/leases", s.adminLeases)
	auth.HandleFunc("GET /admin/v1/top-throttled", s.adminTopThrottled)
	auth.HandleFunc("GET /admin/v1/shadow", func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]any{"shadow": s.tel.Shadow()})
	})
	auth.HandleFunc("POST /admin/v1/policies/replay", s.adminReplay)
	s.policyRoutes(auth)
	s.controlRoutes(auth)
	auth.HandleFunc("POST /admin/v1/reload", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.reload(); err != nil {
			writeAdminError(w, http.StatusBadRequest, "the config is rejected, the last good one stays: "+err.Error())
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "reloaded"})
	})
	// The dashboard's data only reads: the read-only token reads it, as
	// it reads every GET route behind requireAdmin.
	mux.Handle("/admin/", http.StripPrefix("/admin", dashboard.Handler(func() []string {
		cfg := s.gate.Config()
		return []string{cfg.AdminToken, cfg.Control.ReadOnlyToken()}
	}, s.dashboardData)))
	mux.Handle("/admin/v1/", s.requireAdmin(auth))
	mux.Handle("/metrics", s.requireAdmin(auth))
	return jsonErrors(mux)
}

// adminError is the admin listener's one error shape:
// {"error":{"type":"unauthorized","message":"..."}}, as the dashboard's
// errors are; the type is dashboard.ErrorType of the status.
type adminError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func writeAdminError(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, map[string]adminError{"error": {Type: dashboard.ErrorType(status), Message: msg}})
}

// jsonErrors answers in the admin error shape the plain-text errors that
// http.ServeMux and http.Error write (404 for an unknown path, 405 with an
// Allow header for a known path and another method).
func jsonErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&plainErrorWriter{ResponseWriter: w}, r)
	})
}

// plainErrorWriter replaces a text/plain error response with its JSON form;
// any other response passes through untouched.
type plainErrorWriter struct {
	http.ResponseWriter
	wrote, swallow bool
}

func (p *plainErrorWriter) WriteHeader(status int) {
	if p.wrote {
		return
	}
	p.wrote = true
	if status >= 400 && strings.HasPrefix(p.Header().Get("Content-Type"), "text/plain") {
		p.swallow = true
		msg := strings.ToLower(http.StatusText(status))
		if status == http.StatusMethodNotAllowed {
			msg += "; allowed: " + p.Header().Get("Allow")
		}
		writeAdminError(p.ResponseWriter, status, msg)
		return
	}
	p.ResponseWriter.WriteHeader(status)
}

func (p *plainErrorWriter) Write(b []byte) (int, error) {
	if !p.wrote {
		p.WriteHeader(http.StatusOK)
	}
	if p.swallow {
		return len(b), nil
	}
	return p.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (a long ledger
// export flushes and extends its write deadline).
func (p *plainErrorWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

// Flush passes a flush on, as a handler that streams expects.
func (p *plainErrorWriter) Flush() {
	if f, ok := p.ResponseWriter.(http.Flusher); ok && !p.swallow {
		f.Flush()
	}
}

// requireAdmin checks the bearer token in constant time: the admin token
// may do everything, the read-only token (control.read_token) only GET
// (its other requests are 403).
func (s *Plane) requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := s.gate.Config()
		want, read := cfg.AdminToken, cfg.Control.ReadOnlyToken()
		got, ok := dashboard.BearerDigest(r)
		admin := ok && dashboard.DigestIs(got, want)
		reader := ok && dashboard.DigestIs(got, read)
		switch {
		case admin:
			next.ServeHTTP(w, r)
		case reader && (r.Method == http.MethodGet || r.Method == http.MethodHead):
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), actorKey{}, "read-only")))
		case reader:
			writeAdminError(w, http.StatusForbidden, "the read-only token may not change anything: use the admin token")
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="costgate-admin"`)
			writeAdminError(w, http.StatusUnauthorized, "the admin API needs 'Authorization: Bearer <admin token>'")
		}
	})
}

// ready answers 200 when the ledger's store and the limiter store answer.
func (s *Plane) ready(w http.ResponseWriter, r *http.Request) {
	problems := map[string]string{}
	if err := s.ledger.Stats().StoreErr; err != nil {
		problems["ledger"] = err.Error()
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.gate.Ready(ctx); err != nil {
		problems["store"] = err.Error()
	}
	out := map[string]any{"ready": len(problems) == 0}
	if s.control != nil {
		// The data plane serves without the control plane's database:
		// its state is shown, never counted as a problem.
		v, loaded, err := s.control.Health()
		cs := map[string]any{"version": v, "database": "ok"}
		if !loaded.IsZero() {
			cs["loaded_at"] = loaded.UTC()
		}
		if err != nil {
			cs["database"] = "unavailable: " + err.Error()
		}
		if at := s.control.ServingSnapshot(); !at.IsZero() {
			cs["serving_snapshot_of"] = at
		}
		out["control"] = cs
	}
	if len(problems) > 0 {
		out["problems"] = problems
		WriteJSON(w, http.StatusServiceUnavailable, out)
		return
	}
	WriteJSON(w, http.StatusOK, out)
}

// SpendJSON is one spend figure as the admin API and the usage view show it.
type SpendJSON struct {
	Tenant  string            `json:"tenant"`
	User    string            `json:"user,omitempty"`
	KeyID   string            `json:"key_id,omitempty"`
	Period  string            `json:"period"`
	Spent   costmodel.NanoUSD `json:"spent_nano_usd"`
	SpentUS string            `json:"spent_usd"`
}

// Spend reads one spend figure from l.
func Spend(ctx context.Context, l *ledger.Ledger, q ledger.SpendQuery) (SpendJSON, error) {
	n, err := l.Spend(ctx, q)
	if err != nil {
		return SpendJSON{}, err
	}
	return SpendJSON{Tenant: q.Tenant, User: q.User, KeyID: q.KeyID, Period: q.Period, Spent: n, SpentUS: n.String()}, nil
}

func (s *Plane) adminSpend(w http.ResponseWriter, r *http.Request) {
	period := r.URL.Query().Get("period")
	if period == "" {
		period = "day"
	}
	q := ledger.SpendQuery{Tenant: r.PathValue("tenant"), User: r.URL.Query().Get("user"), KeyID: r.URL.Query().Get("key_id"), Period: period}
	sp, err := Spend(r.Context(), s.ledger, q)
	if err != nil {
		WriteErr(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, sp)
}

func (s *Plane) adminLedger(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	// As costgate ledger export reads them: a date is a whole UTC day,
	// included at both ends; an RFC 3339 time is exact, to excluded.
	from, to, err := ledger.ParseRange(q.Get("from"), q.Get("to"))
	if err != nil {
		WriteErr(w, err)
		return
	}
	format := q.Get("format")
	if format == "" {
		format = "json"
	}
	lq := ledger.Query{Tenant: q.Get("tenant"), From: from, To: to}
	// What this node has spooled (settlements of requests that just ended)
	// is exported too. The wait is bounded: a store that does not take the
	// spool leaves the export as the store has it.
	fctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	_ = s.ledger.Flush(fctx)
	cancel()
	switch format {
	case "csv":
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	default:
		w.Header().Set("Content-Type", "application/json")
	}
	if err := s.ledger.Export(r.Context(), w, lq, format); err != nil {
		WriteErr(w, err)
	}
}

// adminLimits shows the state of every configured limit under one key, as
// top-throttled and the logs name keys ("{acme}:tenant=acme").
func (s *Plane) adminLimits(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	type limitJSON struct {
		Name      string `json:"name"`
		Algorithm string `json:"algorithm"`
		Unit      string `json:"unit"`
		Rate      int64  `json:"rate"`
		PeriodS   int64  `json:"period_seconds"`
		Capacity  int64  `json:"capacity"`
		Remaining *int64 `json:"remaining,omitempty"`
		ResetS    *int64 `json:"reset_seconds,omitempty"`
		Budget    bool   `json:"budget,omitempty"`
		Shadow    bool   `json:"shadow,omitempty"`
		Dims      string `json:"dimensions"`
	}
	limits, err := s.gate.Limits(r.Context(), key)
	if err != nil {
		WriteErr(w, err)
		return
	}
	out := make([]limitJSON, 0, len(limits))
	for _, l := range limits {
		lj := limitJSON{Name: l.Name, Algorithm: l.Algorithm, Unit: l.Unit, Rate: l.Rate,
			PeriodS: int64(l.Window / time.Second), Capacity: l.Capacity, Budget: l.Budget, Shadow: l.Shadow,
			Dims: l.Dimension}
		if l.State != nil {
			rem, reset := l.State.Remaining, int64(l.State.ResetAfter/time.Second)
			lj.Remaining, lj.ResetS = &rem, &reset
		}
		out = append(out, lj)
	}
	WriteJSON(w, http.StatusOK, map[string]any{"key": key, "limits": out})
}

func (s *Plane) adminTopThrottled(w http.ResponseWriter, r *http.Request) {
	n := 10
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 1000 {
			writeAdminError(w, http.StatusBadRequest, "n must be a whole number from 1 to 1000")
			return
		}
	}
	WriteJSON(w, http.StatusOK, map[string]any{"top_throttled": s.tel.TopThrottled(n)})
}

// WriteErr answers err in the admin error shape: 400 for what the ledger
// calls invalid, 500 otherwise.
func WriteErr(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	if errors.Is(err, ledger.ErrInvalid) {
		status = http.StatusBadRequest
	}
	writeAdminError(w, status, err.Error())
}

// WriteJSON answers v as JSON with status, followed by a newline.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	buf := jsonBufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxPooledJSON {
			jsonBufs.Put(buf)
		}
	}()
	if err := json.NewEncoder(buf).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	WriteEncoded(w, status, buf.Bytes())
}

// WriteEncoded answers body, JSON already encoded, with status and
// WriteJSON's Content-Type.
func WriteEncoded(w http.ResponseWriter, status int, body []byte) {
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	w.Write(body)
}

// jsonBufs are WriteJSON's buffers: an answer is encoded into one and
// written from it, not copied into a slice of its own first.
var jsonBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledJSON bounds the buffers kept for reuse: a large export's does
// not stay behind.
const maxPooledJSON = 64 << 10

// jsonContentType is the Content-Type of WriteJSON's answers, shared
// (Header.Set would make a slice for each answer): a header's values are
// replaced or appended to, never written in place.
var jsonContentType = []string{"application/json"}
