package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// bracketsAtkQS reads a request's credits as an Express application does
// with Node's qs (its query parser, and its body parser's for forms):
// "num[]=1000", "num[0]=1000" and "num[][]=1000" are num, an array whose
// text is "1000", which parseInt reads as 1000. It says how many in
// X-Credits-Read.
func bracketsAtkQS(w http.ResponseWriter, r *http.Request) {
	var n int64
	read := func(raw string) {
		v, _ := url.ParseQuery(raw)
		for k, vs := range v {
			base, _, _ := strings.Cut(k, "[")
			if (base == "num" || base == "credits") && len(vs) > 0 {
				digits := strings.TrimLeft(vs[0], " ")
				end := 0
				for end < len(digits) && '0' <= digits[end] && digits[end] <= '9' {
					end++
				}
				if x, err := strconv.ParseInt(digits[:end], 10, 64); err == nil {
					n = max(n, x)
				}
			}
		}
	}
	read(r.URL.RawQuery)
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		b, _ := io.ReadAll(r.Body)
		read(string(b))
	}
	unitsAtkAnswer(w, n)
}

// TestUnitsAttackArrayBrackets: the units in a parameter or form field
// written as an array ("num[]=1000"), which an Express upstream reads as
// the parameter, are priced as it reads them, or refused. Before, costgate
// read no such parameter and priced the rule's default, 1 credit of the
// 1,000 served.
func TestUnitsAttackArrayBrackets(t *testing.T) {
	s, up, host := unitsAtkStack(t, bracketsAtkQS)
	form := func(path, body string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\nContent-Type: application/x-www-form-urlencoded\nContent-Length: %d\n\n%s", path, len(body), body)
	}
	cases := []struct{ name, req string }{
		{"query []", "GET /u/credits/run?num[]=1000 HTTP/1.1\nContent-Length: 0\n\n"},
		{"query [] escaped", "GET /u/credits/run?num%5B%5D=1000 HTTP/1.1\nContent-Length: 0\n\n"},
		{"query [0] to a rule reading the query", "GET /u/bynum/run?num[0]=1000 HTTP/1.1\nContent-Length: 0\n\n"},
		{"query [][]", "GET /u/credits/run?num[][]=1000 HTTP/1.1\nContent-Length: 0\n\n"},
		{"query [] twice", "GET /u/credits/run?num[]=1000&num[]=1 HTTP/1.1\nContent-Length: 0\n\n"},
		{"form []", form("/u/credits/run", "credits[]=1000")},
		{"form [] to a rule reading the query", form("/u/bynum/run", "num[]=1000")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			line, rest, _ := strings.Cut(c.req, "\n")
			unitsAtkBilled(t, s, up, sendRaw(t, s.url, line+"\nHost: "+host+"\nAuthorization: Bearer cg-test-acme\nConnection: close\n"+rest))
		})
	}
}
