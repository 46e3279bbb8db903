package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestBillAtkGenericAnswerStatesNoUnits: a generic upstream bills each
// call by what it served (40 credits here) and reports it in its JSON
// answer (units_used), which the rule reads (actual: units_used, at most
// 50). The client asks for the answer in a form that leaves the report
// out, as metered APIs let it: another format (?format=csv, as SerpApi's
// output=html or Elasticsearch's format=yaml), or only some fields
// (?fields=results, as Google's fields and Elasticsearch's filter_path).
// The answer, read whole, stated no units, and costgate charged the
// estimate, 2 credits ($0.021) for the 40 ($0.401) the upstream billed.
// Such an answer is charged as one whose report cannot be read: the
// rule's max, 50.
func TestBillAtkGenericAnswerStatesNoUnits(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch q := r.URL.Query(); {
		case q.Get("format") == "csv":
			w.Header().Set("Content-Type", "text/csv")
			io.WriteString(w, "id,title\n1,a\n2,b\n")
		case q.Get("fields") == "results":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"results":[{"id":1},{"id":2}]}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"results":[{"id":1},{"id":2}],"units_used":40}`)
		}
	}))
	defer up.Close()
	for _, c := range []struct {
		name, query string
		units       int64
	}{
		{"reported", "", 40},
		{"another format", "?format=csv", 50},
		{"fields left out", "?fields=results", 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, stackOptions{extra: `
  - name: gen
    kind: generic
    base_url: ` + up.URL + `
    cost: {per_call: "0.001", per_unit: "0.01", units: {query: num, default: 2}, actual: {json: units_used, max: 50}}
` + roomyLimits})
			req, err := http.NewRequest(http.MethodGet, s.url+"/u/gen/search"+c.query, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("answered %d", resp.StatusCode)
			}
			e := s.settled(t, 1)[0]
			if e.Actual.Units != c.units {
				t.Errorf("charged %d units (%v); the upstream served and billed 40, the rule's max is 50: want %d",
					e.Actual.Units, e.ActualCost, c.units)
			}
		})
	}
}
