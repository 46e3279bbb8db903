package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestReserveFieldsHaveOneSpelling: encoding/json matches member names
// without regard to case (and folds "ſ" to "s") and keeps the last of a
// member given twice, so such a body could carry two costs: one that a
// case-sensitive reader (a log, a gateway, the caller's tooling) sees and
// one that costgate charges. Each is 400, on every route, and changes
// nothing: the reservation it names settles afterwards as usual.
func TestReserveFieldsHaveOneSpelling(t *testing.T) {
	s := newStack(t, "", `
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`)
	h := s.srv.Handler()
	const acme = "cg-test-acme"
	code, r := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.40"}}`)
	if code != 200 {
		t.Fatalf("reserve: %d %v", code, r)
	}
	id, _ := r["reservation_id"].(string)
	const reserve, settle, release = "/v1/costgate/reserve", "/v1/costgate/settle", "/v1/costgate/release"
	for _, tc := range []struct{ name, path, body string }{
		{"cost in upper case", reserve, `{"COST":{"usd":"0.5"}}`},
		{"usd in upper case", reserve, `{"cost":{"USD":"0.5"}}`},
		{"cost twice", reserve, `{"cost":{"usd":"0.5"},"cost":{"usd":"0"}}`},
		{"usd twice", reserve, `{"cost":{"usd":"0.5","usd":"0"}}`},
		{"usd in two spellings", reserve, `{"cost":{"usd":"0.5","Usd":"0"}}`},
		{"tokens in two spellings", reserve, `{"cost":{"tokens":5,"Tokens":0,"input_tokens":7},"model":"gpt-4o-mini"}`},
		{"a long s", reserve, `{"co\u017ft":{"usd":"0"}}`},
		{"a Kelvin sign", reserve, `{"cost":{"to\u212aens":5}}`},
		{"model in two spellings", reserve, `{"model":"gpt-4o-mini","MODEL":"gpt-4o","cost":{"tokens":5}}`},
		{"ttl twice", reserve, `{"ttl":"1m","ttl":"1h"}`},
		{"an attribute twice", reserve, `{"attributes":{"job":"a","job":"b"}}`},
		{"usage twice", settle, `{"reservation_id":"` + id + `","usage":{"usd":"0.4"},"usage":{"usd":"0"}}`},
		{"usage usd in two spellings", settle, `{"reservation_id":"` + id + `","usage":{"usd":"0.4","USD":"0"}}`},
		{"status in two spellings", settle, `{"reservation_id":"` + id + `","usage":{"usd":"0.4"},"status":"settled","Status":"failed"}`},
		{"reservation id in upper case", settle, `{"RESERVATION_ID":"` + id + `","usage":{"usd":"0"}}`},
		{"reservation id twice", release, `{"reservation_id":"rsv_x","reservation_id":"` + id + `"}`},
		{"reservation id in another case", release, `{"Reservation_ID":"` + id + `"}`},
		// Names the API does not have, at any depth, and a second value.
		{"an unknown cost field", reserve, `{"cost":{"usd":"0.5","discount":"0.5"}}`},
		{"an unknown usage field", settle, `{"reservation_id":"` + id + `","usage":{"usd":"0","refund":"1"}}`},
		{"an unknown top field", settle, `{"reservation_id":"` + id + `","usage":{"usd":"0"},"free":true}`},
		{"an unknown field with an escape", reserve, `{"cost":{"usd":"0.5","disc\u006funt":"0.5"}}`},
		{"a second value", settle, `{"reservation_id":"` + id + `","usage":{"usd":"0"}} {"reservation_id":"` + id + `"}`},
		{"not an object", release, `["` + id + `"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, out := reserveCall(t, h, acme, tc.path, tc.body); code != 400 || errCode(out) != "invalid_body" {
				t.Errorf("%d %s %v; want 400 invalid_body", code, errCode(out), out["cost_usd"])
			}
		})
	}
	// Nothing was reserved, settled or released: $0.60 is left, and the
	// reservation settles once.
	if code, out := reserveCall(t, h, acme, settle, `{"reservation_id":"`+id+`","usage":{"usd":"0.40"}}`); code != 200 || out["already_settled"] != false {
		t.Fatalf("settle: %d %v", code, out)
	}
	if code, out := reserveCall(t, h, acme, reserve, `{"cost":{"usd":"0.600000001"}}`); code != 402 {
		t.Errorf("over the $0.60 left: %d %v", code, out)
	}
	if code, out := reserveCall(t, h, acme, reserve, `{"cost":{"usd":"0.60"},"attributes":{"job":"a"}}`); code != 200 {
		t.Errorf("the $0.60 left: %d %v", code, out)
	}
}

// TestReserveBodyTooLarge: a body over the API's bound (1 MiB) is 413
// body_too_large, as on the proxy's routes, not a parse error.
func TestReserveBodyTooLarge(t *testing.T) {
	s := newStack(t, "", "")
	h := s.srv.Handler()
	for _, path := range []string{"/v1/costgate/reserve", "/v1/costgate/settle", "/v1/costgate/release"} {
		for _, body := range []string{
			`{"route":"` + strings.Repeat("a", 1<<20) + `"}`,
			`{}` + strings.Repeat(" ", 1<<20),
		} {
			if code, out := reserveCall(t, h, "cg-test-acme", path, body); code != 413 || errCode(out) != "body_too_large" {
				t.Errorf("%s, %d bytes: %d %v; want 413 body_too_large", path, len(body), code, out)
			}
		}
	}
}

// TestReserveCallerGone: a caller that hangs up before its reserve is
// answered never learns the reservation's id, so it cannot settle or
// release it: the reservation is cancelled (ledger status failed, no
// charge) instead of holding the budget and being charged its estimate
// when it expires. On each store.
func TestReserveCallerGone(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		s := newStack(t, url, `
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`)
		h := s.srv.Handler()
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		req := httptest.NewRequest(http.MethodPost, "/v1/costgate/reserve", strings.NewReader(`{"cost":{"usd":"0.50"}}`)).WithContext(gone)
		req.Header.Set("Authorization", "Bearer cg-test-acme")
		h.ServeHTTP(httptest.NewRecorder(), req)

		// The whole budget is left.
		code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"usd":"1.00"}}`)
		if code != 200 {
			t.Fatalf("reserving the whole budget after a reserve whose caller hung up: %d %v", code, out)
		}
		var open, charged int
		for _, e := range s.entries(t) {
			switch {
			case e.Status == ledger.StatusReserved:
				open++
			case e.ActualCost != 0:
				charged++
			}
		}
		if open != 1 || charged != 0 {
			t.Errorf("ledger: %d open (want the one reservation answered), %d charged (want none)", open, charged)
		}
	})
}

// TestSettleRetriedAfterExpiry: a settle retried after the reservation's
// expiry (a client whose first answer was lost) is told the first
// settlement, as the README promises for a later settle (the claim in
// Redis is kept 10 minutes past the expiry); a release then is 409
// reservation_settled. Neither may say that the reservation expired and
// was settled at its estimate: it was not.
func TestSettleRetriedAfterExpiry(t *testing.T) {
	s := newStack(t, redistest.New(t).URL, `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000, period: 24h}
`)
	h := s.srv.Handler()
	code, r := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":100},"ttl":"1s"}`)
	if code != 200 {
		t.Fatalf("reserve: %d %v", code, r)
	}
	id, _ := r["reservation_id"].(string)
	exp, err := time.Parse(time.RFC3339Nano, r["expires_at"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":{"input_tokens":40}}`); code != 200 {
		t.Fatalf("settle: %d %v", code, out)
	}
	for time.Now().Before(exp.Add(100 * time.Millisecond)) {
		time.Sleep(20 * time.Millisecond) // polls the wall clock past the 1 s TTL
	}
	code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":{"input_tokens":400}}`)
	if code != 200 || out["already_settled"] != true {
		t.Errorf("settle retried after the expiry: %d %s; want 200, already settled", code, errCode(out))
	}
	if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/release", `{"reservation_id":"`+id+`"}`); code != 409 || errCode(out) != "reservation_settled" {
		t.Errorf("release after the expiry: %d %s; want 409 reservation_settled", code, errCode(out))
	}
	if rem := limitsLeft(t, s); len(rem) != 1 || rem[0] != 1000-40 {
		t.Errorf("tpm remaining %v; want 40 used", rem)
	}
}

// limitsLeft returns what acme's limits have left, in the order the
// decision lists them, without spending any of it: a request Served
// reads the limits at a cost of 0 (any other reserves a unit of each).
func limitsLeft(t *testing.T, s *stack) []int64 {
	t.Helper()
	g := s.srv.Gate()
	res, d := g.Reserve(context.Background(), &gate.Request{Caller: g.Identify("cg-test-acme"), Route: "/x", States: true, Served: true})
	if res != nil {
		res.Cancel(context.Background())
	}
	var left []int64
	for _, l := range d.Limits {
		left = append(left, l.Remaining)
	}
	return left
}
