package client

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"
)

// FuzzAnswer feeds readAnswer arbitrary answers: it never panics, a 200
// is a reservation or an error, and any other status is always an error
// that is a *RefusedError or an *APIError.
func FuzzAnswer(f *testing.F) {
	f.Add(200, "application/json", "", []byte(`{"reservation_id":"rsv_1","estimate":{"cost_usd":"0.01","cost_nanousd":10000000},"friction":{"delay_ms":-5}}`))
	f.Add(429, "application/json", "3", []byte(`{"error":{"type":"rate_limit_exceeded","retry_after_ms":9223372036854775807}}`))
	f.Add(402, "application/json", "Wed, 21 Oct 2015 07:28:00 GMT", []byte(`{"error":{"type":"budget_exceeded"}}`))
	f.Add(503, "text/html", "-1", []byte(`<html>`))
	f.Add(200, "application/json", "", []byte(`{"reservation_id":"x","estimate":{"cost_usd":"1e400"}}`))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, status int, ct, retry string, body []byte) {
		if status < 100 || status > 999 {
			return
		}
		resp := &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body))}
		resp.Header.Set("Content-Type", ct)
		resp.Header.Set("Retry-After", retry)
		var w reservationWire
		err := readAnswer("reserve", resp, &w, now)
		if err == nil {
			if status != http.StatusOK {
				t.Fatalf("status %d read as a success", status)
			}
			r, err := w.reservation()
			if err == nil && (r.ID == "" || r.Friction != nil && r.Friction.Delay < 0) {
				t.Fatalf("reservation %+v", r)
			}
			return
		}
		var re *RefusedError
		var ae *APIError
		if status != http.StatusOK && !errors.As(err, &re) && !errors.As(err, &ae) {
			t.Fatalf("status %d: error %T %v", status, err, err)
		}
		if re != nil && re.RetryAfter < 0 || ae != nil && ae.RetryAfter < 0 {
			t.Fatalf("negative RetryAfter: %v", err)
		}
	})
}
