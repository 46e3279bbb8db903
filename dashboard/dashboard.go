// Package dashboard is costgate's operator dashboard: one page, served by the
// admin listener at /admin/, that shows store health, spend per tenant over
// the last hour, decisions per policy, the most throttled keys and what shadow
// policies would block.
//
// The page is hand-written HTML, CSS and JavaScript embedded in the binary; it
// loads nothing from outside and draws its charts as inline SVG. It reads its
// numbers from data.json, which is the only authenticated part: the static
// assets hold no data, so a browser can load them on navigation, and the page
// then sends the token it was given (in the URL fragment #token=... or
// through its login form) as an Authorization header: the admin token or the
// read-only one, as the admin plane's other reads take either.
//
// The proxy owns the numbers. It passes a Source that turns its telemetry and
// stores into a Data; this package only serves and draws them.
package dashboard

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Data is everything the page shows. The zero value is a valid, empty
// dashboard: every list may be nil or empty and the page shows an empty state
// for it.
type Data struct {
	// GeneratedAt is the end of the window the data covers. The zero value
	// means "now": the handler fills in its clock at the time of the request.
	GeneratedAt time.Time `json:"generated_at"`
	// Store is the health of the limiter store.
	Store StoreHealth `json:"store"`
	// Spend is the spend per tenant, per minute, over the last 60 minutes.
	Spend []TenantSeries `json:"spend"`
	// Decisions are the decisions per policy over the same window.
	Decisions []PolicyDecisions `json:"decisions"`
	// TopThrottled are the keys blocked most often, most blocked first.
	TopThrottled []Throttled `json:"top_throttled"`
	// Shadow are the would-blocks of policies and limits in shadow mode.
	Shadow []ShadowCount `json:"shadow"`
	// Budgets are the control plane's teams' and keys' budgets, with their
	// spend in the current period.
	Budgets []BudgetRow `json:"budgets"`
	// Replay is the last policy replay run on this replica through the
	// admin API (POST /admin/v1/policies/replay); absent before the first.
	Replay *ReplaySummary `json:"replay,omitempty"`
	// Limits are the limits and budgets of the active configuration with
	// their mode and the leases this replica holds.
	Limits []LimitMode `json:"limits"`
	// Region is this replica's region and its last reconciliation; absent
	// without regions.
	Region *RegionState `json:"region,omitempty"`
}

// LimitMode is a limit or budget, its mode (strict or leased) and the
// leases of its keys that this replica holds.
type LimitMode struct {
	Name   string `json:"name"`
	Mode   string `json:"mode"`
	Budget bool   `json:"budget"`
	// Keys are the keys holding leases; Leases and Unspent their leases and
	// units not yet spent, together.
	Keys    int   `json:"keys"`
	Leases  int   `json:"leases"`
	Unspent int64 `json:"unspent"`
}

// RegionState is a region's last reconciliation of its budget caps.
type RegionState struct {
	Region    string    `json:"region"`
	Regions   []string  `json:"regions"`
	LastOK    time.Time `json:"last_reconciliation"`
	LastError string    `json:"last_error,omitempty"`
}

// ReplaySummary is what a candidate policy bundle would have changed in
// the traffic this replica captured.
type ReplaySummary struct {
	At time.Time `json:"at"`
	// Files are the candidate bundle's file names, sorted.
	Files  []string `json:"files"`
	Since  string   `json:"since,omitempty"`
	Tenant string   `json:"tenant,omitempty"`
	// Replayed requests were evaluated; Changed of them would have been
	// decided otherwise, for an estimated ChangedNanoUSD.
	Replayed       int   `json:"replayed"`
	Changed        int   `json:"changed"`
	ChangedNanoUSD int64 `json:"changed_nano_usd,string"`
	// Transitions ("allow->hard"), Policies and Tenants count the changed
	// requests, most first, at most 5 of each.
	Transitions []ReplayCount `json:"transitions"`
	Policies    []ReplayCount `json:"policies"`
	Tenants     []ReplayCount `json:"tenants"`
}

// ReplayCount is a number of changed requests and their estimated cost.
type ReplayCount struct {
	Name    string `json:"name"`
	Count   int    `json:"count"`
	NanoUSD int64  `json:"nano_usd,string"`
}

// BudgetRow is one budget of a control-plane team or key and its spend in
// the current period (estimates of requests in flight included).
type BudgetRow struct {
	// Kind is team or key; ID the entity's id, Name its name (a key's is
	// its id).
	Kind   string `json:"kind"`
	ID     string `json:"id"`
	Name   string `json:"name"`
	Tenant string `json:"tenant"`
	// Team is a key's team, empty for none.
	Team string `json:"team,omitempty"`
	// Budget is the budget's id (day, month, ...), Limit its name as
	// refusals give it (team/research/day).
	Budget string `json:"budget"`
	Limit  string `json:"limit"`
	Period string `json:"period"`
	// SpentNanoUSD and AmountNanoUSD are in nano-dollars, as decimal
	// strings.
	SpentNanoUSD  int64 `json:"spent_nano_usd,string"`
	AmountNanoUSD int64 `json:"amount_nano_usd,string"`
}

// StoreHealth is the state of the limiter store and its circuit breaker.
type StoreHealth struct {
	// Kind is the store's kind: "memory" or "redis".
	Kind string `json:"kind"`
	// Healthy reports whether the last store operations succeeded.
	Healthy bool `json:"healthy"`
	// Breaker is the circuit breaker's state: "closed", "open" or "half_open".
	Breaker string `json:"breaker"`
	// FailOpenTotal counts the decisions admitted because the store failed
	// and the limit's posture was fail_open, since the process started.
	FailOpenTotal int64 `json:"fail_open_total"`
}

// TenantSeries is one tenant's spend over time.
type TenantSeries struct {
	Tenant string `json:"tenant"`
	// Points hold the spend per minute; a minute without a point spent
	// nothing. Points outside the last 60 minutes before GeneratedAt are not
	// drawn.
	Points []Point `json:"points"`
}

// Point is the spend in the minute that starts at T.
type Point struct {
	T time.Time `json:"t"`
	// NanoUSD is the spend in nano-dollars (1e-9 USD). It is encoded in JSON
	// as a decimal string, so that JavaScript reads it exactly (as a BigInt)
	// whatever its size.
	NanoUSD int64 `json:"nano_usd,string"`
}

// PolicyDecisions are one policy's decisions in the window. Allow, Soft, Hard
// and Shadow are disjoint: every decision the policy made is counted in
// exactly one of them.
type PolicyDecisions struct {
	Policy string `json:"policy"`
	// Allow counts the requests admitted without friction.
	Allow int64 `json:"allow"`
	// Soft counts the requests admitted with friction (a soft limit).
	Soft int64 `json:"soft"`
	// Hard counts the requests blocked (429 or 402).
	Hard int64 `json:"hard"`
	// Shadow counts the requests admitted that the policy, in shadow mode,
	// would have blocked.
	Shadow int64 `json:"shadow"`
	// Points hold the blocked (hard) count per minute; a minute without a
	// point blocked nothing.
	Points []CountPoint `json:"points"`
}

// CountPoint is a count of events in the minute that starts at T.
type CountPoint struct {
	T     time.Time `json:"t"`
	Count int64     `json:"count"`
}

// Throttled is a key that was blocked, and how often, in the window.
type Throttled struct {
	// Key is the limit's key (its dimensions' values), as the limiter
	// stores it.
	Key string `json:"key"`
	// Limit is the name of the limit that blocked it.
	Limit  string `json:"limit"`
	Tenant string `json:"tenant"`
	// Count is the number of blocked requests.
	Count int64 `json:"count"`
}

// ShadowCount is what a shadow-mode policy or limit would have blocked of one
// tenant's traffic in the window.
type ShadowCount struct {
	Policy string `json:"policy"`
	Limit  string `json:"limit"`
	Tenant string `json:"tenant"`
	// WouldBlock is the number of the tenant's requests it would have blocked.
	WouldBlock int64 `json:"would_block"`
	// Share is WouldBlock as a fraction of the tenant's requests in the
	// window, from 0 to 1. It is a ratio, not money, so a float is fine.
	Share float64 `json:"share"`
}

// Source produces the current Data. The handler calls it once per request
// for data.json, with the request's context; it must be safe for concurrent
// use. An error is answered with 503 and its message.
type Source func(ctx context.Context) (Data, error)

//go:embed assets
var assets embed.FS

// asset is one embedded file and the content type it is served with.
type asset struct {
	file  string
	ctype string
}

var files = map[string]asset{
	"/":           {"assets/index.html", "text/html; charset=utf-8"},
	"/index.html": {"assets/index.html", "text/html; charset=utf-8"},
	"/app.js":     {"assets/app.js", "text/javascript; charset=utf-8"},
	"/style.css":  {"assets/style.css", "text/css; charset=utf-8"},
}

// contentSecurityPolicy lets the page load only its own assets and fetch only
// its own data, and forbids inline scripts and styles and framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the dashboard: the page at "/" (also "/index.html"), its
// assets "/app.js" and "/style.css", and the Source's Data as JSON at
// "/data.json". Paths are relative to where it is mounted, so the caller
// strips its prefix:
//
//	mux.Handle("/admin/", http.StripPrefix("/admin", dashboard.Handler(tokens, src)))
//
// The page and its assets are served without authentication; they hold no
// data. data.json, which only reads, requires the header "Authorization:
// Bearer TOKEN" where TOKEN equals one of tokens() (the admin token and the
// read-only token, say), compared in constant time; tokens is called on
// every request, so a reloaded token takes effect at once. An empty token
// authorizes nothing; when tokens() has no other, no request is
// authorized. Only GET and HEAD are allowed. Both arguments are required;
// Handler panics if either is nil.
//
// The handler is safe for concurrent use.
func Handler(tokens func() []string, src Source) http.Handler {
	if tokens == nil || src == nil {
		panic("dashboard: Handler needs a tokens func and a Source")
	}
	return &handler{tokens: tokens, src: src}
}

type handler struct {
	tokens func() []string
	src    Source
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if r.URL.Path == "/data.json" {
		h.serveData(w, r)
		return
	}
	a, ok := files[r.URL.Path]
	if !ok {
		writeError(w, http.StatusNotFound, "no such dashboard file")
		return
	}
	body, err := assets.ReadFile(a.file)
	if err != nil { // the files are embedded: this cannot happen in a built binary
		writeError(w, http.StatusInternalServerError, "dashboard: read asset: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", a.ctype)
	w.Header().Set("Content-Security-Policy", contentSecurityPolicy)
	w.Header().Set("Cache-Control", "no-cache")
	if r.Method == http.MethodHead {
		return
	}
	w.Write(body)
}

func (h *handler) serveData(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="costgate-admin"`)
		writeError(w, http.StatusUnauthorized, "missing or invalid admin token")
		return
	}
	d, err := h.src(r.Context())
	if err != nil {
		slog.ErrorContext(r.Context(), "dashboard: source failed", "err", err)
		writeError(w, http.StatusServiceUnavailable, "dashboard: source: "+err.Error())
		return
	}
	if d.GeneratedAt.IsZero() {
		d.GeneratedAt = time.Now()
	}
	body, err := json.Marshal(normalize(d))
	if err != nil {
		writeError(w, http.StatusInternalServerError, "dashboard: encode: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodHead {
		return
	}
	w.Write(body)
}

// authorized reports whether r carries one of the tokens as a bearer
// token. Every token is compared, so that which one matched does not leak
// through timing.
func (h *handler) authorized(r *http.Request) bool {
	got, ok := BearerDigest(r)
	if !ok {
		return false
	}
	match := false
	for _, want := range h.tokens() {
		match = DigestIs(got, want) || match
	}
	return match
}

// BearerDigest is the SHA-256 of the bearer token of r's Authorization
// field, whose scheme is read without regard to case (RFC 9110, section
// 11.1); ok is false when r carries none. Tokens are compared as digests
// (DigestIs) so that neither the content nor the length of a token leaks
// through timing.
func BearerDigest(r *http.Request) (digest [sha256.Size]byte, ok bool) {
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return digest, false
	}
	return sha256.Sum256([]byte(strings.TrimSpace(got))), true
}

// DigestIs reports, in constant time, whether digest is BearerDigest's of
// the token want; never for an empty want.
func DigestIs(digest [sha256.Size]byte, want string) bool {
	if want == "" {
		return false // a token not configured
	}
	w := sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(digest[:], w[:]) == 1
}

// normalize replaces nil lists by empty ones, so that the JSON always has
// arrays where the page expects them. It copies the outer lists it changes
// and never writes to the Source's slices, which the Source may share.
func normalize(d Data) Data {
	spend := make([]TenantSeries, len(d.Spend))
	for i, s := range d.Spend {
		s.Points = orEmpty(s.Points)
		spend[i] = s
	}
	d.Spend = spend
	decisions := make([]PolicyDecisions, len(d.Decisions))
	for i, p := range d.Decisions {
		p.Points = orEmpty(p.Points)
		decisions[i] = p
	}
	d.Decisions = decisions
	d.TopThrottled = orEmpty(d.TopThrottled)
	d.Shadow = orEmpty(d.Shadow)
	d.Budgets = orEmpty(d.Budgets)
	d.Limits = orEmpty(d.Limits)
	return d
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// writeError answers with the admin listener's one error shape,
// {"error":{"type":"not_found","message":"..."}}, the type named after the
// status (see ErrorType).
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]map[string]string{"error": {"type": ErrorType(status), "message": msg}})
}

// ErrorType names an HTTP error status in the admin listener's error bodies:
// "invalid_request" (400), "unauthorized" (401), "not_found" (404),
// "method_not_allowed" (405), "unavailable" (503), "internal_error" (other
// 5xx) and "error" for any other status.
func ErrorType(status int) string {
	switch {
	case status == http.StatusBadRequest:
		return "invalid_request"
	case status == http.StatusUnauthorized:
		return "unauthorized"
	case status == http.StatusForbidden:
		return "forbidden"
	case status == http.StatusConflict:
		return "conflict"
	case status == http.StatusNotFound:
		return "not_found"
	case status == http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case status == http.StatusServiceUnavailable:
		return "unavailable"
	case status >= 500:
		return "internal_error"
	}
	return "error"
}
