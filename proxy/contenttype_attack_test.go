package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// unitsAtkLastContentType reads a request's credits as a Python API
// behind gunicorn does: the WSGI environ's CONTENT_TYPE is the last
// Content-Type field of the request (gunicorn sets it once per field, so
// the last one stays), and the body is read as a form when that says so,
// else as JSON. It says how many credits it read in X-Credits-Read.
func unitsAtkLastContentType(w http.ResponseWriter, r *http.Request) {
	var n int64
	take := func(s string) {
		if v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil {
			n = max(n, v)
		}
	}
	ct := ""
	if vs := r.Header.Values("Content-Type"); len(vs) > 0 {
		ct = vs[len(vs)-1]
	}
	b, _ := io.ReadAll(r.Body)
	if strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		form, _ := url.ParseQuery(string(b))
		take(form.Get("credits"))
	} else {
		var body struct{ Credits json.Number }
		if json.Unmarshal(b, &body) == nil {
			take(body.Credits.String())
		}
	}
	unitsAtkAnswer(w, n)
}

// TestUnitsAtkContentTypeTwice: a request to a generic upstream states
// its Content-Type twice, application/json and then a form. costgate read
// the body by the first, as JSON: {"q":"&credits=1000&"} holds no credits,
// and the rule's default, 1 credit, was charged. An upstream that reads
// the last Content-Type (a Python API behind gunicorn) reads the same
// bytes as a form, credits=1000, and serves 1,000 credits. What must
// hold: such a request is refused before it reaches the upstream, or
// billed at least the credits the upstream read.
func TestUnitsAtkContentTypeTwice(t *testing.T) {
	s, up, host := unitsAtkStack(t, unitsAtkLastContentType)
	const body = `{"q":"&credits=1000&"}`
	for _, c := range []struct{ name, header string }{
		{"json then form", "Content-Type: application/json\nContent-Type: application/x-www-form-urlencoded\n"},
		{"text then form", "Content-Type: text/plain\nContent-Type: application/x-www-form-urlencoded; charset=utf-8\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := fmt.Sprintf("POST /u/credits/run HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nConnection: close\n%sContent-Length: %d\n\n%s",
				host, c.header, len(body), body)
			unitsAtkBilled(t, s, up, sendRaw(t, s.url, req))
		})
	}
}

// unitsAtkWerkzeug reads a multipart body's credits as Werkzeug (Flask)
// and python-multipart (Starlette, FastAPI) do: a part is a field named
// by its Content-Disposition's name parameter, whatever the disposition's
// type, and a file when it has a filename. It says how many credits it
// read in X-Credits-Read.
func unitsAtkWerkzeug(w http.ResponseWriter, r *http.Request) {
	var n int64
	_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	mr := multipart.NewReader(r.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err != nil {
			break
		}
		_, disp, _ := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
		b, _ := io.ReadAll(p)
		if _, file := disp["filename"]; file || disp["name"] != "credits" {
			continue
		}
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			n = max(n, v)
		}
	}
	unitsAtkAnswer(w, n)
}

// TestUnitsAtkMultipartDisposition: a multipart body's part names its
// field in a Content-Disposition of another type than form-data
// ("attachment; name=credits"). Go's Part.FormName is "" for it, and
// costgate skipped the part: the rule's default, 1 credit, was charged.
// Werkzeug and python-multipart take the name whatever the type, and
// serve the 1,000 credits the part asks. What must hold: the request is
// refused before it reaches the upstream, or billed at least the credits
// the upstream read.
func TestUnitsAtkMultipartDisposition(t *testing.T) {
	s, up, host := unitsAtkStack(t, unitsAtkWerkzeug)
	for _, disp := range []string{`attachment; name="credits"`, `inline; name=credits`, `x; name="credits"`} {
		t.Run(disp, func(t *testing.T) {
			body := "--XyZ\r\nContent-Disposition: " + disp + "\r\n\r\n1000\r\n--XyZ--\r\n"
			req := fmt.Sprintf("POST /u/credits/run HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nConnection: close\nContent-Type: multipart/form-data; boundary=XyZ\nContent-Length: %d\n\n%s",
				host, len(body), body)
			unitsAtkBilled(t, s, up, sendRaw(t, s.url, req))
		})
	}
}
