package costmodel_test

// Attacks of a tenant who wants to pay less on a generic upstream: the
// request states its units (or its query, page size, offset, page) in a
// spelling costgate does not read but the upstream does (a JSON key given
// twice or in another case, a header with '_' for '-', a query parameter
// in another case, a form body), so that costgate prices one value and the
// upstream serves another. Each request must be refused (a
// *BadRequestError) or priced at least as the upstream reads it.

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// unitsAtkRule reads its units from a JSON field, a query parameter and a
// header; one unit when none is given.
var unitsAtkRule = costmodel.Rule{PerCall: 1000, PerUnit: 10, Units: &costmodel.Source{
	JSON: "credits", Query: "num", Header: "X-Credits", Default: 1,
}}

// unitsAtkSearch prices a search query by its complexity.
var unitsAtkSearch = costmodel.Rule{PerCall: 1000, PerUnit: 10, Complexity: &costmodel.Complexity{
	Query:    costmodel.Source{Query: "q", JSON: "query", Header: "X-Query"},
	PageSize: costmodel.Source{Query: "size", JSON: "size", Default: 10, Max: 100},
	Offset:   costmodel.Source{Query: "from", JSON: "from"},
	Page:     costmodel.Source{Query: "page", JSON: "page"},
}}

// unitsAtkCase is a request and the fewest units an upstream may read
// from it; least -1 means it must be refused.
type unitsAtkCase struct {
	name  string
	req   costmodel.GenericRequest
	least int64
}

func unitsAtkCheck(t *testing.T, r costmodel.Rule, cases []unitsAtkCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			est, err := r.Estimate(c.req)
			var bad *costmodel.BadRequestError
			switch {
			case c.least < 0 && !errors.As(err, &bad):
				t.Fatalf("priced %d units (err %v); want a *BadRequestError", est.Usage.Units, err)
			case c.least < 0:
				return
			case err != nil:
				t.Fatalf("refused: %v; an upstream reads %d units", err, c.least)
			case est.Usage.Units < c.least:
				t.Fatalf("priced %d units; an upstream reads %d", est.Usage.Units, c.least)
			}
		})
	}
}

func unitsAtkJSON(body string) costmodel.GenericRequest {
	return costmodel.GenericRequest{Method: "POST", Path: "/", Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

// unitsAtkQuery is a GET with the query raw.
func unitsAtkQuery(t *testing.T, raw string) costmodel.GenericRequest {
	t.Helper()
	v, err := url.ParseQuery(raw)
	if err != nil {
		t.Fatal(err)
	}
	return costmodel.GenericRequest{Method: "GET", Path: "/", Query: v}
}

// unitsAtkForm is a POST of the urlencoded form body.
func unitsAtkForm(body string) costmodel.GenericRequest {
	return costmodel.GenericRequest{Method: "POST", Path: "/",
		Header: http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, Body: []byte(body)}
}

// TestUnitsAtkJSONKeySpellings: encoding/json (and many servers) match a
// key in any case (Unicode folding: "ſ" is "s") and keep the last of a
// repeated key; other decoders match exactly, and some keep the first. A
// units field given twice, or spelled in another case, at any level of
// its path, is refused; other keys may repeat.
func TestUnitsAtkJSONKeySpellings(t *testing.T) {
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"plain", unitsAtkJSON(`{"credits":7}`), 7},
		{"other keys repeated", unitsAtkJSON(`{"credits":7,"x":1,"x":2,"X":3}`), 7},
		{"given twice, the last larger", unitsAtkJSON(`{"credits":1,"credits":1000}`), -1},
		{"given twice, the first larger", unitsAtkJSON(`{"credits":1000,"credits":1}`), -1},
		{"given twice, once escaped", unitsAtkJSON(`{"credits":1,"cr\u0065dits":1000}`), -1},
		{"another case alone", unitsAtkJSON(`{"Credits":1000}`), -1},
		{"another case beside", unitsAtkJSON(`{"credits":1,"CREDITS":1000}`), -1},
		{"long s", unitsAtkJSON(`{"creditſ":1000}`), -1},
		{"null then a number", unitsAtkJSON(`{"credits":null,"credits":1000}`), -1},
	})
	nested := costmodel.Rule{PerCall: 1000, PerUnit: 10, Units: &costmodel.Source{JSON: "params.num", Default: 1}}
	unitsAtkCheck(t, nested, []unitsAtkCase{
		{"nested plain", unitsAtkJSON(`{"params":{"num":5},"other":{"num":1000}}`), 5},
		{"nested leaf twice", unitsAtkJSON(`{"params":{"num":1,"num":1000}}`), -1},
		{"nested parent twice", unitsAtkJSON(`{"params":{"num":1},"params":{"num":1000}}`), -1},
		{"nested parent in another case", unitsAtkJSON(`{"Params":{"num":1000}}`), -1},
		{"nested leaf in another case", unitsAtkJSON(`{"params":{"NUM":1000}}`), -1},
	})
	indexed := costmodel.Rule{PerCall: 1000, PerUnit: 10, Units: &costmodel.Source{JSON: "queries.0.size", Default: 1}}
	unitsAtkCheck(t, indexed, []unitsAtkCase{
		{"array element plain", unitsAtkJSON(`{"queries":[{"size":5},{"size":9}]}`), 5},
		{"array element key twice", unitsAtkJSON(`{"queries":[{"size":1,"Size":1000}]}`), -1},
		{"array twice", unitsAtkJSON(`{"queries":[{"size":1}],"queries":[{"size":1000}]}`), -1},
	})
	// The complexity's query, page size and offset are read as units are.
	unitsAtkCheck(t, unitsAtkSearch, []unitsAtkCase{
		{"query twice", unitsAtkJSON(`{"query":"golang","query":"/a.*/ /b.*/ /c.*/ /d.*/"}`), -1},
		{"query in another case", unitsAtkJSON(`{"query":"golang","Query":"/a.*/ /b.*/ /c.*/ /d.*/"}`), -1},
		{"size twice", unitsAtkJSON(`{"query":"golang","size":1,"size":100}`), -1},
		{"from in another case", unitsAtkJSON(`{"query":"golang","FROM":100000}`), -1},
	})
}

// TestUnitsAtkHeaderSpellings: a header name matches in any case and with
// '_' for '-' (servers that read CGI-style names take X_Credits for
// X-Credits); a header given in two spellings is given twice.
func TestUnitsAtkHeaderSpellings(t *testing.T) {
	h := func(kv ...string) costmodel.GenericRequest {
		hd := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			hd[kv[i]] = append(hd[kv[i]], kv[i+1]) // as the client spelled it
		}
		return costmodel.GenericRequest{Method: "GET", Path: "/", Header: hd}
	}
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"canonical", h("X-Credits", "9"), 9},
		{"underscore", h("X_credits", "1000"), 1000},
		{"underscore upper case", h("X_CREDITS", "1000"), 1000},
		{"lower case, not canonical", h("x-credits", "1000"), 1000},
		{"two spellings", h("X-Credits", "1", "X_credits", "1000"), -1},
		{"two cases", h("X-Credits", "1", "x-credits", "1000"), -1},
	})
	unitsAtkCheck(t, unitsAtkSearch, []unitsAtkCase{
		// Forty regexes are 400 points (a 10-point regex each).
		{"query header with underscore", h("X_query", strings.Repeat("/a.*/ ", 40)), 400},
		{"query header in two spellings", h("X-Query", "golang", "X_query", strings.Repeat("/a.*/ ", 40)), -1},
	})
}

// TestUnitsAtkQuerySpellings: query parameter names are case-sensitive to
// most servers, but not to all (ASP.NET's, for one), and PHP reads
// "page.size" and "page size" as "page_size". A units parameter in such a
// spelling is read; given in two spellings, it is given twice.
func TestUnitsAtkQuerySpellings(t *testing.T) {
	q := func(raw string) costmodel.GenericRequest { return unitsAtkQuery(t, raw) }
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"plain", q("num=9"), 9},
		{"upper case", q("NUM=1000"), 1000},
		{"two cases", q("num=1&Num=1000"), -1},
	})
	paged := costmodel.Rule{PerCall: 1000, PerUnit: 10, Units: &costmodel.Source{Query: "page_size", Default: 1}}
	unitsAtkCheck(t, paged, []unitsAtkCase{
		{"PHP dot", q("page.size=1000"), 1000},
		{"PHP space", q("page+size=1000"), 1000},
		{"PHP dot beside", q("page_size=1&page.size=1000"), -1},
	})
	unitsAtkCheck(t, unitsAtkSearch, []unitsAtkCase{
		{"query parameter in two cases", q("q=golang&Q=" + url.QueryEscape(strings.Repeat("/a.*/ ", 40))), -1},
	})
}

// TestUnitsAtkOffsetAndPage: a request with an offset and a page is
// priced at the deeper of the two (an upstream may honour either), and
// ResultPage says that page.
func TestUnitsAtkOffsetAndPage(t *testing.T) {
	c := unitsAtkSearch.Complexity
	get := func(raw string) costmodel.GenericRequest {
		v, _ := url.ParseQuery(raw)
		return costmodel.GenericRequest{Method: "GET", Path: "/", Query: v}
	}
	for _, x := range []struct {
		name, both, body, deep string
		page                   int64
	}{
		{"small offset, deep page", "q=go&from=1&page=500", "", "q=go&page=500", 500},
		{"deep offset, small page", "q=go&from=4990&page=2", "", "q=go&from=4990", 500},
		{"json offset, query page", "q=go&page=500", `{"from":1}`, "q=go&page=500", 500},
	} {
		t.Run(x.name, func(t *testing.T) {
			both, deep := get(x.both), get(x.deep)
			both.Body = []byte(x.body)
			want, err := c.Score(deep)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Score(both)
			if err != nil {
				t.Fatal(err)
			}
			if got < want {
				t.Errorf("score %d; the deeper reading alone scores %d", got, want)
			}
			if p, err := c.ResultPage(both); err != nil || p != x.page {
				t.Errorf("ResultPage %d (err %v); want %d", p, err, x.page)
			}
		})
	}
}

// TestUnitsAtkFormBody: upstreams read a form body (urlencoded or
// multipart) as they read JSON, and many merge it with the query (Go's
// FormValue prefers the body, PHP's $_REQUEST, Flask's request.values). A
// form field named as the rule's json field or query parameter is read;
// given twice, or in two spellings, it is refused.
func TestUnitsAtkFormBody(t *testing.T) {
	form := func(query, body string) costmodel.GenericRequest {
		v, _ := url.ParseQuery(query)
		return costmodel.GenericRequest{Method: "POST", Path: "/", Query: v,
			Header: http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, Body: []byte(body)}
	}
	multipart := func(name, value string) costmodel.GenericRequest {
		body := "--XyZ\r\nContent-Disposition: form-data; name=\"lang\"\r\n\r\nen\r\n" +
			"--XyZ\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value + "\r\n--XyZ--\r\n"
		return costmodel.GenericRequest{Method: "POST", Path: "/",
			Header: http.Header{"Content-Type": {`multipart/form-data; boundary=XyZ`}}, Body: []byte(body)}
	}
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"json field as a form field", form("", "lang=en&credits=1000"), 1000},
		{"query parameter as a form field", form("num=1", "num=1000"), 1000},
		{"form field in another case", form("", "Credits=1000"), 1000},
		{"form field escaped", form("", "cr%65dits=1000"), 1000},
		{"form field twice", form("", "credits=1&credits=1000"), -1},
		{"form field in two spellings", form("", "credits=1&CREDITS=1000"), -1},
		{"multipart json field", multipart("credits", "1000"), 1000},
		{"multipart query parameter", multipart("num", "1000"), 1000},
		{"form body not a number", form("", "credits=lots"), -1},
	})
	nested := costmodel.Rule{PerCall: 1000, PerUnit: 10, Units: &costmodel.Source{JSON: "params.num", Default: 1}}
	unitsAtkCheck(t, nested, []unitsAtkCase{
		{"nested as brackets", form("", "params%5Bnum%5D=1000"), 1000},
		{"nested as dots", form("", "params.num=1000"), 1000},
	})
	unitsAtkCheck(t, unitsAtkSearch, []unitsAtkCase{
		{"search query in a form", form("q=golang", "q="+url.QueryEscape(strings.Repeat("/a.*/ ", 40))), 400},
	})
}

// TestUnitsAtkArrayBrackets: Node's qs (Express's query parser, and its
// body parser for forms) reads "num[]=1000" and "num[0]=1000" as num, an
// array ["1000"], which parseInt and Number read as 1000; PHP and Rails
// name such a parameter num too. A units parameter or form field with a
// trailing "[]" or "[N]" is read as the parameter; beside another
// spelling of it, it is given twice.
func TestUnitsAtkArrayBrackets(t *testing.T) {
	q := func(raw string) costmodel.GenericRequest { return unitsAtkQuery(t, raw) }
	form := unitsAtkForm
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"query []", q("num%5B%5D=1000"), 1000},
		{"query [] unescaped", q("num[]=1000"), 1000},
		{"query [0]", q("num[0]=1000"), 1000},
		{"query [] upper case", q("NUM[]=1000"), 1000},
		{"query [] twice", q("num[]=1000&num[]=5"), -1},
		{"query [] beside the plain name", q("num=1&num[]=1000"), -1},
		{"form []", form("credits[]=1000"), 1000},
		{"form [0] escaped", form("credits%5B0%5D=1000"), 1000},
		{"form [] beside the plain name", form("credits=1&credits[]=1000"), -1},
	})
	nested := costmodel.Rule{PerCall: 1000, PerUnit: 10, Units: &costmodel.Source{JSON: "params.num", Default: 1}}
	unitsAtkCheck(t, nested, []unitsAtkCase{
		{"nested as brackets, then []", form("params[num][]=1000"), 1000},
	})
}

// TestUnitsAtkPHPNames: PHP drops the leading spaces of a parameter's
// name and reads it as a C string, up to a NUL: " num=1000" and
// "num%00x=1000" are num to $_GET, $_POST and $_REQUEST. Such a units
// parameter or form field is read as the parameter.
func TestUnitsAtkPHPNames(t *testing.T) {
	q := func(raw string) costmodel.GenericRequest { return unitsAtkQuery(t, raw) }
	form := unitsAtkForm
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"query leading space", q("%20num=1000"), 1000},
		{"query leading pluses", q("++num=1000"), 1000},
		{"query NUL", q("num%00x=1000"), 1000},
		{"query NUL beside the plain name", q("num=1&num%00x=1000"), -1},
		{"form leading space", form("+credits=1000"), 1000},
		{"form NUL", form("credits%00=1000"), 1000},
	})
	nested := costmodel.Rule{PerCall: 1000, PerUnit: 10, Units: &costmodel.Source{JSON: "params.num", Default: 1}}
	unitsAtkCheck(t, nested, []unitsAtkCase{
		{"nested with a leading space", form("+params[num]=1000"), 1000},
		// PHP reads an unclosed "[" as "_": params[num is params_num,
		// which it also reads params.num as.
		{"nested, bracket unclosed", form("params[num=1000"), 1000},
	})
	// An unclosed "[" is "_" to PHP: page[size=1000 is $_GET['page_size'].
	underscored := costmodel.Rule{PerCall: 1000, PerUnit: 10, Units: &costmodel.Source{Query: "page_size", JSON: "page_size", Default: 1}}
	unitsAtkCheck(t, underscored, []unitsAtkCase{
		{"query bracket unclosed", q("page[size=1000"), 1000},
		{"query brackets unclosed", q("page[size=1&page_size[0=1000"), 1}, // page_size_0 to PHP
		{"query bracket unclosed beside the plain name", q("page_size=1&page[size=1000"), -1},
		{"form bracket unclosed", form("page[size=1000"), 1000},
	})
}

// TestUnitsAtkBodyReadings: a body that servers read in more than one
// way. Its request gives two Content-Types (Go and Node read the first,
// gunicorn's WSGI environ the last), or a multipart part names its field
// in a Content-Disposition Go's Part.FormName does not read (a type other
// than form-data, which Werkzeug, python-multipart and Rack read; a name
// given twice; the header given twice). Each is priced as the upstream
// reads it or refused.
func TestUnitsAtkBodyReadings(t *testing.T) {
	twoTypes := unitsAtkJSON(`{"q":"&credits=1000&"}`)
	twoTypes.Header["Content-Type"] = append(twoTypes.Header["Content-Type"], "application/x-www-form-urlencoded")
	part := func(header string) costmodel.GenericRequest {
		return costmodel.GenericRequest{Method: "POST", Path: "/",
			Header: http.Header{"Content-Type": {"multipart/form-data; boundary=XyZ"}},
			Body:   []byte("--XyZ\r\n" + header + "\r\n\r\n1000\r\n--XyZ--\r\n")}
	}
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"two content types", twoTypes, -1},
		{"form-data part", part(`Content-Disposition: form-data; name="credits"`), 1000},
		{"attachment part", part(`Content-Disposition: attachment; name="credits"`), 1000},
		{"inline part", part(`Content-Disposition: inline; name=credits`), 1000},
		{"name twice", part(`Content-Disposition: form-data; name="x"; name="credits"`), -1},
		{"parameter without a value", part(`Content-Disposition: form-data; name=credits; x`), -1},
		{"disposition twice", part("Content-Disposition: form-data; name=x\r\nContent-Disposition: form-data; name=credits"), -1},
	})
	underscore := unitsAtkJSON(`{"q":"&credits=1000&"}`)
	underscore.Header["Content_type"] = []string{"application/x-www-form-urlencoded"}
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{{"content type spelled with an underscore", underscore, -1}})
	same := unitsAtkForm("credits=1000")
	same.Header["Content-Type"] = append(same.Header["Content-Type"], "application/x-www-form-urlencoded")
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{{"one content type twice", same, 1000}})
}

// TestUnitsAtkPartTransferEncoding: a multipart part that gives a
// Content-Transfer-Encoding other than the identity is read one way by
// some servers and another by the others (python-multipart decodes base64
// and quoted-printable, Go's multipart reader quoted-printable alone,
// Werkzeug neither), so it is refused: a complex search query sent in
// base64 was scored as the one plain term Go read, where python-multipart
// serves the query.
func TestUnitsAtkPartTransferEncoding(t *testing.T) {
	part := func(name, cte, value string) costmodel.GenericRequest {
		h := `Content-Disposition: form-data; name="` + name + `"`
		if cte != "" {
			h += "\r\nContent-Transfer-Encoding: " + cte
		}
		return costmodel.GenericRequest{Method: "POST", Path: "/",
			Header: http.Header{"Content-Type": {"multipart/form-data; boundary=XyZ"}},
			Body:   []byte("--XyZ\r\n" + h + "\r\n\r\n" + value + "\r\n--XyZ--\r\n")}
	}
	query := `a* AND /b.c/ OR d~ AND e* AND /f.g/ OR h~ AND i* AND /j.k/`
	b64 := base64.StdEncoding.EncodeToString([]byte(query))
	plain, err := unitsAtkSearch.Estimate(part("query", "", query))
	if err != nil {
		t.Fatal(err)
	}
	unitsAtkCheck(t, unitsAtkSearch, []unitsAtkCase{
		{"identity", part("query", "8bit", query), plain.Usage.Units},
		{"binary", part("query", " Binary ", query), plain.Usage.Units},
		{"base64", part("query", "base64", b64), -1},
		{"base64 in capitals", part("query", "BASE64", b64), -1},
	})
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"quoted-printable", part("credits", "quoted-printable", "=31000"), -1},
		{"unknown encoding", part("credits", "x-gzip", "1000"), -1},
		{"7bit", part("credits", "7bit", "1000"), 1000},
	})
}
