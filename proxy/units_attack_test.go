package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// Attacks on a generic upstream's units through the real proxy: the
// request states its units in a spelling costgate might not read, and the
// upstream reads them as a lenient server does. Each must be refused
// before it reaches the upstream, or billed at least the units the
// upstream read.

// unitsAtkPerUnit is the price of a unit of the credits upstream.
const unitsAtkPerUnit = costmodel.NanoUSD(10_000_000)

// unitsAtkLenient reads a request's credits as lenient servers do, and
// says how many in X-Credits-Read: a JSON body decoded by encoding/json
// (keys in any case, the last repeated one wins), a form body by
// FormValue (the body before the query), the query parameter num in any
// case (as ASP.NET reads it) with ';' between parameters, the header X-Credits by its CGI name
// (HTTP_X_CREDITS: any case, '_' for '-'). The largest reading is the one
// the test holds costgate to.
func unitsAtkLenient(w http.ResponseWriter, r *http.Request) {
	var n int64
	take := func(s string) {
		if v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil {
			n = max(n, v)
		}
	}
	ct := r.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/x-www-form-urlencoded") || strings.HasPrefix(ct, "multipart/form-data") {
		r.ParseMultipartForm(1 << 20)
		take(r.FormValue("credits"))
		take(r.FormValue("num"))
	} else {
		b, _ := io.ReadAll(r.Body)
		var body struct{ Credits json.Number }
		if json.Unmarshal(b, &body) == nil {
			take(body.Credits.String())
		}
	}
	for _, pair := range strings.FieldsFunc(r.URL.RawQuery, func(c rune) bool { return c == '&' || c == ';' }) {
		k, v, _ := strings.Cut(pair, "=") // ';' separates too, as Python's parse_qs did
		if strings.EqualFold(k, "num") {
			take(v)
		}
	}
	for k, vs := range r.Header {
		if strings.ToUpper(strings.ReplaceAll(k, "-", "_")) == "X_CREDITS" && len(vs) > 0 {
			take(vs[len(vs)-1])
		}
	}
	unitsAtkAnswer(w, n)
}

// unitsAtkStack is a stack in front of the credits upstream, which reads
// requests with h; it returns the stack, the spy on the upstream, and
// costgate's host:port.
func unitsAtkStack(t *testing.T, h http.HandlerFunc) (*stack, *routeAtkSpy, string) {
	t.Helper()
	up := &routeAtkSpy{next: h}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	s := newStack(t, "", unitsAtkYAML(srv.URL))
	return s, up, strings.TrimPrefix(s.url, "http://")
}

// unitsAtkAnswer is the credits upstream's answer: the n credits it read,
// in its body and in X-Credits-Read.
func unitsAtkAnswer(w http.ResponseWriter, n int64) {
	w.Header().Set("X-Credits-Read", strconv.FormatInt(n, 10))
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"credits":%d}`, n)
}

func unitsAtkYAML(base string) string {
	return `
  - name: credits
    kind: generic
    base_url: ` + base + `
    api_key: credits-secret
    auth_header: X-Credits-Key
    cost:
      per_unit: "0.01"
      units: {json: credits, query: num, header: X-Credits, default: 1}
  - name: bynum
    kind: generic
    base_url: ` + base + `
    api_key: credits-secret
    auth_header: X-Credits-Key
    cost:
      per_unit: "0.01"
      units: {query: num, default: 1}
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 1000
    period: 1m
`
}

// TestUnitsAttackSpellings sends the credits in spellings that a lenient
// upstream reads as the field costgate prices: to credits, which reads
// them from a JSON field, the query and a header, and to bynum, which
// reads them from the query alone (and so did not read the body).
func TestUnitsAttackSpellings(t *testing.T) {
	s, up, host := unitsAtkStack(t, unitsAtkLenient)
	post := func(ct, body string) string {
		return fmt.Sprintf("POST /u/credits/run HTTP/1.1\nContent-Type: %s\nContent-Length: %d\n\n%s", ct, len(body), body)
	}
	get := func(target, header string) string {
		return "GET /u/credits/run" + target + " HTTP/1.1\n" + header + "Content-Length: 0\n\n"
	}
	multipart := "--XyZ\r\nContent-Disposition: form-data; name=\"credits\"\r\n\r\n1000\r\n--XyZ--\r\n"
	cases := []struct{ name, req string }{
		{"json key twice", post("application/json", `{"credits":1,"credits":1000}`)},
		{"json key in another case", post("application/json", `{"Credits":1000}`)},
		{"json key with a long s", post("application/json", `{"creditſ":1000}`)},
		{"header with underscore", get("", "X_Credits: 1000\n")},
		{"header in two spellings", get("", "X-Credits: 1\nX_Credits: 1000\n")},
		{"query parameter in another case", get("?NUM=1000", "")},
		{"query parameter in two cases", get("?num=1&Num=1000", "")},
		{"query parameter after a semicolon", get("?x=1;num=1000", "")},
		{"json field in a form body", post("application/x-www-form-urlencoded", "credits=1000")},
		{"form body over the query", "POST /u/bynum/run?num=1 HTTP/1.1\nContent-Type: application/x-www-form-urlencoded\nContent-Length: 8\n\nnum=1000"},
		{"multipart body", post("multipart/form-data; boundary=XyZ", multipart)},
		{"multipart body to a rule reading the query", strings.Replace(post("multipart/form-data; boundary=XyZ", strings.Replace(multipart, "credits", "num", 1)), "/credits/", "/bynum/", 1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			line, rest, _ := strings.Cut(c.req, "\n")
			unitsAtkBilled(t, s, up, sendRaw(t, s.url, line+"\nHost: "+host+"\nAuthorization: Bearer cg-test-acme\nConnection: close\n"+rest))
		})
	}
}

// unitsAtkBilled checks got, the answer to a request sent to s in front of
// up: refused (400) before it reached the upstream, or served once and
// billed at least the credits the upstream read (its X-Credits-Read) at
// unitsAtkPerUnit.
func unitsAtkBilled(t *testing.T, s *stack, up *routeAtkSpy, got rawResponse) {
	t.Helper()
	seen := up.take()
	if got.status == http.StatusBadRequest && len(seen) == 0 {
		return // refused
	}
	if got.status != http.StatusOK || len(seen) != 1 {
		t.Fatalf("%d %s; reached the upstream %d times", got.status, got.body, len(seen))
	}
	read, _ := strconv.ParseInt(got.header.Get("X-Credits-Read"), 10, 64)
	id := got.header.Get("X-Request-Id")
	for _, e := range s.entries(t) {
		if e.RequestID != id {
			continue
		}
		if want := unitsAtkPerUnit * costmodel.NanoUSD(read); e.ActualCost < want {
			t.Errorf("billed %s; the upstream read %d credits, %s", e.ActualCost, read, want)
		}
		return
	}
	t.Errorf("%d %s: no ledger entry", got.status, got.body)
}
