package client_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// fakeCostgate is a small stand-in for costgate's reserve/settle API, for
// the tests of the client's own behaviour: it admits every reservation
// unless refuse is set, and records what it was sent. The integration
// tests run against the real server.
type fakeCostgate struct {
	url string

	mu       sync.Mutex
	refuse   int // answer reserve calls with this status (429, 402) when set
	reserves []map[string]any
	settles  []map[string]any
	releases []string
	auth     []string
	state    map[string]string // reservation id -> reserved, settled, released
}

func newFakeCostgate(t *testing.T) *fakeCostgate {
	t.Helper()
	f := &fakeCostgate{state: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/costgate/reserve", f.reserve)
	mux.HandleFunc("POST /v1/costgate/settle", f.settle)
	mux.HandleFunc("POST /v1/costgate/release", f.release)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *fakeCostgate) read(w http.ResponseWriter, r *http.Request) (map[string]any, bool) {
	var m map[string]any
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
		writeJSON(w, 400, map[string]any{"error": map[string]any{"type": "invalid_request_error", "message": err.Error()}})
		return nil, false
	}
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	return m, true
}

func (f *fakeCostgate) reserve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.read(w, r)
	if !ok {
		return
	}
	f.reserves = append(f.reserves, m)
	switch f.refuse {
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "7")
		w.Header().Set("RateLimit", `"calls";r=0;t=7`)
		w.Header().Set("RateLimit-Policy", `"calls";q=2;w=60;qu="requests"`)
		writeJSON(w, 429, map[string]any{"error": map[string]any{"type": "rate_limit_exceeded", "code": "calls", "message": "too many", "retry_after_ms": 6500}})
		return
	case http.StatusPaymentRequired:
		w.Header().Set("Retry-After", "3600")
		writeJSON(w, 402, map[string]any{"error": map[string]any{"type": "budget_exceeded", "code": "daily", "message": "spent", "policy": "budgets"}})
		return
	}
	id := fmt.Sprintf("rsv_%d", len(f.reserves))
	f.state[id] = "reserved"
	units, _ := m["cost"].(map[string]any)["units"].(float64)
	w.Header().Set("RateLimit", `"calls";r=5;t=60`)
	writeJSON(w, 200, map[string]any{
		"reservation_id": id, "request_id": "req_" + id[4:], "expires_at": "2030-01-02T03:04:05Z",
		"estimate": map[string]any{"requests": 1, "units": units, "cost_usd": "0.0125", "cost_nanousd": 12500000},
		"degraded": false,
	})
}

func (f *fakeCostgate) settle(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.read(w, r)
	if !ok {
		return
	}
	f.settles = append(f.settles, m)
	id, _ := m["reservation_id"].(string)
	switch f.state[id] {
	case "":
		writeJSON(w, 404, map[string]any{"error": map[string]any{"type": "invalid_request_error", "code": "unknown_reservation", "message": "no such reservation"}})
		return
	case "released":
		writeJSON(w, 409, map[string]any{"error": map[string]any{"type": "invalid_request_error", "code": "reservation_released", "message": "released"}})
		return
	}
	already := f.state[id] == "settled"
	f.state[id] = "settled"
	writeJSON(w, 200, map[string]any{"reservation_id": id, "request_id": "req_" + id[4:], "status": "settled", "cost_usd": "0.000123", "cost_nanousd": 123000, "already_settled": already})
}

func (f *fakeCostgate) release(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.read(w, r)
	if !ok {
		return
	}
	id, _ := m["reservation_id"].(string)
	f.releases = append(f.releases, id)
	switch f.state[id] {
	case "":
		writeJSON(w, 404, map[string]any{"error": map[string]any{"type": "invalid_request_error", "code": "unknown_reservation", "message": "no such reservation"}})
		return
	case "settled":
		writeJSON(w, 409, map[string]any{"error": map[string]any{"type": "invalid_request_error", "code": "reservation_settled", "message": "settled"}})
		return
	}
	f.state[id] = "released"
	writeJSON(w, 200, map[string]any{"reservation_id": id, "status": "released"})
}

// calls returns copies of what the fake was sent.
func (f *fakeCostgate) calls() (reserves, settles []map[string]any, releases []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.reserves...), append([]map[string]any(nil), f.settles...), append([]string(nil), f.releases...)
}

func (f *fakeCostgate) setRefuse(status int) {
	f.mu.Lock()
	f.refuse = status
	f.mu.Unlock()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
