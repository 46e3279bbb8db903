package client_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
)

// formCreditsRule is a metered API that reads the credits a call spends
// from ?credits, as a framework that merges the query and the form
// (PHP's $_REQUEST, Flask's request.values, Rails' params) reads them
// from a form body's field of that name too: costmodel reads the form
// field named as the query parameter, and so does the proxy on a generic
// upstream's route. Its answer reports nothing.
var formCreditsRule = costmodel.Rule{
	Unit:    "credits",
	PerCall: costmodel.Dollar / 1000,  // $0.001
	PerUnit: costmodel.Dollar / 10000, // $0.0001
	Units:   &costmodel.Source{Query: "credits", Default: 1},
}

// TestClientAtkFormFieldUnderQueryName: a rule that reads its units from a
// query parameter alone reads them, as the proxy does, from a form body's
// field of that name too (costmodel's Source: "a form body's field named
// as the JSON field or the query parameter"). The Transport read a
// request's body only when its rule named a JSON field: a POST whose form
// body asks for 1000 credits, which the API serves and bills, was
// reserved and settled at the rule's default, 1 credit, $0.0011 for
// $0.101. What must hold: the Transport prices the form's field as the
// proxy would, urlencoded or multipart.
func TestClientAtkFormFieldUnderQueryName(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, calls := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		r.ParseMultipartForm(1 << 20)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"served":%q}`, r.FormValue("credits"))
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: formCreditsRule, Settled: ends.hook}}

	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	mw.WriteField("credits", "1000")
	mw.Close()
	bodies := []struct{ name, contentType, body string }{
		{"urlencoded", "application/x-www-form-urlencoded", url.Values{"credits": {"1000"}}.Encode()},
		{"multipart", mw.FormDataContentType(), mp.String()},
	}
	for i, b := range bodies {
		resp, err := hc.Post(api+"/search", b.contentType, strings.NewReader(b.body))
		if err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != `{"served":"1000"}` {
			t.Fatalf("%s: the API served %s, want 1000 credits", b.name, got)
		}
		n, sts, errs := ends.snapshot()
		if n != i+1 || errs[i] != nil || sts[i] == nil {
			t.Fatalf("%s: Settled %d times, %v", b.name, n, errs)
		}
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if e.Actual.Units != 1000 || e.ActualCost != creditsCost(1000) || e.Estimated.Units != 1000 {
			t.Errorf("%s body asking 1000 credits: reserved %d units, ledger %d units %v, want 1000 at %v",
				b.name, e.Estimated.Units, e.Actual.Units, e.ActualCost, creditsCost(1000))
		}
	}
	if calls.Load() != int64(len(bodies)) {
		t.Errorf("the API was called %d times, want %d", calls.Load(), len(bodies))
	}
}

// TestClientAtkCodedRequestBody: a request body declared in a content
// coding (Content-Encoding: gzip, in any case, under a name a server reads
// as that header, stacked after identity) is priced by the Transport as
// its coded bytes: a gzipped form body holds no field costmodel can read,
// so the rule's default was reserved and settled (1 credit) while an API
// that decodes request bodies served what the decoded body asked for
// (1000). The proxy answers such a request 400 unsupported_content_encoding
// before its upstream. What must hold: when its rule reads the body, the
// Transport refuses a coded body before it reserves, and the API is not
// called; a body in identity is priced as usual.
func TestClientAtkCodedRequestBody(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, calls := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		// It decodes a gzipped body, whatever header declared it.
		raw, _ := io.ReadAll(r.Body)
		body := io.Reader(bytes.NewReader(raw))
		if bytes.HasPrefix(raw, []byte{0x1f, 0x8b}) {
			zr, err := gzip.NewReader(bytes.NewReader(raw))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, _ = io.ReadAll(body)
		form, _ := url.ParseQuery(string(raw))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"served":%q}`, form.Get("credits"))
	})
	var ends attackEnds
	rule := formCreditsRule
	rule.Units = &costmodel.Source{Query: "credits", JSON: "credits", Default: 1}
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: rule, Settled: ends.hook}}

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("credits=1000"))
	zw.Close()
	for _, c := range []struct {
		name   string
		header map[string][]string
	}{
		{"gzip", map[string][]string{"Content-Encoding": {"gzip"}}},
		{"GZIP", map[string][]string{"Content-Encoding": {"GZIP"}}},
		{"identity, gzip", map[string][]string{"Content-Encoding": {"identity, gzip"}}},
		{"two fields", map[string][]string{"Content-Encoding": {"identity", "gzip"}}},
		{"content_encoding", map[string][]string{"content_encoding": {"gzip"}}},
	} {
		req, _ := http.NewRequest("POST", api+"/search", bytes.NewReader(gz.Bytes()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range c.header {
			req.Header[k] = v
		}
		resp, err := hc.Do(req)
		if err == nil {
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Errorf("%s: a gzipped body asking 1000 credits was sent (the API served %s)", c.name, got)
			continue
		}
		if !strings.Contains(err.Error(), "content coding") {
			t.Errorf("%s: error %v, want one naming the content coding", c.name, err)
		}
	}
	if n, _, _ := ends.snapshot(); n != 0 || calls.Load() != 0 || len(s.entries(t, "acme")) != 0 {
		t.Errorf("coded bodies: %d reservations ended, %d API calls, %d ledger entries; want none", n, calls.Load(), len(s.entries(t, "acme")))
	}

	// identity is no coding: the body is priced as it is.
	req, _ := http.NewRequest("POST", api+"/search", strings.NewReader("credits=7"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Content-Encoding", "identity")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, sts, errs := ends.snapshot()
	if len(sts) != 1 || errs[0] != nil {
		t.Fatalf("identity: Settled %v %v", sts, errs)
	}
	if e := s.entry(t, "acme", sts[0].RequestID, final); e.Actual.Units != 7 {
		t.Errorf("identity body asking 7 credits: ledger %d units", e.Actual.Units)
	}
}

// TestClientAtkSemicolonQuery: an API that splits its query at ';' as at
// '&' (Rack before 3, Python's parse_qs before 3.9.2, Perl's CGI) reads
// ?q=x;credits=1000 as credits=1000, which Go's url.Values drops whole
// (a pair holding ';' is not parsed). The Transport priced that call at
// the rule's default, 1 credit, for 1000 served. (Through the proxy,
// httputil.ReverseProxy drops that pair before the upstream: it serves
// what was priced.) What must hold: the Transport prices a query holding
// ';' by its reading at '&' and ';' both, which holds every pair Go
// reads and the ones it drops.
func TestClientAtkSemicolonQuery(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		var credits string
		for _, pair := range strings.FieldsFunc(r.URL.RawQuery, func(c rune) bool { return c == '&' || c == ';' }) {
			if k, v, _ := strings.Cut(pair, "="); k == "credits" {
				credits = v
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"served":%q}`, credits)
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: formCreditsRule, Settled: ends.hook}}
	for i, c := range []struct {
		query string
		want  int64
	}{
		{"q=x;credits=1000", 1000},
		{"credits=1000;q=x", 1000},
		{"q=a;b&credits=7", 7},
		{"q=plain&credits=3", 3},
	} {
		resp, err := hc.Get(api + "/search?" + c.query)
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		resp.Body.Close()
		n, sts, errs := ends.snapshot()
		if n != i+1 || errs[i] != nil || sts[i] == nil {
			t.Fatalf("%s: Settled %d times, %v", c.query, n, errs)
		}
		if e := s.entry(t, "acme", sts[i].RequestID, final); e.Actual.Units != c.want || e.Estimated.Units != c.want {
			t.Errorf("?%s: reserved %d units, settled %d; want %d", c.query, e.Estimated.Units, e.Actual.Units, c.want)
		}
	}
}

// TestClientAtkContentTypeSpelling: a caller that writes the header map
// itself (req.Header["content-type"]) sends its form body under a field
// name Go does not canonicalize; the API reads the field in any case, a
// form, and serves credits=1000. costmodel looks the Content-Type up by
// its canonical name: the Transport took the body for no form and priced
// the rule's default, 1 credit. What must hold: the body is priced by
// its Content-Type in whatever case the map holds it, and a request
// that states two different ones is refused before reserving.
func TestClientAtkContentTypeSpelling(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, calls := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"served":%q}`, r.PostForm.Get("credits"))
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: formCreditsRule, Settled: ends.hook}}
	req, _ := http.NewRequest("POST", api+"/search", strings.NewReader("credits=1000"))
	req.Header["content-type"] = []string{"application/x-www-form-urlencoded"}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	n, sts, errs := ends.snapshot()
	if n != 1 || errs[0] != nil || sts[0] == nil {
		t.Fatalf("Settled %d times, %v", n, errs)
	}
	if e := s.entry(t, "acme", sts[0].RequestID, final); e.Actual.Units != 1000 || e.Estimated.Units != 1000 {
		t.Errorf("a form body under content-type asking 1000 credits (the API served %s): reserved %d, settled %d; want 1000",
			got, e.Estimated.Units, e.Actual.Units)
	}

	req, _ = http.NewRequest("POST", api+"/search", strings.NewReader("credits=1000"))
	req.Header["content-type"] = []string{"application/x-www-form-urlencoded"}
	req.Header.Set("Content-Type", "application/json")
	if _, err := hc.Do(req); err == nil || !strings.Contains(err.Error(), "Content-Type") {
		t.Errorf("two Content-Types: error %v, want a refusal naming them", err)
	}
	if calls.Load() != 1 || len(s.entries(t, "acme")) != 1 {
		t.Errorf("two Content-Types: %d API calls, %d ledger entries; want the first call's alone", calls.Load(), len(s.entries(t, "acme")))
	}
}
