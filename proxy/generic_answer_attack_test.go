package proxy_test

import (
	"bytes"
	"compress/flate"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestGenericAtkUnreadableAnswers: a generic upstream's rule reads the
// units the answer reports (actual: units_used, at most 50). An answer
// whose report costgate cannot read is charged the most the rule lets it
// report, as the README says, never the smaller estimate: one in a
// content coding costgate did not decode (an upstream that compresses
// unasked), a stream whose media type is written in another case, and
// one cut before its end. Before, each was charged its estimate (2 units,
// $0.021) while the upstream had served and billed 40.
func TestGenericAtkUnreadableAnswers(t *testing.T) {
	for _, c := range []struct {
		name  string
		units int64
		fn    func(w http.ResponseWriter)
	}{
		{"plain", 40, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"units_used":40}`)
		}},
		{"deflate", 50, func(w http.ResponseWriter) {
			var b bytes.Buffer
			fw, _ := flate.NewWriter(&b, 5)
			io.WriteString(fw, `{"units_used":40}`)
			fw.Close()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "deflate")
			w.Write(b.Bytes())
		}},
		{"identity", 40, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "Identity")
			io.WriteString(w, `{"units_used":40}`)
		}},
		{"Text/Event-Stream", 50, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "Text/Event-Stream")
			io.WriteString(w, "data: {\"units_used\":40}\n\n")
		}},
		{"cut", 50, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "100")
			io.WriteString(w, `{"units_used":40`)
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				c.fn(w)
			}))
			defer up.Close()
			s := newStackWith(t, stackOptions{extra: `
  - name: gen
    kind: generic
    base_url: ` + up.URL + `
    cost: {per_call: "0.001", per_unit: "0.01", units: {query: num, default: 2}, actual: {json: units_used, max: 50}}
` + roomyLimits})
			req, err := http.NewRequest(http.MethodGet, s.url+"/u/gen/run", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			e := s.settled(t, 1)[0]
			if e.Actual.Units != c.units {
				t.Errorf("charged %d units (%v, status %s); the upstream served 40, the rule's max is 50: want %d",
					e.Actual.Units, e.ActualCost, e.Status, c.units)
			}
		})
	}
}
